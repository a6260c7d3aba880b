"""Tests for dead-code: unused nodes (also in subgraphs and functions), initializers, functions, opsets."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from tests.helpers import op_types, parse, run_pass_and_compare
from tests.passes.test_constant_folding import (
    check_reference,
    node_case,
    ppocr_feeds,
    ppocr_model,
    shipped_case,
)
from zonnx.ir.io import to_ir
from zonnx.passes.common.constant_folding import ConstantFoldingPass
from zonnx.passes.common.dead_code import DeadCodeEliminationPass

_MODEL = """
<ir_version: 8, opset_import: ["" : 17, "local" : 1, "custom" : 1]>
g (float[2,3] x, bool c) => (float[2,3] y) {
    dead1 = Sigmoid(x)
    dead2 = Relu(dead1)
    u = local.Twice(x)
    a = Add(u, w1)
    b = Add(a, w2)
    y = If(c) <then_branch = t () => (float[2,3] p) {
        junk = Neg(b)
        p = Abs(b)
    }, else_branch = e () => (float[2,3] q) {
        q = Identity(b)
    }>
    o = Mul(x, only_in_dead_if)
    dead_if = If(c) <then_branch = t2 () => (float[2,3] p2) {
        p2 = Neg(o)
    }, else_branch = e2 () => (float[2,3] q2) {
        q2 = Identity(o)
    }>
}
<domain: "local", opset_import: ["" : 17]>
Twice (x) => (y) {
    unused = Neg(x)
    y = Add(x, x)
}
<domain: "local", opset_import: ["" : 17]>
Unused (x) => (y) {
    y = Neg(x)
}
"""


def _model():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, 3)).astype(np.float32)
    return parse(
        _MODEL,
        ("w1", w),
        ("w2", w.copy()),  # same bytes as w1: merged
        ("w3", np.ones(3, np.float32)),  # unused
        ("only_in_dead_if", np.ones(3, np.float32)),  # used only by the dead If's producer
    )


def test_everything_unused_goes_and_the_signature_stays():
    model = _model()
    for cond in (True, False):
        feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "c": np.array(cond)}
        out, result = run_pass_and_compare(DeadCodeEliminationPass(), model, feeds=feeds)
    # main graph: dead1, dead2, dead_if (+ its 2 inner nodes), o; then branch: junk; function: unused
    assert result.changes.counts == {
        "removed unused node": 8,
        "removed unused initializer": 2,  # w3, only_in_dead_if
        "merged duplicate initializer": 1,  # w2 -> w1
        "removed unused function": 1,  # Unused
        "removed unused opset import": 1,  # custom
    }
    assert op_types(out) == ["Twice", "Add", "Add", "If"]
    assert set(out.graph.initializers) == {"w1"}
    assert [v.name for v in out.graph.inputs] == ["x", "c"] and [v.name for v in out.graph.outputs] == ["y"]
    then_branch = out.graph.node(3).attributes["then_branch"].as_graph()
    assert [n.op_type for n in then_branch] == ["Abs"]
    assert [f.name for f in out.functions.values()] == ["Twice"]
    assert [n.op_type for n in out.functions["local", "Twice", ""]] == ["Add"]
    assert set(out.opset_imports) == {"", "local"}


def test_second_run_changes_nothing():
    model = to_ir(_model())
    DeadCodeEliminationPass()(model)
    again = DeadCodeEliminationPass()(model)
    assert not again.modified and again.changes.total == 0


def test_initializer_that_is_an_input_or_output_stays():
    model = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[3] x, float[3] w) => (float[3] y, float[3] k) {
            y = Relu(x)
        }
        """,
        ("w", np.ones(3, np.float32)),
        ("k", np.ones(3, np.float32)),
    )
    out, result = run_pass_and_compare(DeadCodeEliminationPass(), model)
    assert result.changes.total == 0
    assert set(out.graph.initializers) == {"w", "k"}


def test_duplicates_of_different_type_or_shape_are_not_merged():
    model = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,2] x) => (float[2,2] y, float[4] z, double[2,2] d) {
            y = Add(x, a)
            f = Reshape(x, shp)
            z = Add(f, b)
            dx = Cast<to = 11>(x)
            d = Add(dx, c)
        }
        """,
        ("a", np.ones((2, 2), np.float32)),
        ("b", np.ones(4, np.float32)),
        ("c", np.ones((2, 2), np.float64)),
        ("shp", np.array([4])),
    )
    out, result = run_pass_and_compare(DeadCodeEliminationPass(), model)
    assert result.changes.total == 0 and len(out.graph.initializers) == 4


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ppocr_det", {"merged duplicate initializer": 101}),
        ("ppocr_rec", {"merged duplicate initializer": 168}),
        ("ppocr_cls", {"merged duplicate initializer": 71}),
    ],
)
def test_ppocr_after_folding(name, expected):
    """Folded PP-OCR models carry many identical small constants (BN epsilons, hardswish 3s and 6s)."""
    folded = ConstantFoldingPass()(to_ir(ppocr_model(name))).model
    before = len(folded.graph.initializers)
    out, result = run_pass_and_compare(
        DeadCodeEliminationPass(), ir.serde.serialize_model(folded), feeds=ppocr_feeds(name)
    )
    assert result.changes.counts == expected
    assert len(out.graph.initializers) == before - expected["merged duplicate initializer"]


def test_ppocr_unfolded_has_nothing_dead():
    out, result = run_pass_and_compare(
        DeadCodeEliminationPass(), ppocr_model("ppocr_cls"), feeds=ppocr_feeds("ppocr_cls")
    )
    assert result.changes.total == 0


@pytest.mark.parametrize("case", ["test_if", "test_loop11", "test_layer_normalization_4d_axis1_expanded"])
def test_backend_node_cases(case):
    model, feeds, reference = node_case(case)
    out, result = check_reference(DeadCodeEliminationPass(), model, feeds, reference)
    assert op_types(out) == op_types(model)  # nothing in these is dead
    assert result.changes.total == 0


def test_backend_shipped_case_with_sequences():
    model, feeds, reference = shipped_case("simple", "test_sequence_model1")
    out, result = check_reference(DeadCodeEliminationPass(), model, feeds, reference)
    assert result.changes.total == 0 and op_types(out) == op_types(model)
