"""``zonnx quantize``: a target fills the scheme it needs (the compiled result runs wholly on the NPU), errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.helpers import assert_one_line_error, run_cli
from zonnx import zoo


@pytest.fixture(scope="module")
def calib(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("qcli")
    feeds = zoo.sample_inputs("digits_cnn", 8, seed=3)
    np.savez(d / "calib.npz", input=np.concatenate([f["input"] for f in feeds]))
    return d / "calib.npz"


def _activation_zero_points(path: Path) -> set[int]:
    m = onnx.load(path)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    zps = set()
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in inits:
            zps |= {int(v) for v in np.ravel(inits[n.input[2]])}
    return zps


@pytest.mark.parametrize(("target", "op_type"), [("bm1684x", "QuantizeLinear"), ("dpu-b4096", "FixNeuron")])
def test_target_fills_its_scheme(calib: Path, tmp_path: Path, target: str, op_type: str) -> None:
    out = tmp_path / f"d_{target}.onnx"
    run_cli(
        "quantize",
        str(zoo.get("digits_cnn")),
        str(out),
        "--calib",
        str(calib),
        "--target",
        target,
        check=True,
    )
    assert op_type in {n.op_type for n in onnx.load(out).graph.node}
    if target == "bm1684x":  # symmetric int8 activations, as the target requires
        assert _activation_zero_points(out) == {0}
    proc = run_cli("compile", str(out), "--target", target, "-o", str(tmp_path / "c.onnx"), check=True)
    assert "100.0% of 366,592 MACs on the NPU" in proc.stdout


def test_given_options_win_over_the_target(calib: Path, tmp_path: Path) -> None:
    out = tmp_path / "asym.onnx"
    run_cli(
        "quantize", str(zoo.get("digits_cnn")), str(out), "--calib", str(calib), "--target", "bm1684x",
        "--activation-type", "uint8", "--extra", "ActivationSymmetric=false", check=True,
    )  # fmt: skip
    assert _activation_zero_points(out) != {0}
    proc = run_cli("compile", str(out), "--target", "bm1684x", "-o", str(tmp_path / "c.onnx"), check=True)
    assert "activations are symmetric" in proc.stdout  # the partition names the broken rule


def test_bad_input(calib: Path, tmp_path: Path) -> None:
    model = str(zoo.get("digits_cnn"))
    proc = run_cli("quantize", model, str(tmp_path / "o.onnx"), "--calib", str(calib), "--target", "bm1864x")
    assert_one_line_error(proc, "bm1864x", "bm1684x")
    proc = run_cli("quantize", model, str(tmp_path / "o.onnx"))
    assert_one_line_error(proc, "--calib")
    assert not (tmp_path / "o.onnx").exists()


def _broken_arrays(folder: Path) -> dict[str, Path]:
    """Calibration files as users break them: truncated .npz, garbage .npy, pickled object arrays."""
    folder.mkdir()
    good = folder / "good.npz"
    np.savez(good, input=np.zeros((2, 1, 8, 8), np.float32))
    truncated = folder / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    garbage = folder / "garbage.npy"
    garbage.write_bytes(b"\x93NUMPY not really an array")
    pickled = folder / "pickled.npz"
    np.savez(pickled, input=np.array([{"a": 1}, None], dtype=object))
    return {"truncated": truncated, "garbage": garbage, "pickled": pickled}


@pytest.mark.parametrize("case", ["truncated", "garbage", "pickled"])
def test_broken_calibration_file_is_one_line(tmp_path: Path, case: str) -> None:
    """A broken --calib file: exit 2, one line naming it, no output, the input unchanged (issue 17, item 4)."""
    bad = _broken_arrays(tmp_path / "calib")[case]
    before = bad.read_bytes()
    out = tmp_path / "q.onnx"
    proc = run_cli("quantize", str(zoo.get("digits_cnn")), str(out), "--calib", str(bad))
    assert_one_line_error(proc, str(bad), "not a readable")
    assert not out.exists() and bad.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib"]


def _calib(tmp_path: Path) -> Path:
    from zonnx.zoo.digits import digits_data

    x, _ = digits_data("calib")
    path = tmp_path / "calib.npz"
    np.savez(path, input=x[:8])
    return path


def _scales(model: onnx.ModelProto) -> dict[str, bytes]:
    return {t.name: numpy_helper.to_array(t).tobytes() for t in model.graph.initializer if "scale" in t.name}


def test_save_stats_writes_the_name_given_and_loads_back(tmp_path: Path) -> None:
    """``--save-stats st.json`` writes st.json (not st.json.npz), and ``--load-stats st.json`` reads it."""
    calib, model = _calib(tmp_path), str(zoo.get("digits_cnn"))
    stats = tmp_path / "st.json"
    run_cli(
        "quantize",
        model,
        str(tmp_path / "a.onnx"),
        "--calib",
        str(calib),
        "--save-stats",
        str(stats),
        check=True,
    )
    assert stats.is_file() and not (tmp_path / "st.json.npz").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name or p.name.startswith(".st.json")]
    run_cli("quantize", model, str(tmp_path / "b.onnx"), "--load-stats", str(stats), check=True)
    a, b = onnx.load(tmp_path / "a.onnx"), onnx.load(tmp_path / "b.onnx")
    assert _scales(a) == _scales(b)


@pytest.mark.parametrize("where", ["folder", "under_a_file", "table_in_missing_dir_of_a_file"])
def test_bad_stats_and_table_locations_fail_before_calibrating(tmp_path: Path, where: str) -> None:
    calib = _calib(tmp_path)
    afile = tmp_path / "afile"
    afile.write_text("x")
    (tmp_path / "adir").mkdir()
    option, path, fragment = {
        "folder": ("--save-stats", tmp_path / "adir", "is a folder"),
        "under_a_file": ("--save-stats", afile / "x.npz", "is a file, not a folder"),
        "table_in_missing_dir_of_a_file": (
            "--export-table",
            afile / "missing" / "t.txt",
            "is a file, not a folder",
        ),
    }[where]
    out = tmp_path / "q.onnx"
    proc = run_cli("quantize", str(zoo.get("digits_cnn")), str(out), "--calib", str(calib), option, str(path))
    assert_one_line_error(proc, str(path), fragment)
    assert not out.exists() and not (tmp_path / "adir.npz").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile", "calib.npz"]


def test_recovery_flags(calib: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec.onnx"
    proc = run_cli(
        "quantize", str(zoo.get("digits_cnn")), str(out), "--calib", str(calib), "--target", "dpu-b4096",
        "--cle", "--cle-steps", "2", "--bias-correction", check=True,
    )  # fmt: skip
    text = " ".join(proc.stdout.split())
    assert "cross-layer equalization:" in text and "x 2 step(s)" in text
    assert "bias correction:" in text and "output SQNR against the float model on those samples" in text
    bad = run_cli("quantize", str(zoo.get("digits_cnn")), str(tmp_path / "x.onnx"), "--calib", str(calib),
                  "--cle-steps", "2")  # fmt: skip
    assert bad.returncode != 0 and "IncludeCLE=True" in bad.stderr


def test_fast_finetune_flags(calib: Path, tmp_path: Path) -> None:
    model = str(zoo.get("digits_cnn"))
    plain, tuned = tmp_path / "plain.onnx", tmp_path / "tuned.onnx"
    run_cli("quantize", model, str(plain), "--calib", str(calib), "--target", "dpu-b4096", check=True)
    proc = run_cli(
        "quantize", model, str(tuned), "--calib", str(calib), "--target", "dpu-b4096",
        "--fast-finetune", "adaround", "--fast-finetune-iters", "20", check=True,
    )  # fmt: skip
    row = next(line for line in proc.stdout.splitlines() if "fast finetune" in line)
    assert "adaround: 6 layers on 8 samples" in row, row  # 5 Conv + 1 Gemm
    weights = [
        {
            t.name: numpy_helper.to_array(t)
            for t in onnx.load(p).graph.initializer
            if t.dims and len(t.dims) > 1
        }
        for p in (plain, tuned)
    ]
    assert weights[0].keys() == weights[1].keys()
    assert any(not np.array_equal(weights[0][k], weights[1][k]) for k in weights[0])
    proc = run_cli(
        "quantize", model, str(tmp_path / "o.onnx"), "--calib", str(calib), "--fast-finetune-iters", "5"
    )
    assert_one_line_error(proc, "--fast-finetune-iters needs --fast-finetune")
    proc = run_cli(
        "quantize", model, str(tmp_path / "o.onnx"), "--calib", str(calib), "--fast-finetune", "adaroud"
    )
    assert_one_line_error(proc, "--fast-finetune 'adaroud'")


def test_smooth_quant_flags(calib: Path, tmp_path: Path) -> None:
    model = str(zoo.get("digits_cnn"))
    proc = run_cli(
        "quantize", model, str(tmp_path / "s.onnx"), "--calib", str(calib), "--smooth-quant",
        "--smooth-quant-alpha", "0.6", check=True,
    )  # fmt: skip
    assert (
        "smooth quant" in proc.stdout and "alpha 0.6: 2 activations (0 folded, 2 Mul inserted)" in proc.stdout
    )
    proc = run_cli(
        "quantize", model, str(tmp_path / "t.onnx"), "--calib", str(calib), "--smooth-quant-alpha", "0.6"
    )
    assert_one_line_error(proc, "--smooth-quant-alpha has no effect without --smooth-quant")


def test_per_tensor_target_equalizes_unless_told_not_to(calib: Path, tmp_path: Path) -> None:
    """dpu-b4096's recipe (per-tensor weights) runs CLE and the summary says so; --smooth-quant adds
    SmoothQuant on top (its alpha with it), and --no-cle turns the recipe's CLE off."""
    model = str(zoo.get("digits_cnn"))
    args = ("quantize", model, "--calib", str(calib), "--target", "dpu-b4096")
    proc = run_cli(*args[:2], str(tmp_path / "r.onnx"), *args[2:], check=True)
    assert "cross-layer equalization: 1 pairs" in proc.stdout and "smooth quant" not in proc.stdout
    proc = run_cli(
        *args[:2],
        str(tmp_path / "s.onnx"),
        *args[2:],
        "--smooth-quant",
        "--smooth-quant-alpha",
        "0.3",
        check=True,
    )
    assert "smooth quant" in proc.stdout and "alpha 0.3" in proc.stdout
    assert "Mul" in {n.op_type for n in onnx.load(tmp_path / "s.onnx").graph.node}  # SmoothQuant's
    proc = run_cli(
        *args[:2], str(tmp_path / "n.onnx"), *args[2:], "--no-cle", "--no-smooth-quant", check=True
    )
    assert "smooth quant" not in proc.stdout and "cross-layer equalization" not in proc.stdout
    assert "Mul" not in {n.op_type for n in onnx.load(tmp_path / "n.onnx").graph.node}
