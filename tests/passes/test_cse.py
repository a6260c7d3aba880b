"""Tests for cse: what merges, what never merges, graph output names, PP-OCR and backend models."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import op_types, parse, run_pass_and_compare
from tests.passes.test_constant_folding import check_reference, node_case, ppocr_feeds, ppocr_model
from zonnx.ir.io import to_ir
from zonnx.passes.common.cse import CommonSubexpressionPass


def test_duplicates_merge_in_chains():
    model = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[2,3] y) {
            a1 = Relu(x)
            a2 = Relu(x)
            b1 = Add(a1, w)
            b2 = Add(a2, w)
            c1 = Sigmoid(b1)
            c2 = Sigmoid(b2)
            y = Mul(c1, c2)
        }
        """,
        ("w", np.full((2, 3), 0.5, np.float32)),
    )
    out, result = run_pass_and_compare(CommonSubexpressionPass(), model)
    assert result.changes.counts == {
        "merged duplicate Relu": 1,
        "merged duplicate Add": 1,
        "merged duplicate Sigmoid": 1,
    }
    assert op_types(out) == ["Relu", "Add", "Sigmoid", "Mul"]


def test_different_inputs_or_attributes_stay_apart():
    model = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[2,3] y) {
            a1 = Add(x, w1)
            a2 = Add(x, w2)
            l1 = LeakyRelu<alpha = 0.1>(a1)
            l2 = LeakyRelu<alpha = 0.2>(a1)
            z1 = LeakyRelu<alpha = 0.0>(a2)
            z2 = LeakyRelu<alpha = -0.0>(a2)
            s1 = Sum(l1, l2)
            s2 = Sum(z1, z2)
            y = Sub(s1, s2)
        }
        """,
        ("w1", np.ones((2, 3), np.float32)),
        ("w2", np.ones((2, 3), np.float32)),  # equal content but another value: dead-code dedupes it
    )
    out, result = run_pass_and_compare(CommonSubexpressionPass(), model)
    assert result.changes.total == 0
    assert op_types(out) == op_types(model)


def test_constants_with_the_same_value_merge():
    model = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[3] x) => (float[3] y) {
            k1 = Constant<value = float[3] {1.0, 2.0, 3.0}>()
            k2 = Constant<value = float[3] {1.0, 2.0, 3.0}>()
            k3 = Constant<value = float[3] {1.0, 2.0, 4.0}>()
            a = Mul(x, k1)
            b = Mul(x, k2)
            c = Mul(x, k3)
            y = Sum(a, b, c)
        }
        """
    )
    out, result = run_pass_and_compare(CommonSubexpressionPass(), model)
    assert result.changes.counts == {"merged duplicate Constant": 1, "merged duplicate Mul": 1}
    assert op_types(out) == ["Constant", "Constant", "Mul", "Mul", "Sum"]


def test_random_and_dropout_never_merge():
    model = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[2,3] y, float[2,3] z) {
            r1 = RandomNormalLike(x)
            r2 = RandomNormalLike(x)
            y = Add(r1, r2)
            d1 = Dropout(x, ratio)
            d2 = Dropout(x, ratio)
            z = Add(d1, d2)
        }
        """,
        ("ratio", np.float32(0.5)),
    )
    result = CommonSubexpressionPass()(to_ir(model))
    assert result.changes.total == 0 and not result.modified
    assert op_types(result.model) == op_types(model)


def test_graph_outputs_keep_their_names():
    model = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[2,3] y1, float[2,3] y2, float[2,3] z) {
            y1 = Relu(x)
            y2 = Relu(x)
            s1 = Sigmoid(x)
            z = Sigmoid(x)
            u = Add(s1, z)
        }
        """
    )
    out, result = run_pass_and_compare(CommonSubexpressionPass(), model)
    assert result.changes.counts == {"merged duplicate Relu": 1, "merged duplicate Sigmoid": 1}
    assert [o.name for o in out.graph.outputs] == ["y1", "y2", "z"]
    # y2 duplicated y1, itself an output: an Identity keeps both names. z took over s1's node.
    assert op_types(out) == ["Relu", "Identity", "Sigmoid", "Add"]
    sigmoid = out.graph.node(2)
    assert sigmoid.outputs[0].name == "z" and out.graph.node(3).inputs == (sigmoid.outputs[0],) * 2


def test_subgraph_duplicates_merge_inside_their_graph():
    model = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[3] x, bool c) => (float[3] y) {
            y = If(c) <then_branch = t () => (float[3] p) {
                a = Neg(x)
                b = Neg(x)
                p = Add(a, b)
            }, else_branch = e () => (float[3] q) {
                q = Neg(x)
            }>
        }
        """
    )
    feeds = {"x": np.arange(3, dtype=np.float32), "c": np.array(True)}
    out, result = run_pass_and_compare(CommonSubexpressionPass(), model, feeds=feeds)
    assert result.changes.counts == {"merged duplicate Neg": 1}
    then_branch = out.graph.node(0).attributes["then_branch"].as_graph()
    assert [n.op_type for n in then_branch] == ["Neg", "Add"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ppocr_det", {"merged duplicate Constant": 101}),
        (
            "ppocr_rec",
            {"merged duplicate Constant": 165, "merged duplicate Shape": 1, "merged duplicate Cast": 11},
        ),
        ("ppocr_cls", {"merged duplicate Constant": 76}),
    ],
)
def test_ppocr(name, expected):
    """The exported models repeat small Constants (BN epsilons, 3s and 6s of hardswish, shape pieces)."""
    out, result = run_pass_and_compare(CommonSubexpressionPass(), ppocr_model(name), feeds=ppocr_feeds(name))
    assert result.changes.counts == expected


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("test_gelu_tanh_1_expanded", {}),
        ("test_group_normalization_example_expanded", {"merged duplicate Constant": 1}),
        ("test_layer_normalization_4d_axis1_expanded", {}),
        ("test_if", {}),
    ],
)
def test_backend_node_cases(case, expected):
    model, feeds, reference = node_case(case)
    out, result = check_reference(CommonSubexpressionPass(), model, feeds, reference)
    assert result.changes.counts == expected
