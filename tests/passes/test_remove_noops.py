"""Tests for remove-noops: every rule, what must stay, graph output names, PP-OCR and backend models."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import op_types, parse, run_pass_and_compare
from tests.passes.test_constant_folding import check_reference, node_case, ppocr_feeds, ppocr_model
from zonnx.ir.io import to_ir
from zonnx.passes.common.remove_noops import RemoveNoOpsPass

_HEAD = '<ir_version: 8, opset_import: ["" : 17]>'
_I64MAX = np.iinfo(np.int64).max


def _run(text: str, *inits, **kwargs):
    model = parse(f"{_HEAD}\n{text}", *inits)
    out, result = run_pass_and_compare(RemoveNoOpsPass(), model, **kwargs)
    return out, result


def test_identity_and_graph_outputs():
    out, result = _run("""
        g (float[2,3] x) => (float[2,3] y, float[2,3] z) {
            a = Identity(x)
            r = Relu(a)
            y = Identity(r)
            z = Identity(x)
        }
        """)  # fmt: skip
    assert result.changes.counts == {"removed Identity": 2}
    assert op_types(out) == ["Relu", "Identity"]  # z = Identity(x) links an input to an output: kept
    assert [o.name for o in out.graph.outputs] == ["y", "z"]
    relu = next(iter(out.graph))
    assert relu.outputs[0].name == "y" and relu.inputs[0].name == "x"
    assert result.changes.misses == [
        "Identity -> 'z': its output 'z' is a graph output fed directly by 'x'; kept"
    ]


def test_dropout():
    model = parse("""
        <ir_version: 8, opset_import: ["" : 13]>
        g (float[2,3] x) => (float[2,3] y, float[2,3] y2, bool[2,3] m2) {
            r = Relu(x)
            d, unused_mask = Dropout(r)
            y = Sigmoid(d)
            y2, m2 = Dropout(r)
        }
        """)  # fmt: skip
    out, result = run_pass_and_compare(RemoveNoOpsPass(), model)
    assert result.changes.counts == {"removed Dropout": 1}
    assert op_types(out) == ["Relu", "Sigmoid", "Dropout"]
    assert result.changes.misses == ["Dropout -> 'y2': its mask output 'm2' is used; kept"]


def test_dropout_in_training_mode_is_kept():
    model = parse("""
        <ir_version: 8, opset_import: ["" : 13]>
        g (float[2,3] x) => (float[2,3] y) {
            d = Dropout(x, ratio, train)
            y = Relu(d)
        }
        """, ("ratio", np.float32(0.0)), ("train", np.array(True)))  # fmt: skip
    result = RemoveNoOpsPass()(to_ir(model))
    assert op_types(result.model) == ["Dropout", "Relu"] and result.changes.total == 0
    assert "training_mode is not a constant false" in result.changes.misses[0]


def test_cast_only_when_the_type_stays():
    out, result = _run("""
        g (float[2,3] x) => (float[2,3] y, int32[2,3] k, float[2,3] z) {
            a = Cast<to = 1>(x)
            y = Relu(a)
            k = Cast<to = 6>(x)
            s = Sigmoid(x)
            z = CastLike(s, x)
        }
        """)  # fmt: skip
    assert result.changes.counts == {
        "removed Cast to the same type": 1,
        "removed CastLike to the same type": 1,
    }
    assert op_types(out) == ["Relu", "Cast", "Sigmoid"]
    assert [o.name for o in out.graph.outputs] == ["y", "k", "z"]


def test_reshape_rules():
    out, result = _run(
        """
        g (float[2,3,4] x) => (float[2,3,4] a, float[2,3,4] b, float[6,4] c, float[24] d, float[24] e, float[6,4] f) {
            a = Reshape(x, same)
            b = Reshape(x, copy)
            c = Reshape(x, flat2)
            t = Reshape(x, flat2)
            d = Reshape(t, flat1)
            s = Reshape(x, flat2)
            e = Reshape(s, flat1)
            f = Relu(s)
        }
        """,
        ("same", np.array([2, 3, 4])),
        ("copy", np.array([0, 0, -1])),
        ("flat2", np.array([6, 4])),
        ("flat1", np.array([24])),
    )
    # a and b keep the shape but feed graph outputs straight from the input x: kept.
    assert result.changes.counts == {"removed Reshape before Reshape": 1}
    assert op_types(out).count("Reshape") == 6
    assert len(result.changes.misses) == 2


def test_reshape_same_shape_and_chain_inside_the_graph():
    out, result = _run(
        """
        g (float[2,3,4] x) => (float[2,3,4] y, float[24] z) {
            r = Relu(x)
            a = Reshape(r, same)
            b = Reshape(a, copy)
            y = Sigmoid(b)
            t = Reshape(r, flat2)
            z = Reshape(t, flat1)
        }
        """,
        ("same", np.array([2, 3, 4])),
        ("copy", np.array([0, 0, -1])),
        ("flat2", np.array([6, 4])),
        ("flat1", np.array([24])),
    )
    assert result.changes.counts == {
        "removed Reshape to the same shape": 2,  # a on r, then b on r
        "removed Reshape before Reshape": 1,  # t into z
        "removed constant left unused": 3,  # same, copy, flat2
    }
    assert op_types(out) == ["Relu", "Sigmoid", "Reshape"]


def test_reshape_with_zero_target_keeps_the_first_reshape():
    """Reshape(Reshape(x, [6,4]), [0, 2, 2]): the 0 copies a dim of the intermediate, so both stay."""
    out, result = _run(
        """
        g (float[2,3,4] x) => (float[6,2,2] y) {
            r = Relu(x)
            t = Reshape(r, flat2)
            y = Reshape(t, tgt)
        }
        """,
        ("flat2", np.array([6, 4])),
        ("tgt", np.array([0, 2, 2])),
    )
    assert result.changes.total == 0 and op_types(out) == ["Relu", "Reshape", "Reshape"]


def test_squeeze_unsqueeze_pairs_and_flatten():
    out, result = _run(
        """
        g (float[2,3] x, float[2,1,3] w) => (float[2,3] a, float[3,2,1] b, float[2,1,3] c, float[2,3] d, float[1,6] e) {
            r = Relu(x)
            u = Unsqueeze(r, ax0)
            a = Squeeze(u, ax0)
            u2 = Unsqueeze(w, ax0)
            s2 = Squeeze(u2, ax2)
            b = Transpose<perm = [2, 1, 0]>(s2)
            q = Squeeze(w, ax1)
            q2 = Relu(q)
            c = Unsqueeze(q2, axm2)
            f = Flatten<axis = 1>(r)
            d = Sigmoid(f)
            e = Flatten<axis = 0>(r)
        }
        """,
        ("ax0", np.array([0])),
        ("ax1", np.array([1])),
        ("ax2", np.array([2])),
        ("axm2", np.array([-2])),
    )
    assert result.changes.counts == {
        "removed Unsqueeze+Squeeze pair": 1,
        "removed Flatten of a matrix": 1,
    }
    # Unsqueeze(0)+Squeeze(2) moves the 1-dim, not a no-op; Squeeze then Relu then Unsqueeze
    # has a node between; Flatten axis 0 of [2,3] gives [1,6].
    assert op_types(out) == [
        "Relu",
        "Unsqueeze",
        "Squeeze",
        "Transpose",
        "Squeeze",
        "Relu",
        "Unsqueeze",
        "Sigmoid",
        "Flatten",
    ]


def test_squeeze_then_unsqueeze_cancels():
    out, result = _run(
        """
        g (float[2,1,3] w) => (float[2,1,3] y) {
            r = Relu(w)
            q = Squeeze(r, ax)
            c = Unsqueeze(q, ax)
            y = Sigmoid(c)
        }
        """,
        ("ax", np.array([-2])),
    )
    assert result.changes.counts == {"removed Squeeze+Unsqueeze pair": 1, "removed constant left unused": 1}
    assert op_types(out) == ["Relu", "Sigmoid"]


def test_pad_transpose_expand_concat_slice():
    out, result = _run(
        """
        g (float[2,3,4] x) => (float[2,3,4] y, float[2,4,3] t2, float[2,5,4] p2, float[2,2,3,4] e2, float[2,3,2] s2) {
            r = Relu(x)
            p = Pad(r, zeros)
            t = Transpose<perm = [0, 1, 2]>(p)
            e = Expand(t, ones)
            c = Concat<axis = 0>(e)
            s = Slice(c, st, en, axes)
            y = Sigmoid(s)
            t2 = Transpose<perm = [0, 2, 1]>(r)
            p2 = Pad(r, pads)
            e2 = Expand(r, big)
            s2 = Slice(r, st1, two, last)
        }
        """,
        ("zeros", np.zeros(6, np.int64)),
        ("pads", np.array([0, 1, 0, 0, 1, 0])),
        ("ones", np.array([1, 4])),
        ("big", np.array([2, 2, 3, 4])),
        ("st", np.array([0, 0])),
        ("en", np.array([_I64MAX, 3])),
        ("axes", np.array([2, 1])),
        ("st1", np.array([0])),
        ("two", np.array([2])),
        ("last", np.array([-1])),
    )
    assert result.changes.counts == {
        "removed Pad with zero pads": 1,
        "removed Transpose with identity perm": 1,
        "removed Expand to the same shape": 1,
        "removed Concat of one input": 1,
        "removed Slice of the whole tensor": 1,
        "removed constant left unused": 5,  # zeros, ones, st, en, axes
    }
    assert op_types(out) == ["Relu", "Sigmoid", "Transpose", "Pad", "Expand", "Slice"]


def test_arithmetic_identities_only_without_broadcasting():
    out, result = _run(
        """
        g (float[2,3,4] x, float[3] v) => (float[2,3,4] y, float[2,3] w, float[2,3,4] k, float[2,3,4] n) {
            r = Relu(x)
            a = Mul(r, one)
            b = Mul(one_c, a)
            c = Add(b, zero_full)
            d = Sub(c, zero)
            y = Div(d, one)
            w = Add(v, zero_2x3)
            k = Mul(r, two)
            n = Sub(zero, r)
        }
        """,
        ("one", np.float32(1.0)),
        ("one_c", np.ones((1, 3, 1), np.float32)),
        ("zero_full", np.zeros((2, 3, 4), np.float32)),
        ("zero", np.float32(0.0)),
        ("zero_2x3", np.zeros((2, 3), np.float32)),
        ("two", np.float32(2.0)),
    )
    assert result.changes.counts == {
        "removed Mul by 1": 2,
        "removed Add of 0": 1,
        "removed Sub of 0": 1,
        "removed Div by 1": 1,
        "removed constant left unused": 3,  # one, one_c, zero_full; 'zero' still feeds n
    }
    # v + zeros[2,3] broadcasts [3] to [2,3]; x*2 and 0-x are not identities
    assert op_types(out) == ["Relu", "Add", "Mul", "Sub"]
    assert next(iter(out.graph)).outputs[0].name == "y"  # Relu took the output's name


def test_graph_output_keeps_its_declared_shape():
    out, _ = _run(
        """
        g (float[N,3] x) => (float[N,3] y) {
            r = Relu(x)
            y = Mul(r, one)
        }
        """,
        ("one", np.float32(1.0)),
        shapes={"x": (5, 3)},
    )
    assert [o.name for o in out.graph.outputs] == ["y"]
    assert str(out.graph.outputs[0].shape[0]) == "N"


# ---------------------------------------------------------------- real models


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ppocr_det", {}),
        ("ppocr_rec", {"removed Mul by 1": 2, "removed constant left unused": 2}),
        ("ppocr_cls", {"removed Identity": 1}),
    ],
)
def test_ppocr(name, expected):
    model = ppocr_model(name)
    out, result = run_pass_and_compare(RemoveNoOpsPass(), model, feeds=ppocr_feeds(name))
    assert result.changes.counts == expected
    assert [o.name for o in out.graph.outputs] == [o.name for o in model.graph.output]


@pytest.mark.parametrize(
    ("case", "expected", "kept"),
    [
        ("test_identity", {}, ["Identity"]),  # graph input straight to graph output
        ("test_dropout_default_mask", {}, ["Dropout"]),  # the mask is a graph output
        ("test_reshape_reordered_all_dims", {}, ["Reshape"]),  # the target shape is an input
        # the expanded LayerNormalization casts the float input to float: removed
        ("test_layer_normalization_4d_axis1_expanded", {"removed Cast to the same type": 3}, None),
    ],
)
def test_backend_node_cases(case, expected, kept):
    model, feeds, reference = node_case(case)
    out, result = check_reference(RemoveNoOpsPass(), model, feeds, reference)
    assert result.changes.counts == expected
    if kept is not None:
        assert op_types(out) == kept


def test_subgraphs():
    """Inside a branch: an Identity after a local node goes (the node takes the branch output's name);
    one that forwards an outer value to the branch output stays."""
    model = parse(f"""
        {_HEAD}
        g (float[3] x, bool c) => (float[3] y) {{
            y = If(c) <then_branch = t () => (float[3] p) {{
                n = Neg(x)
                p = Identity(n)
            }}, else_branch = e () => (float[3] q) {{
                q = Identity(x)
            }}>
        }}
        """)  # fmt: skip
    for cond in (True, False):
        feeds = {"x": np.arange(3, dtype=np.float32), "c": np.array(cond)}
        out, result = run_pass_and_compare(RemoveNoOpsPass(), model, feeds=feeds)
    assert result.changes.counts == {"removed Identity": 1}
    branches = out.graph.node(0).attributes
    then_nodes = list(branches["then_branch"].as_graph())
    assert [n.op_type for n in then_nodes] == ["Neg"] and then_nodes[0].outputs[0].name == "p"
    assert [n.op_type for n in branches["else_branch"].as_graph()] == ["Identity"]
    assert result.changes.misses == [
        "Identity -> 'q': its output 'q' is a graph output fed directly by 'x'; kept"
    ]
