"""Tests for fuse-hardswish: the paddle2onnx and divide-last arrangements, HardSigmoid, opset 13, refusals."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import op_types, parse, run_pass_and_compare
from zonnx import zoo
from zonnx.ir.io import to_ir
from zonnx.passes.fusion.hardswish import FuseHardSwishPass

HEAD = '<ir_version: 8, opset_import: ["" : {opset}]>\ng (float[2, 8] x) => (float[2, 8] y) {{\n'
CONSTS = (
    ("three", np.array(3.0, np.float32)),
    ("zero", np.array(0.0, np.float32)),
    ("six", np.array(6.0, np.float32)),
    ("sixth", np.array(1.0 / 6.0, np.float32)),
)


def _model(body: str, opset: int = 17):
    return parse(HEAD.format(opset=opset) + body + "\n}", *CONSTS)


FEEDS = {"x": np.linspace(-5.0, 5.0, 16, dtype=np.float32).reshape(2, 8)}

SWISH_FORMS = {
    # paddle2onnx: x * clip, then / 6
    "mul_then_div": "a = Add (x, three)\nc = Clip (a, zero, six)\nm = Mul (x, c)\ny = Div (m, six)",
    # clip / 6 first (HardSigmoid), then x *
    "div_then_mul": "a = Add (three, x)\nc = Clip (a, zero, six)\nd = Mul (c, sixth)\ny = Mul (d, x)",
    "hardsigmoid": "h = HardSigmoid <alpha = 0.16666667, beta = 0.5> (x)\ny = Mul (x, h)",
}


@pytest.mark.parametrize("form", list(SWISH_FORMS))
def test_hard_swish_forms_become_one_node(form: str) -> None:
    model, result = run_pass_and_compare(FuseHardSwishPass(), _model(SWISH_FORMS[form]), feeds=FEEDS)
    assert op_types(model) == ["HardSwish"]
    assert result.changes.counts == {"fused HardSwish": 1}


def test_hard_sigmoid_alone() -> None:
    body = "a = Add (x, three)\nc = Clip (a, zero, six)\ny = Div (c, six)"
    model, result = run_pass_and_compare(FuseHardSwishPass(), _model(body), feeds=FEEDS)
    assert op_types(model) == ["HardSigmoid"]
    assert result.changes.counts == {"fused HardSigmoid": 1}


def test_opset_13_fuses_the_hard_sigmoid_part_and_names_the_opset() -> None:
    body = SWISH_FORMS["div_then_mul"]
    model, result = run_pass_and_compare(FuseHardSwishPass(), _model(body, opset=13), feeds=FEEDS)
    assert op_types(model) == ["HardSigmoid", "Mul"]
    assert any("HardSwish needs opset 14, the model is at 13" in m for m in result.changes.misses)


def test_other_clip_bounds_and_shared_values_are_left_alone() -> None:
    relu6 = "a = Add (x, three)\nc = Clip (a, zero, three)\nm = Mul (x, c)\ny = Div (m, six)"
    model, result = run_pass_and_compare(FuseHardSwishPass(), _model(relu6), feeds=FEEDS)
    assert "HardSwish" not in op_types(model) and result.changes.total == 0
    text = (
        HEAD.format(opset=17).replace("(float[2, 8] y)", "(float[2, 8] y, float[2, 8] c)")
        + "a = Add (x, three)\nc = Clip (a, zero, six)\nm = Mul (x, c)\ny = Div (m, six)\n}"
    )
    model, result = run_pass_and_compare(FuseHardSwishPass(), parse(text, *CONSTS), feeds=FEEDS)
    assert "HardSwish" not in op_types(model)
    assert any("c is also a graph output" in m for m in result.changes.misses)


def test_ppocr_rec_hardswish_count() -> None:
    """PP-OCRv4's recognizer writes 28 hard-swishes as Add/Clip/Mul/Div; at opset 17 all become HardSwish."""
    import onnx

    from zonnx.optimization import OptimizeOptions, optimize_with_report

    base = optimize_with_report(onnx.load(zoo.get("ppocr_rec")), OptimizeOptions(skip=("fuse-hardswish",)))
    model = to_ir(base.model)
    assert FuseHardSwishPass()(model).changes.counts == {"fused HardSwish": 28}
    assert "Clip" not in {n.op_type for n in model.graph}
