"""The peer scripts of bench_accuracy_peers refuse bad input before importing their peer (run without it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from bench.bench_accuracy_peers import activation_quantizers
from bench.peer_venv import SCRIPTS, save_feeds

MODEL = onnx.parser.parse_model(
    """
    <ir_version: 8, opset_import: ["": 13]>
    g (float[1, 4] x) => (float[1, 4] y) {
        y = Relu(x)
    }
    """
)


def _run(script: str, *args: object) -> subprocess.CompletedProcess[str]:
    """Run a peer script with zonnx's interpreter, where neither nncf nor aimet_onnx is installed."""
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), *map(str, args)], capture_output=True, text=True, timeout=60
    )


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    model = tmp_path / "m.onnx"
    onnx.save(MODEL, str(model))
    calib = save_feeds(
        [{"x": np.ones((1, 4), np.float32)}, {"x": np.zeros((1, 4), np.float32)}], tmp_path / "c.npz"
    )
    return {"model": model, "calib": calib, "out": tmp_path / "q.onnx", "tmp": tmp_path}


@pytest.mark.parametrize("script", ["nncf_quantize.py", "aimet_quantize.py"])
def test_bad_paths_exit_2_with_one_line(script: str, files: dict[str, Path]) -> None:
    cases = [
        ((files["tmp"] / "missing.onnx", files["calib"], files["out"]), "does not exist"),
        ((files["model"], files["tmp"] / "missing.npz", files["out"]), "not an existing .npz"),
        ((files["model"], files["calib"], files["tmp"] / "q.txt"), "must end in .onnx"),
        ((files["model"], files["calib"], files["model"]), "is the input model"),
        ((files["model"], files["calib"], files["tmp"] / "no" / "q.onnx"), "does not exist"),
    ]
    if script == "aimet_quantize.py":
        cases[0] = ((files["tmp"] / "missing.onnx", files["calib"], files["out"]), "not an existing .onnx")
    for args, message in cases:
        done = _run(script, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr.strip().splitlines()[-1]
        assert "Traceback" not in done.stderr
    assert not files["out"].exists()


def test_bad_calibration_files_are_refused(files: dict[str, Path]) -> None:
    tmp = files["tmp"]
    np.savez(tmp / "gap.npz", **{"0.x": np.ones((1, 4), np.float32), "2.x": np.ones((1, 4), np.float32)})
    np.savez(tmp / "key.npz", x=np.ones((1, 4), np.float32))
    np.savez(tmp / "names.npz", **{"0.x": np.ones((1, 4), np.float32), "1.y": np.ones((1, 4), np.float32)})
    np.savez(tmp / "empty.npz")
    expected = {
        "gap.npz": "without gaps",
        "key.npz": "is not '<index>.<input name>'",
        "names.npz": "sample 1 has inputs ['y']",
        "empty.npz": "holds no samples",
    }
    for name, message in expected.items():
        done = _run("nncf_quantize.py", files["model"], tmp / name, files["out"])
        assert done.returncode == 2
        assert message in done.stderr, done.stderr


def test_nncf_options_are_checked(files: dict[str, Path]) -> None:
    base = (files["model"], files["calib"], files["out"])
    done = _run("nncf_quantize.py", *base, "--smooth-quant-matmul", "0.5")
    assert done.returncode == 2 and "--model-type transformer only" in done.stderr
    done = _run("nncf_quantize.py", *base, "--model-type", "transformer", "--smooth-quant-matmul", "1.5")
    assert done.returncode == 2 and "alpha must be <= 1" in done.stderr
    done = _run("nncf_quantize.py", *base, "--model-type", "cnn")
    assert done.returncode == 2 and "invalid choice" in done.stderr
    # Valid arguments get past the checks and fail only at the missing peer package.
    done = _run("nncf_quantize.py", *base, "--model-type", "transformer", "--smooth-quant-matmul", "-1")
    assert done.returncode == 1 and "No module named 'nncf'" in done.stderr


def test_activation_quantizers_skip_weight_quantizers(tmp_path: Path) -> None:
    model = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["": 13]>
        g (float[1, 4] x) => (float[1, 4] y)
        <float s = {0.1}, uint8 z = {128}, float[4, 4] w = {1,0,0,0, 0,1,0,0, 0,0,1,0, 0,0,0,1}> {
            qx = QuantizeLinear(x, s, z)
            dx = DequantizeLinear(qx, s, z)
            qw = QuantizeLinear(w, s, z)
            dw = DequantizeLinear(qw, s, z)
            c = Constant<value = float[4, 4] {1,0,0,0, 0,1,0,0, 0,0,1,0, 0,0,0,1}>()
            qc = QuantizeLinear(c, s, z)
            dc = DequantizeLinear(qc, s, z)
            m = MatMul(dx, dw)
            n = MatMul(m, dc)
            qn = QuantizeLinear(n, s, z)
            y = DequantizeLinear(qn, s, z)
        }
        """
    )
    onnx.save(model, str(tmp_path / "q.onnx"))
    assert activation_quantizers(tmp_path / "q.onnx") == 2
