"""External data as a user meets it: ``--external-data`` on every writing command (convert, optimize,
quantize, compile, build), a disk that fills while the data file is written (the file-size limit,
RLIMIT_FSIZE, in the CLI's process: writes past it fail with EFBIG as on a full disk), a data file that
is missing, and a compiled model with external data given to the session as bytes."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import zonnx
from tests.helpers import assert_one_line_error, run_cli
from tests.ir.test_large_models import D, chain
from zonnx.errors import ModelLoadError


def _external(path: Path) -> bool:
    """The model at ``path`` keeps tensors in ``NAME.data`` beside it, and that file holds most bytes."""
    from zonnx.ir.io import external_data_locations

    skeleton = onnx.load(str(path), load_external_data=False)
    data = path.with_name(path.name + ".data")
    return external_data_locations(skeleton) == {data.name} and data.stat().st_size > path.stat().st_size


def _cli_with_file_limit(limit: int, *args: str) -> subprocess.CompletedProcess[str]:
    """``zonnx ARGS`` in a process whose files may not grow past ``limit`` bytes (a disk that fills)."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    exe = Path(sys.executable).with_name("zonnx")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "zonnx.tools.main"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=600, preexec_fn=cap)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_small_models_take_external_data_when_asked(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(onnx.load(str(chain(tmp_path / "src.onnx"))), str(src))  # inline: 1.5 MB, under every limit
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((8, D)).astype(np.float32))
    run_cli("optimize", str(src), str(tmp_path / "o.onnx"), "--external-data", check=True)
    run_cli("quantize", str(tmp_path / "o.onnx"), str(tmp_path / "q.onnx"), "--calib", str(tmp_path / "calib.npz"),
            "--target", "bm1684x", "--external-data", check=True)  # fmt: skip
    run_cli("compile", str(tmp_path / "q.onnx"), "-t", "bm1684x", "-o", str(tmp_path / "c.onnx"), "--external-data",
            check=True)  # fmt: skip
    for name in ("o.onnx", "q.onnx", "c.onnx"):
        assert _external(tmp_path / name), name
    x = np.random.default_rng(3).standard_normal((1, D)).astype(np.float32)
    want = ort.InferenceSession(str(src)).run(None, {"x": x})[0]
    np.testing.assert_allclose(
        ort.InferenceSession(str(tmp_path / "o.onnx")).run(None, {"x": x})[0], want, atol=1e-5
    )
    got = zonnx.InferenceSession(str(tmp_path / "c.onnx")).run(None, {"x": x})[0]
    cos = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert cos > 0.99, cos


MODEL_PY = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b = nn.Linear(64, 256), nn.Linear(256, 8)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))
    """
)


def test_convert_and_build_write_external_data(tmp_path: Path) -> None:
    (tmp_path / "mlp.py").write_text(MODEL_PY)
    out = tmp_path / "mlp.onnx"
    run_cli("convert", "mlp.py:Mlp", "-o", str(out), "--input-shape", "x:1,64", "--external-data",
            cwd=str(tmp_path), check=True)  # fmt: skip
    assert _external(out)
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32))
    run_cli("build", str(out), "-o", str(tmp_path / "b"), "--calib", str(tmp_path / "calib.npz"),
            "--target", "bm1684x", "--external-data", check=True)  # fmt: skip
    written = sorted(p.name for p in (tmp_path / "b").glob("*.onnx"))
    assert len(written) == 3, written  # optimized, quantized, compiled
    for name in written:
        assert _external(tmp_path / "b" / name), name


@pytest.mark.parametrize("command", ["optimize", "compile"])
def test_disk_filling_while_data_is_written(tmp_path: Path, command: str) -> None:
    """The data file passes the limit half-way: one line saying there is no room, exit 2, the inputs
    untouched and nothing of the output left (no model, no data file, no temporaries)."""
    src = chain(tmp_path / "m.onnx")
    if command == "compile":
        np.savez(
            tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((4, D)).astype(np.float32)
        )
        run_cli("quantize", str(src), str(tmp_path / "q.onnx"), "--calib", str(tmp_path / "calib.npz"),
                "--target", "bm1684x", check=True)  # fmt: skip
        src = tmp_path / "q.onnx"
    before = _snapshot(tmp_path)
    limit = sum(p.stat().st_size for p in tmp_path.glob(src.name + "*")) // 4  # the weights pass it
    args = [str(src), str(tmp_path / "out.onnx")] if command == "optimize" else [str(src), "-t", "bm1684x",
                                                                                "-o", str(tmp_path / "out.onnx")]  # fmt: skip
    proc = _cli_with_file_limit(limit, command, *args, "--external-data")
    assert_one_line_error(proc, "out.onnx", "no room", "nothing was written")
    assert _snapshot(tmp_path) == before


def test_missing_data_file_names_file_and_tensor(tmp_path: Path) -> None:
    src = chain(tmp_path / "m.onnx")
    (tmp_path / "m.onnx.data").unlink()
    proc = run_cli("optimize", str(src), str(tmp_path / "o.onnx"))
    assert_one_line_error(proc, "m.onnx.data", "not found", "'w0'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_session_on_bytes_of_a_compiled_model_with_external_data(tmp_path: Path) -> None:
    """Bytes have no folder: the session says to open the model by its path; by path it runs."""
    from zonnx.backend.compile_api import compile_model
    from zonnx.build_npu import target_quantize_kwargs
    from zonnx.quantization.calibration.readers import ListReader

    src = chain(tmp_path / "m.onnx", layers=2)
    feeds = [{"x": np.random.default_rng(i).standard_normal((1, D)).astype(np.float32)} for i in range(4)]
    zonnx.quantize_static(src, tmp_path / "q.onnx", ListReader(feeds), **target_quantize_kwargs("bm1684x"))
    c = compile_model(tmp_path / "q.onnx", "bm1684x").save(tmp_path / "c.onnx", external_data=True)
    with pytest.raises(ModelLoadError, match=r"given as bytes.*c\.onnx\.data.*by its path"):
        zonnx.InferenceSession(c.read_bytes())
    with pytest.raises(ModelLoadError, match="by its path"):
        zonnx.InferenceSession(onnx.load(str(c), load_external_data=False))
    out = zonnx.InferenceSession(str(c)).run(None, feeds[0])[0]
    assert out.shape == (1, D) and np.isfinite(out).all()


def test_weights_stay_external_without_the_flag(tmp_path: Path) -> None:
    """A source with external data (1.5 MB, under every limit) quantized and compiled without
    --external-data: the weights stay in NAME.onnx.data at every step (the quantized model was inline)."""
    src = chain(tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((8, D)).astype(np.float32))
    run_cli("quantize", str(src), str(tmp_path / "q.onnx"), "--calib", str(tmp_path / "calib.npz"),
            "--target", "bm1684x", check=True)  # fmt: skip
    run_cli("compile", str(tmp_path / "q.onnx"), "-t", "bm1684x", "-o", str(tmp_path / "c.onnx"), check=True)
    assert _external(tmp_path / "q.onnx") and _external(tmp_path / "c.onnx")
    x = np.random.default_rng(3).standard_normal((1, D)).astype(np.float32)
    ref = ort.InferenceSession(str(tmp_path / "q.onnx")).run(None, {"x": x})[0]
    got = zonnx.InferenceSession(str(tmp_path / "c.onnx")).run(None, {"x": x})[0]
    assert float((got * ref).sum() / np.linalg.norm(got) / np.linalg.norm(ref)) > 0.999
