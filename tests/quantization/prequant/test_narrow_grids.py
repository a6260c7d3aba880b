"""A pre-quantized model whose activation grids are narrower than any the target has is refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnxruntime.quantization import QuantFormat, QuantType
from onnxruntime.quantization import quantize_static as ort_quantize_static

from tests.helpers import run_cli
from zonnx import zoo
from zonnx.quantization.calibration.readers import ListReader


@pytest.fixture(scope="module")
def int4_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits CNN quantized by ORT itself with 4-bit activations (com.microsoft Q/DQ, int4 codes)."""
    out = tmp_path_factory.mktemp("int4") / "digits_a4.onnx"
    feeds = zoo.sample_inputs("digits_cnn", 8)
    ort_quantize_static(str(zoo.get("digits_cnn")), str(out), ListReader(feeds), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt4, weight_type=QuantType.QInt8)  # fmt: skip
    return out


@pytest.mark.parametrize("target", ["dpu-b4096", "zhouyi-x2"])
def test_4_bit_activations_are_refused_for_an_8_bit_target(
    int4_model: Path, tmp_path: Path, target: str
) -> None:
    calib = tmp_path / "calib.npz"
    np.savez(calib, input=np.concatenate([f["input"] for f in zoo.sample_inputs("digits_cnn", 8)]))
    before = int4_model.read_bytes()
    out = tmp_path / "out.onnx"
    proc = run_cli("quantize", str(int4_model), str(out), "--target", target, "--calib", str(calib))
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "4-bit grids" in lines[0] and "--requantize" in lines[0]
    assert "Traceback" not in proc.stderr and not out.exists() and int4_model.read_bytes() == before
    # the fix the line names works: from float, for the target, with the comparison against the source
    proc = run_cli(
        "quantize", str(int4_model), str(out), "--target", target, "--calib", str(calib), "--requantize"
    )
    assert proc.returncode == 0, proc.stderr
    assert out.exists()


def test_ort_16_bit_qdq_in_com_microsoft_is_imported_not_ignored(tmp_path: Path) -> None:
    """ORT writes 16-bit Q/DQ below opset 21 in com.microsoft: zonnx imports it like ONNX's Q/DQ."""
    src = tmp_path / "digits_a16.onnx"
    feeds = zoo.sample_inputs("digits_cnn", 8)
    ort_quantize_static(str(zoo.get("digits_cnn")), str(src), ListReader(feeds), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt16, weight_type=QuantType.QInt8)  # fmt: skip
    out = tmp_path / "out.onnx"
    proc = run_cli("quantize", str(src), str(out), "--target", "zhouyi-x2")
    assert proc.returncode == 0, proc.stderr
    assert "pre-quantized qdq model" in proc.stderr and "nothing to quantize" not in proc.stderr
    model = onnx.load(out)
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    src_dq = [n for n in onnx.load(src).graph.node if n.op_type == "DequantizeLinear"]
    assert dq and len(dq) <= len(src_dq)  # re-expressed, never a second layer on top of the first
