"""Tests for fold-batchnorm: folds into Conv/ConvTranspose/Gemm/MatMul, Mul+Add fallback, and refusals."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from tests.helpers import op_types, parse, run_pass_and_compare
from zonnx.passes.fusion.batchnorm import FoldBatchNormPass


def _randomize_bn(bn: nn.modules.batchnorm._BatchNorm) -> None:
    """Give a BatchNorm non-trivial statistics so a wrong fold shows up in the numbers."""
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2.0)
        bn.bias.uniform_(-1.0, 1.0)
        bn.running_mean.uniform_(-1.0, 1.0)
        bn.running_var.uniform_(0.2, 3.0)


def _export(module: nn.Module, x: torch.Tensor, path) -> onnx.ModelProto:
    torch.manual_seed(0)
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            _randomize_bn(m)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(), (x,), str(path), dynamo=False, opset_version=13, do_constant_folding=False
        )
    return onnx.load(str(path))


@pytest.fixture(scope="module")
def torch_models(tmp_path_factory) -> dict[str, onnx.ModelProto]:
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("bn")
    return {
        "conv": _export(
            nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8)),
            torch.randn(2, 3, 9, 9),
            d / "c.onnx",
        ),
        "conv_bias": _export(
            nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()),
            torch.randn(1, 3, 9, 9),
            d / "cb.onnx",
        ),
        "convt_groups": _export(
            nn.Sequential(nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2), nn.BatchNorm2d(6)),
            torch.randn(1, 4, 5, 5),
            d / "ct.onnx",
        ),
        "linear": _export(nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6)), torch.randn(4, 8), d / "l.onnx"),
    }


def _count(model, op: str) -> int:
    return op_types(model).count(op)


@pytest.mark.parametrize(
    ("name", "producer", "key"),
    [
        ("conv", "Conv", "folded Conv+BatchNormalization"),
        ("conv_bias", "Conv", "folded Conv+BatchNormalization"),
        ("convt_groups", "ConvTranspose", "folded ConvTranspose+BatchNormalization"),
        ("linear", "Gemm", "folded Gemm+BatchNormalization"),
    ],
)
def test_folds_torch_models(torch_models, name, producer, key):
    model, result = run_pass_and_compare(FoldBatchNormPass(), torch_models[name])
    assert result.changes.counts == {key: 1}
    assert _count(model, "BatchNormalization") == 0
    assert _count(model, producer) == 1
    assert _count(model, "Mul") == _count(model, "Add") == 0
    # the graph output keeps its name
    assert [o.name for o in model.graph.outputs] == [o.name for o in torch_models[name].graph.output]


def test_old_weights_are_removed(torch_models):
    model, _ = run_pass_and_compare(FoldBatchNormPass(), torch_models["conv"])
    names = set(model.graph.initializers)
    assert "0.weight" not in names
    assert not any(n.startswith("1.running") for n in names)


_MATMUL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 4] x) => (float[N, 3] y) {
  h = MatMul(x, W)
  y = BatchNormalization(h, s, b, m, v)
}
"""

_BN_PARAMS = (
    ("s", np.array([1.5, 0.5, 2.0], np.float32)),
    ("b", np.array([0.1, -0.2, 0.3], np.float32)),
    ("m", np.array([0.5, -1.0, 0.25], np.float32)),
    ("v", np.array([0.8, 1.7, 0.3], np.float32)),
)


def test_matmul_2d_folds_into_weight_and_add():
    w = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    model, result = run_pass_and_compare(
        FoldBatchNormPass(), parse(_MATMUL, ("W", w), *_BN_PARAMS), shapes={"x": (5, 4)}
    )
    assert result.changes.counts == {"folded MatMul+BatchNormalization": 1}
    assert op_types(model) == ["MatMul", "Add"]
    assert model.graph.outputs[0].name == "y"


def test_matmul_rank3_is_not_folded_and_says_why():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3, 4] x) => (float[2, 3, 3] y) {
      h = MatMul(x, W)
      y = BatchNormalization(h, s, b, m, v)
    }
    """
    w = np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32)
    model, result = run_pass_and_compare(FoldBatchNormPass(), parse(text, ("W", w), *_BN_PARAMS))
    assert result.changes.counts == {"BatchNormalization to Mul+Add": 1}
    assert op_types(model) == ["MatMul", "Mul", "Add"]
    assert any("rank 3" in m for m in result.changes.misses)


_SHARED = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 3, 6, 6] x) => (float[1, 3, 4, 4] y1, float[1, 3, 4, 4] y2) {
  c1 = Conv <pads = [0, 0, 0, 0]> (x, W)
  y1 = BatchNormalization(c1, s, b, m, v)
  c2 = Conv(x, W)
  y2 = BatchNormalization(c2, s, b, m, v)
}
"""


