"""Tests for fuse-layernorm: torch's decomposed LayerNorm and hand-written variants, and what must not fuse."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnx.version_converter
import pytest
import torch
from torch import nn

from tests.helpers import op_types, parse, run_pass_and_compare
from zonnx.passes.fusion.layernorm import FuseLayerNormPass


class _Block(nn.Module):
    """Pre-norm MLP block with a final norm: two nn.LayerNorm (one over two dims), GELU between Linears."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(16)
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(32, 16)
        self.ln2 = nn.LayerNorm([5, 16], eps=1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln2(x + self.fc2(self.act(self.fc1(self.ln1(x)))))


@pytest.fixture(scope="module")
def block(tmp_path_factory) -> dict[int, onnx.ModelProto]:
    """The block exported by torch's legacy exporter at opset 13, and converted to opsets 17 and 18."""
    torch.manual_seed(0)
    m = _Block().eval()
    with torch.no_grad():
        for ln in (m.ln1, m.ln2):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-0.5, 0.5)
    path = tmp_path_factory.mktemp("ln") / "block.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            m, (torch.randn(2, 5, 16),), str(path), dynamo=False, opset_version=13, do_constant_folding=False
        )
    base = onnx.load(str(path))
    return {13: base, **{v: onnx.version_converter.convert_version(base, v) for v in (17, 18)}}


@pytest.mark.parametrize("opset", [17, 18])
def test_fuses_torch_layernorms(block, opset):
    model, result = run_pass_and_compare(FuseLayerNormPass(), block[opset])
    assert result.changes.counts == {"fused LayerNormalization": 2}
    ops = op_types(model)
    assert ops.count("LayerNormalization") == 2
    assert "ReduceMean" not in ops and "Sqrt" not in ops and "Pow" not in ops
    lns = [n for n in model.graph if n.op_type == "LayerNormalization"]
    assert [n.attributes.get_int("axis") for n in lns] == [-1, -2]
    assert lns[1].attributes.get_float("epsilon") == pytest.approx(1e-3)
    assert lns[1].inputs[1].const_value.numpy().shape == (5, 16)
    assert [o.name for o in model.graph.outputs] == [o.name for o in block[opset].graph.output]


def test_below_opset_17_is_a_miss(block):
    model, result = run_pass_and_compare(FuseLayerNormPass(), block[13])
    assert result.changes.total == 0
    assert "LayerNormalization" not in op_types(model)
    assert len(result.changes.misses) == 2
    assert all("LayerNormalization needs opset 17; model is at opset 13" in m for m in result.changes.misses)


_GAMMA = np.linspace(0.5, 1.5, 8, dtype=np.float32)
_BETA = np.linspace(-1.0, 1.0, 8, dtype=np.float32)
_CONSTS = (
    ("two", np.array(2.0, np.float32)),
    ("eps", np.array(1e-5, np.float32)),
    ("one", np.array(1.0, np.float32)),
)


def _model(body: str, *extra, opset: int = 17, x: str = "float[2, 3, 8] x", y: str = "float[2, 3, 8] y"):
    text = f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    g ({x}) => ({y}) {{
      {body}
    }}
    """
    return parse(text, *_CONSTS, ("gamma", _GAMMA), ("beta", _BETA), *extra)


_STATS = """
      mean = ReduceMean <axes = [-1]> (x)
      d = Sub(x, mean)
      sq = Pow(d, two)
      var = ReduceMean <axes = [-1]> (sq)
      ve = Add(var, eps)
      sd = Sqrt(ve)
"""

_VARIANTS = {
    # Mul by Reciprocal, no gamma or beta
    "reciprocal": _STATS + "r = Reciprocal(sd)\n y = Mul(d, r)",
    # Div(1, std) as the reciprocal, gamma only, operands swapped
    "one_over": _STATS + "r = Div(one, sd)\n n = Mul(r, d)\n y = Mul(gamma, n)",
    # x - mean computed twice, square as Mul(d, d), eps on the left, beta only
    "recomputed": """
      mean = ReduceMean <axes = [2]> (x)
      d = Sub(x, mean)
      sq = Mul(d, d)
      var = ReduceMean <axes = [2]> (sq)
      ve = Add(eps, var)
      sd = Sqrt(ve)
      d2 = Sub(x, mean)
      n = Div(d2, sd)
      y = Add(n, beta)
    """,
}


@pytest.mark.parametrize("variant", sorted(_VARIANTS))
def test_variants_fuse(variant):
    model, result = run_pass_and_compare(FuseLayerNormPass(), _model(_VARIANTS[variant]))
    assert result.changes.counts == {"fused LayerNormalization": 1}
    assert op_types(model) == ["LayerNormalization"]
    assert model.graph.outputs[0].name == "y"


def test_axes_as_input_at_opset_18():
    body = _STATS.replace("ReduceMean <axes = [-1]> (x)", "ReduceMean(x, axes)").replace(
        "ReduceMean <axes = [-1]> (sq)", "ReduceMean(sq, axes)"
    )
    proto = _model(
        body + "n = Div(d, sd)\n g1 = Mul(n, gamma)\n y = Add(g1, beta)", ("axes", np.array([-1])), opset=18
    )
    model, result = run_pass_and_compare(FuseLayerNormPass(), proto)
    assert result.changes.counts == {"fused LayerNormalization": 1}
    assert op_types(model) == ["LayerNormalization"]
    assert "axes" not in model.graph.initializers and "two" not in model.graph.initializers


def test_non_trailing_axes_are_not_fused():
    body = _STATS.replace("[-1]", "[1]") + "y = Div(d, sd)"
    model, result = run_pass_and_compare(FuseLayerNormPass(), _model(body))
    assert result.changes.total == 0
    assert "LayerNormalization" not in op_types(model)
    assert any("not the trailing dims" in m for m in result.changes.misses)


def test_wrong_exponent_is_not_fused():
    proto = _model(_STATS + "y = Div(d, sd)")
    proto.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.array(3.0, np.float32), "two"))
    model, result = run_pass_and_compare(FuseLayerNormPass(), proto)
    assert result.changes.total == 0
    assert op_types(model).count("ReduceMean") == 2
    assert any("raises to 3.0, not 2" in m for m in result.changes.misses)


def test_intermediate_read_elsewhere_is_not_fused():
    proto = _model(_STATS + "y = Div(d, sd)", x="float[2, 3, 8] x", y="float[2, 3, 8] y, float[2, 3, 1] var")
    model, result = run_pass_and_compare(FuseLayerNormPass(), proto)
    assert result.changes.total == 0
    assert any("var is also a graph output" in m for m in result.changes.misses)


def test_gamma_varying_outside_the_normalized_dims_stays_a_mul():
    g3 = np.array([[0.5], [1.0], [2.0]], np.float32)  # varies along axis 1, which is not normalized
    proto = _model(_STATS + "n = Div(d, sd)\n g1 = Mul(n, g3)\n y = Add(g1, beta)", ("g3", g3))
    model, result = run_pass_and_compare(FuseLayerNormPass(), proto)
    assert result.changes.counts == {"fused LayerNormalization": 1}
    assert op_types(model) == ["LayerNormalization", "Mul", "Add"]
