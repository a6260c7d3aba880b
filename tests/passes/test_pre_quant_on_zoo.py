"""The whole pre_quant pipeline on every zoo model: verified after each pass on real inputs, with the
rewrites each model must get."""

from __future__ import annotations

from collections import Counter

import onnx
import pytest

from zonnx import zoo
from zonnx.ir.io import MAX_IR_VERSION, load_proto, to_ir
from zonnx.optimization import OptimizeOptions, optimize_with_report
from zonnx.passes.common.shape_inference import unknown_shapes
from zonnx.passes.pipeline import VerifyOptions

#: op type -> count that must remain after the pipeline (absent ops must be gone).
EXPECTED = {
    "digits_cnn": {"BatchNormalization": 0},
    "resnet18-random": {"BatchNormalization": 0, "Conv": 20},
    "mobilenetv2-random": {"BatchNormalization": 0},
    "transformer-random": {"LayerNormalization": 4, "com.microsoft:Gelu": 2, "Erf": 0, "Sqrt": 0},
    "bert_encoder-random": {"LayerNormalization": 13, "com.microsoft:Gelu": 6, "Erf": 0, "Softmax": 6},
    # the trained 4-layer classifier: embedding LayerNorm + 2 per layer, GELU fused, the pooler's Tanh kept
    "bert_encoder": {"LayerNormalization": 9, "com.microsoft:Gelu": 4, "Erf": 0, "Softmax": 4, "Tanh": 1},
    "ppocr_det": {"BatchNormalization": 0, "Constant": 0},
    "ppocr_rec": {"BatchNormalization": 0, "Constant": 0},
    "ppocr_cls": {"BatchNormalization": 0, "Constant": 0},
    # measured: BatchNorm folded, the shape arithmetic of the box decoder (Shape/Unsqueeze/Constant) folded
    "yolo_det": {"BatchNormalization": 0, "Constant": 0, "Shape": 0, "Unsqueeze": 0, "Conv": 8, "Sigmoid": 7},
}


#: Trained for minutes at first use (same graph as mobilenetv2-random): its pipeline runs in bench/ only.
LONG_BUILDS = {"mobilenetv2_digits"}


@pytest.mark.parametrize("name", [n for n in zoo.names() if n not in LONG_BUILDS])
def test_pre_quant_pipeline_verified_on_real_inputs(name: str) -> None:
    feeds = zoo.sample_inputs(name, 1, seed=3)[0]
    options = OptimizeOptions(verify=VerifyOptions(feeds=feeds))
    result = optimize_with_report(load_proto(zoo.get(name)), options)
    report = result.report
    assert report.max_error is not None and report.max_error <= 1e-5, report.max_error
    assert report.nodes_after < report.nodes_before
    model: onnx.ModelProto = result.model  # type: ignore[assignment]
    assert model.ir_version <= MAX_IR_VERSION
    assert {i.domain: i.version for i in model.opset_import}[""] >= 17
    ops = Counter((f"{n.domain}:" if n.domain else "") + n.op_type for n in model.graph.node)
    for op, count in EXPECTED[name].items():
        assert ops[op] == count, (op, ops[op])
    assert unknown_shapes(to_ir(model)) == []
