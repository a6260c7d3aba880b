"""Tests for the onnxslim pass: real models, the fallback when onnxslim's result is unusable, backend cases."""

from __future__ import annotations

import logging

import onnx_ir as ir
import pytest

from tests.helpers import op_types, parse, run_pass_and_compare
from tests.passes.test_constant_folding import check_reference, node_case, ppocr_feeds, ppocr_model
from zonnx.ir.io import default_opset, to_ir
from zonnx.passes.common.onnxslim_pass import OnnxSlimPass

#: onnxslim folds BatchNormalization into Conv weights: float rounding changes, so allow 1e-4.
RTOL = 1e-4


@pytest.mark.parametrize(
    ("name", "removed_bn"),
    [("ppocr_det", 3), ("ppocr_rec", 6), ("ppocr_cls", 35)],
)
def test_ppocr(name, removed_bn):
    model = ppocr_model(name)
    out, result = run_pass_and_compare(OnnxSlimPass(), model, feeds=ppocr_feeds(name), rtol=RTOL)
    counts = result.changes.counts
    assert counts["onnxslim removed BatchNormalization"] == removed_bn
    assert counts["onnxslim removed Constant"] == op_types(model).count("Constant")
    assert "BatchNormalization" not in op_types(out) and "Constant" not in op_types(out)
    assert default_opset(out) == default_opset(model)
    assert [o.name for o in out.graph.outputs] == [o.name for o in model.graph.output]
    assert out.ir_version == model.ir_version
    assert result.changes.misses == []


def test_second_run_changes_nothing():
    model = to_ir(ppocr_model("ppocr_cls"))
    OnnxSlimPass()(model)
    again = OnnxSlimPass()(model)
    assert not again.modified and again.changes.total == 0


def test_unloadable_result_leaves_the_model_unchanged(caplog):
    """A custom op ORT does not know makes the result fail the load check: nothing changes, one miss."""
    model = to_ir(
        parse("""
        <ir_version: 8, opset_import: ["" : 17, "custom" : 1]>
        g (float[2,3] x) => (float[2,3] y) {
            k = Constant<value = float[1] {2.0}>()
            a = custom.Foo(x)
            b = Mul(a, k)
            y = Identity(b)
        }
        """)  # fmt: skip
    )
    before = ir.serde.serialize_model(model).SerializeToString()
    with caplog.at_level(logging.WARNING, logger="zonnx.passes.common.onnxslim_pass"):
        result = OnnxSlimPass()(model)
    assert not result.modified and result.changes.total == 0
    assert ir.serde.serialize_model(result.model).SerializeToString() == before
    [miss] = result.changes.misses
    assert miss.startswith("onnxslim failed: onnxruntime cannot load the model:") and "custom:Foo" in miss
    assert miss.endswith("; model left unchanged")
    assert [r.getMessage() for r in caplog.records if r.name.startswith("zonnx")] == [miss]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "test_layer_normalization_4d_axis1_expanded",
            {
                "onnxslim removed Cast": 3,
                "onnxslim removed Concat": 1,
                "onnxslim removed Constant": 3,
                "onnxslim removed ConstantOfShape": 1,
                "onnxslim removed Shape": 1,
                "onnxslim removed Size": 1,
                "onnxslim removed Slice": 1,
                "onnxslim removed Sub": 1,
            },
        ),
        ("test_gelu_tanh_1_expanded", {"onnxslim removed Constant": 5}),
        ("test_if", {}),
        ("test_dropout_default_mask", {}),
    ],
)
def test_backend_node_cases(case, expected):
    model, feeds, reference = node_case(case)
    out, result = check_reference(OnnxSlimPass(), model, feeds, reference, rtol=RTOL)
    assert result.changes.counts == expected


def test_onnxslim_crash_leaves_the_model_unchanged(caplog):
    """onnxslim 0.1.98 raises on this opset-1 model (ONNX backend test_not_3d): the fallback keeps it."""
    model = parse("""
        <ir_version: 3, opset_import: ["" : 1]>
        g (bool[3,4,5] x) => (bool[3,4,5] y) {
            y = Not(x)
        }
        """)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="zonnx.passes.common.onnxslim_pass"):
        out, result = run_pass_and_compare(OnnxSlimPass(), model)
    assert not result.modified and op_types(out) == ["Not"]
    [miss] = result.changes.misses
    assert miss.startswith("onnxslim failed: ") and miss.endswith("; model left unchanged")
    assert "\n" not in miss
    assert any(r.levelno == logging.WARNING and r.getMessage() == miss for r in caplog.records)
