"""``zonnx quantize`` on models already quantized by ONNX Runtime: retargeted, not quantized twice."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.helpers import assert_one_line_error, run_cli
from zonnx import zoo


class _Reader:
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.it, None)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    d = tmp_path_factory.mktemp("prequant_cli")
    src = str(zoo.get("digits_cnn"))
    feeds = zoo.sample_inputs("digits_cnn", 8, seed=3)
    np.savez(d / "calib.npz", input=np.concatenate([f["input"] for f in feeds]))
    quantize_static(src, str(d / "qdq.onnx"), _Reader(feeds), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
    quantize_dynamic(src, str(d / "dyn.onnx"), weight_type=QuantType.QInt8)
    return {"qdq": d / "qdq.onnx", "dyn": d / "dyn.onnx", "calib": d / "calib.npz"}


def test_qdq_model_retargets_without_data(models: dict[str, Path], tmp_path: Path) -> None:
    proc = run_cli(
        "compile", str(models["qdq"]), "--target", "bm1684x", "-o", str(tmp_path / "as_is.onnx"), check=True
    )
    first = proc.stdout.splitlines()[0]  # compiled as it is: one line says why and how to fix it
    assert "quantization grids break bm1684x's rules (zero_point" in first and "zonnx quantize" in first, (
        first
    )
    out = tmp_path / "out.onnx"
    proc = run_cli("quantize", str(models["qdq"]), str(out), "--target", "bm1684x", check=True)
    assert "retargeted a pre-quantized qdq model" in proc.stdout and "no accuracy check" in proc.stdout
    src = Counter(n.op_type for n in onnx.load(str(models["qdq"])).graph.node)
    got = Counter(n.op_type for n in onnx.load(str(out)).graph.node)
    assert got["DequantizeLinear"] <= src["DequantizeLinear"]  # one layer of quantizers, not two
    proc = run_cli("compile", str(out), "--target", "bm1684x", "-o", str(tmp_path / "c.onnx"), check=True)
    assert "100.0% of" in proc.stdout


def test_dynamic_model_needs_calib(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    proc = run_cli("quantize", str(models["dyn"]), str(out), "--target", "bm1684x")
    assert_one_line_error(proc, "dynamically quantized", "--calib")
    assert not out.exists()
    proc = run_cli(
        "quantize",
        str(models["dyn"]),
        str(out),
        "--target",
        "bm1684x",
        "--calib",
        str(models["calib"]),
        check=True,
    )
    assert "retargeted a pre-quantized dynamic model" in proc.stdout and "cosine" in proc.stdout
