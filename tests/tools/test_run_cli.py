"""``zonnx run``: outputs npz, per-layer dump, golden comparison table and one-line errors with exit code 2."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.backend.partition_models import quantize
from tests.backend.test_golden import corrupt_weights
from tests.helpers import assert_one_line_error, run_cli
from zonnx import zoo
from zonnx.backend.compile_api import compile_model
from zonnx.backend.session import InferenceSession
from zonnx.zoo.digits import digits_data


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """A FixNeuron digits model, it compiled for dpu-b4096, a corrupted copy, inputs; the CLI's own cache dir."""
    d = tmp_path_factory.mktemp("run_cli")
    x, _ = digits_data("calib")
    q = quantize(zoo.get("digits_cnn"), d / "fix.onnx", [{"input": x[i : i + 1]} for i in range(32)], "fix")
    compiled = compile_model(q, "dpu-b4096").model
    onnx.save(compiled, d / "compiled.onnx")
    corrupt = corrupt_weights(compiled, "/res/res.0/Conv")
    corrupt.metadata_props.add(key="zonnx.source", value=str(q))  # proposed: compile_model records it
    onnx.save(corrupt, d / "corrupt.onnx")
    test, _ = digits_data("test")
    np.savez(d / "in.npz", input=test[:16])
    np.savez(d / "wrong.npz", image=test[:16])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZONNX_CACHE_DIR", str(d / "cache"))  # the subprocesses inherit it
        yield {"fix": q, "compiled": d / "compiled.onnx", "corrupt": d / "corrupt.onnx", "dir": d}


def test_run_writes_outputs_and_dump(files, tmp_path: Path) -> None:
    out, dump = tmp_path / "out.npz", tmp_path / "dump"
    inputs = files["dir"] / "in.npz"
    proc = run_cli(
        "run", str(files["fix"]), "--inputs", str(inputs), "-o", str(out), "--dump", str(dump), check=True
    )
    assert "logits" in proc.stdout and "[16, 10]" in proc.stdout and "float32" in proc.stdout
    assert "dumped 12 NPU tensors" in proc.stdout
    with np.load(out) as got:
        logits = got["logits"]
    sess = InferenceSession(str(files["compiled"]), providers=["ZonnxNPUExecutionProvider"])
    with np.load(inputs) as feeds:
        assert np.array_equal(logits, sess.run(None, {"input": feeds["input"]})[0])
    index = json.loads((dump / "index.json").read_text())["tensors"]
    assert len(index) == 12 and index[0]["op"] == "/stem/stem.0/Conv" and index[0]["kind"] == "conv"
    for entry in index:
        arr = np.load(dump / entry["file"])
        assert arr.dtype == np.int8 and list(arr.shape) == entry["shape"] and arr.shape[0] == 16
    assert np.load(dump / index[-1]["file"]).astype(np.float64) * index[-1]["scale"][0] == pytest.approx(
        logits
    )


def test_run_without_inputs_says_so(files) -> None:
    proc = run_cli("run", str(files["compiled"]), check=True)
    assert "note: no --inputs: generated inputs (seed 0): input [1, 1, 8, 8]" in proc.stderr
    assert "[1, 10]" in proc.stdout


def test_run_compare_golden_good_model(files) -> None:
    args = ["--inputs", str(files["dir"] / "in.npz"), "--compare", "golden"]
    proc = run_cli("run", str(files["compiled"]), *args, "--qdq-model", str(files["fix"]),
                   "--float-model", str(zoo.get("digits_cnn")), check=True)  # fmt: skip
    assert "NPU layers vs golden" in proc.stdout and "/res/res.2/Relu_output_0_fix" in proc.stdout
    assert "all 12 NPU layers within tolerance (cos >= 0.99 vs float, <= 1 LSB vs fake-quant)" in proc.stdout
    proc = run_cli("run", str(files["fix"]), *args, "--json", check=True)  # MODEL is its own fake-quant model
    golden = json.loads(proc.stdout)["golden"]
    assert golden["first_divergence"] is None and golden["qdq_model"] == str(files["fix"])
    assert all(row["max_lsb"] == 0 for row in golden["layers"])


def test_run_compare_names_first_divergence(files, tmp_path: Path) -> None:
    report = tmp_path / "golden.json"
    proc = run_cli("run", str(files["corrupt"]), "--inputs", str(files["dir"] / "in.npz"), "--compare", "golden",
                   "--report", str(report))  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert f"note: quantized model {files['fix']} (recorded in the compiled model)" in proc.stderr
    assert (
        "first divergence: layer 1 '/res/res.2/Relu_output_0_fix' (op '/res/res.0/Conv', conv)" in proc.stdout
    )
    assert "DIVERGES" in proc.stdout and "Traceback" not in proc.stderr
    first = json.loads(report.read_text())["golden"]["first_divergence"]
    assert first["op"] == "/res/res.0/Conv" and first["index"] == 1


def test_run_bad_input(files, tmp_path: Path) -> None:
    model = str(files["compiled"])
    proc = run_cli("run", model, "--inputs", str(tmp_path / "missing.npz"))
    assert_one_line_error(proc, "--inputs", "missing.npz: no such file")
    proc = run_cli("run", model, "--inputs", str(files["dir"] / "wrong.npz"))
    assert_one_line_error(proc, "array 'image' is not an input", "input tensor(float) ['N', 1, 8, 8]")
    bare = onnx.load(model)  # a compiled model that does not record its sources (e.g. compiled from bytes)
    kept = [p for p in bare.metadata_props if p.key not in ("zonnx.source", "zonnx.float_source")]
    del bare.metadata_props[:]
    bare.metadata_props.extend(kept)
    onnx.save(bare, tmp_path / "bare.onnx")
    proc = run_cli("run", str(tmp_path / "bare.onnx"), "--compare", "golden")
    assert_one_line_error(proc, "--compare golden needs the quantized model", "--qdq-model")
    proc = run_cli("run", model, "--compare", "gold")
    assert_one_line_error(proc, "--compare 'gold'", "Did you mean 'golden'?")
