"""Average pools with dynamic input shapes: scaled for the NPU with the window of the calibration samples'
shape, so the fake-quant model computes what the compiled model computes."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import zonnx
from tests.helpers import parse
from zonnx import zoo
from zonnx.build_npu import target_quantize_kwargs
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.refine.avgpool import FACTOR_KEY

_RNG = np.random.default_rng(5)
# a squeeze-excite block: its GlobalAveragePool's window is the (open) spatial size of the input
_SE = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 4, H, W] x) => (float[1, 8, H, W] y) {
    c = Conv <pads = [1, 1, 1, 1]> (x, W1, B1)
    r = Relu (c)
    p = GlobalAveragePool (r)
    s = Conv (p, W2, B2)
    h = HardSigmoid <alpha = 0.1666667, beta = 0.5> (s)
    y = Mul (r, h)
}
"""
_INITS = (
    ("W1", _RNG.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32)),
    ("B1", _RNG.normal(0, 0.1, (8,)).astype(np.float32)),
    ("W2", _RNG.normal(0, 0.3, (8, 8, 1, 1)).astype(np.float32)),
    ("B2", _RNG.normal(0, 0.1, (8,)).astype(np.float32)),
)


def _feeds(shapes: list[tuple[int, int]]) -> list[dict[str, np.ndarray]]:
    return [{"x": _RNG.normal(0, 1, (1, 4, h, w)).astype(np.float32)} for h, w in shapes]


def _factor_muls(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "Mul" and n.name.endswith("_npu_factor_Mul")]


def test_window_taken_from_the_calibration_samples(tmp_path: Path, caplog) -> None:
    src = tmp_path / "se.onnx"
    onnx.save(parse(_SE, *_INITS), src)
    caplog.set_level(logging.INFO, logger="zonnx")
    result = zonnx.quantize_static(
        src, tmp_path / "q.onnx", ListReader(_feeds([(6, 20)] * 4)), **target_quantize_kwargs("dpu-b4096")
    )
    (mul,) = _factor_muls(result.model)
    pool = next(n for n in result.model.graph.node if n.op_type == "GlobalAveragePool")
    factor = {p.key: p.value for p in pool.metadata_props}[FACTOR_KEY]
    k, n = (int(v) for v in factor.replace("2^", "").split("/"))
    scale = onnx.numpy_helper.to_array(
        next(i for i in result.model.graph.initializer if i.name == mul.input[1])
    )
    assert scale == np.float32(120 * k / 2**n) != np.float32(1.0)  # 6 x 20 = 120 elements
    assert "as for inputs x:1,4,6,20" in caplog.text and "--input-shape x:1,4,6,20" in caplog.text
    # the inputs stay dynamic: other widths still run on the CPU
    dims = result.model.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in dims[2:]] == ["H", "W"]


def test_samples_of_several_shapes_leave_the_pool_exact_and_say_so(tmp_path: Path, caplog) -> None:
    src = tmp_path / "se.onnx"
    onnx.save(parse(_SE, *_INITS), src)
    feeds = _feeds([(6, 20), (6, 24), (6, 20), (6, 24)])
    result = zonnx.quantize_static(
        src, tmp_path / "q.onnx", ListReader(feeds), **target_quantize_kwargs("dpu-b4096")
    )
    assert _factor_muls(result.model) == []
    assert "the calibration samples differ in shape" in caplog.text
    assert "zonnx optimize MODEL OUT --input-shape" in caplog.text


@pytest.mark.parametrize("target", ["dpu-b4096"])
def test_ppocr_rec_dynamic_width_fake_quant_equals_the_npu(tmp_path: Path, target: str) -> None:
    """PP-OCRv4 rec reads lines of any width; quantized from 48x160 lines, its fake-quant output equals
    the NPU's for those lines bit for bit (before, its two squeeze-excite pools divided exactly)."""
    lines = [{"x": _RNG.uniform(-1, 1, (1, 3, 48, 160)).astype(np.float32)} for _ in range(3)]
    out = tmp_path / "rec.onnx"
    zonnx.quantize_static(zoo.get("ppocr_rec"), out, ListReader(lines[:2]), **target_quantize_kwargs(target))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    fake = ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"])
    npu = zonnx.InferenceSession(
        str(out),
        providers=["ZonnxNPUExecutionProvider", "CPUExecutionProvider"],
        provider_options=[
            {"target": target, "cache_dir": str(tmp_path / "c"), "input_shapes": "x:1,3,48,160"},
            {},
        ],
    )
    assert len(_factor_muls(onnx.load(out))) > 0
    for feed in lines:
        np.testing.assert_array_equal(npu.run(None, feed)[0], fake.run(None, feed)[0])


def test_compiled_for_another_shape_says_which_window(tmp_path: Path, caplog) -> None:
    src = tmp_path / "se.onnx"
    onnx.save(parse(_SE, *_INITS), src)
    out = tmp_path / "q.onnx"
    zonnx.quantize_static(src, out, ListReader(_feeds([(6, 20)] * 4)), **target_quantize_kwargs("dpu-b4096"))
    from zonnx.backend.compile_api import compile_model

    assert compile_model(out, "dpu-b4096", input_shapes={"x": [1, 4, 6, 20]}).partition.mac_share == 1.0
    other = compile_model(out, "dpu-b4096", input_shapes={"x": [1, 4, 6, 24]})
    assert other.partition.mac_share == 0.0
    assert "is not the NPU factor of its 6x24 window here" in caplog.text
    assert "(--input-shape)" in caplog.text
