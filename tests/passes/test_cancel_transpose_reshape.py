"""Tests for cancel-transpose-reshape: Transpose pairs, Reshape chains, Flatten+Reshape, size-1 Transposes."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from tests.helpers import op_types, parse, run_pass_and_compare
from zonnx.passes.fusion.transpose_reshape import CancelTransposeReshapePass


class _Shuffles(nn.Module):
    """Reshape chains, a Flatten followed by view, and reshapes back to the input's shape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x.reshape(2, 3, 16).reshape(2, 48)
        w = torch.flatten(x * 2, 1).view(2, 48)
        v = z.reshape(2, 3, 4, 4) + w.reshape(2, 3, 4, 4)
        return v.permute(0, 2, 3, 1)


@pytest.fixture(scope="module")
def shuffles(tmp_path_factory) -> onnx.ModelProto:
    path = tmp_path_factory.mktemp("tr") / "shuffles.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _Shuffles(),
            (torch.randn(2, 3, 4, 4),),
            str(path),
            dynamo=False,
            opset_version=13,
            do_constant_folding=False,
        )
    return onnx.load(str(path))


def test_torch_reshape_chains_cancel(shuffles):
    assert op_types(shuffles).count("Reshape") == 5
    model, result = run_pass_and_compare(CancelTransposeReshapePass(), shuffles)
    assert result.changes.counts == {
        "merged Reshape pair": 1,
        "cancelled Reshape+Reshape pair": 1,
        "removed Reshape after Flatten": 1,
        "cancelled Flatten+Reshape pair": 1,
    }
    assert [op for op in op_types(model) if op != "Constant"] == ["Mul", "Add", "Transpose"]
    assert [o.name for o in model.graph.outputs] == [o.name for o in shuffles.graph.output]


def _run(text: str, *inits):
    return run_pass_and_compare(CancelTransposeReshapePass(), parse(text, *inits))


def test_transpose_pair_composes_perm():
    model, result = _run("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3, 4, 5] x) => (float[2, 4, 3, 5] y) {
      t = Transpose <perm = [0, 2, 3, 1]> (x)
      y = Transpose <perm = [0, 1, 3, 2]> (t)
    }
    """)
    assert result.changes.counts == {"merged Transpose pair": 1}
    assert op_types(model) == ["Transpose"]
    assert list(model.graph.node(0).attributes.get_ints("perm")) == [0, 2, 1, 3]
    assert model.graph.outputs[0].name == "y"


def test_inverse_transposes_cancel_and_keep_the_output_name():
    model, result = _run("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3, 4, 5] x) => (float[2, 3, 4, 5] y) {
      r = Relu(x)
      t = Transpose <perm = [0, 2, 3, 1]> (r)
      y = Transpose <perm = [0, 3, 1, 2]> (t)
    }
    """)
    assert result.changes.counts == {"cancelled Transpose pair": 1}
    assert op_types(model) == ["Relu"]
    assert model.graph.outputs[0].name == "y"


def test_transpose_read_elsewhere_is_not_merged_unless_it_cancels():
    model, result = _run("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3, 4] x) => (float[3, 2, 4] y, float[2, 3, 4] z, float[4, 3, 2] t) {
      t = Transpose <perm = [2, 1, 0]> (x)
      y = Transpose <perm = [1, 2, 0]> (t)
      z = Transpose(t)
    }
    """)
    # z = Transpose(Transpose(x)) with reversed perms cancels; y would need t, which is an output anyway
    assert result.changes.counts == {"cancelled Transpose pair": 1}
    assert op_types(model) == ["Transpose", "Transpose", "Identity"]
    assert any("t is also a graph output" in m for m in result.changes.misses)


def test_reshape_chain_resolves_zero_from_the_middle_shape():
    model, result = _run(
        """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3, 4] x) => (float[6, 2, 2] y) {
      m = Reshape(x, s1)
      y = Reshape(m, s2)
    }
    """,
        ("s1", np.array([6, 4], np.int64)),
        ("s2", np.array([0, 2, -1], np.int64)),
    )
    assert result.changes.counts == {"merged Reshape pair": 1}
    assert op_types(model) == ["Reshape"]
    np.testing.assert_array_equal(model.graph.node(0).inputs[1].const_value.numpy(), [6, 2, -1])
    assert model.graph.node(0).inputs[0].name == "x"


def test_reshape_chain_with_middle_read_elsewhere_is_kept():
    model, result = _run(
        """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3, 4] x) => (float[24] y, float[6, 4] m) {
      m = Reshape(x, s1)
      y = Reshape(m, s2)
    }
    """,
        ("s1", np.array([6, 4], np.int64)),
        ("s2", np.array([-1], np.int64)),
    )
    assert result.changes.total == 0
    assert op_types(model) == ["Reshape", "Reshape"]
    assert any("m is also a graph output" in m for m in result.changes.misses)


def test_flatten_then_reshape_to_other_shape_merges():
    model, result = _run(
        """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3, 4] x) => (float[4, 6] y) {
      f = Flatten(x)
      y = Reshape(f, s)
    }
    """,
        ("s", np.array([4, 6], np.int64)),
    )
    assert result.changes.counts == {"merged Flatten+Reshape": 1}
    assert op_types(model) == ["Reshape"]


def test_size_one_transpose_is_absorbed_into_reshape():
    model, result = _run(
        """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 1, 3, 1] x) => (float[6] y, float[3, 2, 1] z) {
      t = Transpose <perm = [1, 0, 3, 2]> (x)
      y = Reshape(t, s)
      r = Reshape(x, s2)
      z = Transpose <perm = [0, 2, 1]> (r)
    }
    """,
        ("s", np.array([6], np.int64)),
        ("s2", np.array([3, 1, 2], np.int64)),
    )
    assert result.changes.counts == {"absorbed Transpose into Reshape": 2}
    assert op_types(model) == ["Reshape", "Reshape"]


def test_data_moving_transpose_is_not_absorbed():
    model, result = _run(
        """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3] x) => (float[6] y) {
      t = Transpose <perm = [1, 0]> (x)
      y = Reshape(t, s)
    }
    """,
        ("s", np.array([6], np.int64)),
    )
    assert result.changes.total == 0
    assert op_types(model) == ["Transpose", "Reshape"]


def test_unknown_dims_are_left_alone():
    model, result = run_pass_and_compare(
        CancelTransposeReshapePass(),
        parse(
            """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[N, 3, 4] x) => (float[M, 2, 2] y) {
      m = Reshape(x, s1)
      y = Reshape(m, s2)
    }
    """,
            ("s1", np.array([-1, 4], np.int64)),
            ("s2", np.array([0, 2, 2], np.int64)),
        ),
        shapes={"x": (2, 3, 4)},
    )
    assert result.changes.total == 0
    assert any("not static" in m for m in result.changes.misses)