def test_shared_weight_is_not_folded():
    w = np.random.default_rng(3).standard_normal((3, 3, 3, 3)).astype(np.float32)
    proto = parse(_SHARED, ("W", w), *_BN_PARAMS)
    model, result = run_pass_and_compare(FoldBatchNormPass(), proto)
    assert result.changes.counts == {"BatchNormalization to Mul+Add": 2}
    assert "folded Conv+BatchNormalization" not in result.changes.counts
    np.testing.assert_array_equal(model.graph.initializers["W"].const_value.numpy(), w)
    assert any("W is also used by" in m for m in result.changes.misses)
    assert [o.name for o in model.graph.outputs] == ["y1", "y2"]


def test_conv_output_read_twice_is_not_folded():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 3, 6, 6] x) => (float[1, 3, 4, 4] y, float[1, 3, 4, 4] z) {
      c = Conv(x, W)
      y = BatchNormalization(c, s, b, m, v)
      z = Relu(c)
    }
    """
    w = np.random.default_rng(4).standard_normal((3, 3, 3, 3)).astype(np.float32)
    model, result = run_pass_and_compare(FoldBatchNormPass(), parse(text, ("W", w), *_BN_PARAMS))
    assert "folded Conv+BatchNormalization" not in result.changes.counts
    assert op_types(model).count("Conv") == 1
    assert any("is also used by" in m and "Relu" in m for m in result.changes.misses)


def test_constant_node_weight_folds():
    w = np.random.default_rng(5).standard_normal((3, 2, 3, 3)).astype(np.float32)
    literal = ", ".join(f"{v:.6f}" for v in w.ravel())
    text = f"""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 2, 6, 6] x) => (float[1, 3, 4, 4] y) {{
      W = Constant <value = float[3, 2, 3, 3] {{{literal}}}> ()
      c = Conv(x, W)
      y = BatchNormalization(c, s, b, m, v)
    }}
    """
    model, result = run_pass_and_compare(FoldBatchNormPass(), parse(text, *_BN_PARAMS))
    assert result.changes.counts == {"folded Conv+BatchNormalization": 1}
    assert op_types(model) == ["Conv"]


def test_standalone_batchnorm_becomes_mul_add():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3, 5] x) => (float[2, 3, 5] y) {
      y = BatchNormalization <epsilon = 0.01> (x, s, b, m, v)
    }
    """
    model, result = run_pass_and_compare(FoldBatchNormPass(), parse(text, *_BN_PARAMS))
    assert result.changes.counts == {"BatchNormalization to Mul+Add": 1}
    assert op_types(model) == ["Mul", "Add"]
    assert model.graph.outputs[0].name == "y"
    mul = model.graph.node(0)
    assert mul.inputs[1].const_value.numpy().shape == (3, 1)


def test_training_mode_is_left_alone():
    text = """
    <ir_version: 8, opset_import: ["" : 15]>
    g (float[4, 3] x) => (float[4, 3] y, float[3] rm, float[3] rv) {
      y, rm, rv = BatchNormalization <training_mode = 1> (x, s, b, m, v)
    }
    """
    model, result = run_pass_and_compare(FoldBatchNormPass(), parse(text, *_BN_PARAMS))
    assert result.changes.total == 0
    assert op_types(model) == ["BatchNormalization"]
    assert any("training_mode=1" in m for m in result.changes.misses)


_CONV_ADD_BN = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 2, 6, 6] x) => (float[1, 3, 4, 4] y) {
  c = Conv(x, W)
  a = Add(e, c)
  y = BatchNormalization(a, s, b, m, v)
}
"""


def test_bias_add_between_conv_and_batchnorm_is_folded():
    w = np.random.default_rng(6).standard_normal((3, 2, 3, 3)).astype(np.float32)
    e = np.array([0.5, -1.0, 2.0], np.float32).reshape(1, 3, 1, 1)
    model, result = run_pass_and_compare(
        FoldBatchNormPass(), parse(_CONV_ADD_BN, ("W", w), ("e", e), *_BN_PARAMS)
    )
    assert result.changes.counts == {"folded Conv+BatchNormalization": 1}
    assert op_types(model) == ["Conv"]


def test_add_that_is_not_per_channel_blocks_the_fold():
    w = np.random.default_rng(7).standard_normal((3, 2, 3, 3)).astype(np.float32)
    e = np.linspace(-1, 1, 4, dtype=np.float32)  # broadcasts along the last axis, not the channels
    model, result = run_pass_and_compare(
        FoldBatchNormPass(), parse(_CONV_ADD_BN, ("W", w), ("e", e), *_BN_PARAMS)
    )
    assert result.changes.counts == {"BatchNormalization to Mul+Add": 1}
    assert op_types(model) == ["Conv", "Add", "Mul", "Add"]
    assert any("is not a per-channel float vector" in m for m in result.changes.misses)
