"""Tests for fuse-gelu: torch's erf and tanh GELU, other arrangements, contrib ops below opset 20, refusals."""

from __future__ import annotations

import math
import warnings

import numpy as np
import onnx
import onnx.version_converter
import pytest
import torch
from torch import nn

from tests.helpers import op_types, parse, run_pass_and_compare
from zonnx.passes.fusion.gelu import FuseGeluPass


@pytest.fixture(scope="module")
def mlps(tmp_path_factory) -> dict[tuple[str, int], onnx.ModelProto]:
    """Linear -> GELU -> Linear exported at opset 13 (erf and tanh GELU), and converted to opset 20."""
    d = tmp_path_factory.mktemp("gelu")
    out = {}
    for approx in ("none", "tanh"):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), nn.GELU(approximate=approx), nn.Linear(16, 4)).eval()
        path = d / f"{approx}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                m,
                (torch.randn(3, 8) * 3,),
                str(path),
                dynamo=False,
                opset_version=13,
                do_constant_folding=False,
            )
        out[approx, 13] = onnx.load(str(path))
        out[approx, 20] = onnx.version_converter.convert_version(out[approx, 13], 20)
    return out


@pytest.mark.parametrize(
    ("approx", "opset", "key", "op", "domain"),
    [
        ("none", 13, "fused erf GELU into com.microsoft::Gelu", "Gelu", "com.microsoft"),
        ("tanh", 13, "fused tanh GELU into com.microsoft::FastGelu", "FastGelu", "com.microsoft"),
        ("none", 20, "fused erf GELU into Gelu", "Gelu", ""),
        ("tanh", 20, "fused tanh GELU into Gelu", "Gelu", ""),
    ],
)
def test_fuses_torch_gelu(mlps, approx, opset, key, op, domain):
    model, result = run_pass_and_compare(FuseGeluPass(), mlps[approx, opset])
    assert result.changes.counts == {key: 1}
    gelus = [n for n in model.graph if n.op_type == op]
    assert len(gelus) == 1 and gelus[0].domain == domain
    assert not {"Erf", "Tanh", "Pow"} & set(op_types(model))
    if domain:
        assert model.opset_imports["com.microsoft"] == 1
    else:
        assert "com.microsoft" not in model.opset_imports
        assert gelus[0].attributes.get_string("approximate", "none") == approx


def test_contrib_not_allowed_is_a_miss(mlps):
    model, result = run_pass_and_compare(FuseGeluPass(allow_contrib=False), mlps["none", 13])
    assert result.changes.total == 0
    assert "Erf" in op_types(model)
    assert result.changes.misses and "needs opset 20; model is at opset 13" in result.changes.misses[0]


_SQRT2 = np.array(math.sqrt(2.0), np.float32)
_CONSTS = (
    ("half", np.array(0.5, np.float32)),
    ("one", np.array(1.0, np.float32)),
    ("two", np.array(2.0, np.float32)),
    ("three", np.array(3.0, np.float32)),
    ("inv_sqrt2", np.array(1 / math.sqrt(2.0), np.float32)),
    ("k", np.array(0.044715, np.float32)),
    ("c", np.array(math.sqrt(2 / math.pi), np.float32)),
)


def _model(body: str, sqrt2: np.ndarray = _SQRT2, opset: int = 20, outputs: str = "float[4, 6] y"):
    text = f"""
    <ir_version: 9, opset_import: ["" : {opset}]>
    g (float[4, 6] x) => ({outputs}) {{
      {body}
    }}
    """
    return parse(text, *_CONSTS, ("sqrt2", sqrt2))


_ERF_TAILS = {
    "mul_inv_sqrt2_half_first": "t = Mul(inv_sqrt2, x)\n e = Erf(t)\n a = Add(one, e)\n h = Mul(a, half)\n y = Mul(x, h)",
    "half_of_x": "t = Div(x, sqrt2)\n e = Erf(t)\n a = Add(e, one)\n hx = Mul(half, x)\n y = Mul(a, hx)",
    "div_by_two": "t = Div(x, sqrt2)\n e = Erf(t)\n a = Add(e, one)\n m = Mul(a, x)\n y = Div(m, two)",
}

_TANH = """
      p = Pow(x, three)
      kp = Mul(k, p)
      u = Add(kp, x)
      s = Mul(u, c)
      th = Tanh(s)
      a = Add(th, one)
      hx = Mul(x, half)
      y = Mul(hx, a)
"""


@pytest.mark.parametrize("name", sorted(_ERF_TAILS))
def test_erf_arrangements_fuse(name):
    model, result = run_pass_and_compare(FuseGeluPass(), _model(_ERF_TAILS[name]))
    assert result.changes.counts == {"fused erf GELU into Gelu": 1}
    assert op_types(model) == ["Gelu"]
    assert model.graph.outputs[0].name == "y"
    assert "one" not in model.graph.initializers  # the constants of the pattern are gone


def test_tanh_with_pow_fuses():
    model, result = run_pass_and_compare(FuseGeluPass(), _model(_TANH))
    assert result.changes.counts == {"fused tanh GELU into Gelu": 1}
    assert op_types(model) == ["Gelu"]


def test_wrong_scale_is_not_fused():
    model, result = run_pass_and_compare(
        FuseGeluPass(), _model(_ERF_TAILS["div_by_two"], sqrt2=np.array(1.5, np.float32))
    )
    assert result.changes.total == 0
    assert "Erf" in op_types(model)
    assert any("the scale of x is 1.5, not 1.41421356" in m for m in result.changes.misses)


def test_slightly_wrong_tanh_coefficient_is_not_fused():
    proto = _model(_TANH)
    for t in proto.graph.initializer:
        if t.name == "k":
            t.CopyFrom(onnx.numpy_helper.from_array(np.array(0.0447, np.float32), "k"))
    model, result = run_pass_and_compare(FuseGeluPass(), proto)
    assert result.changes.total == 0
    assert any("the cubic coefficient" in m for m in result.changes.misses)


def test_erf_output_read_elsewhere_is_not_fused():
    proto = _model(_ERF_TAILS["div_by_two"], outputs="float[4, 6] y, float[4, 6] e")
    model, result = run_pass_and_compare(FuseGeluPass(), proto)
    assert result.changes.total == 0
    assert any("e is also a graph output" in m for m in result.changes.misses)


def test_opset_17_without_contrib_names_the_opset():
    proto = _model(_TANH, opset=17)
    model, result = run_pass_and_compare(FuseGeluPass(target_opset=17, allow_contrib=False), proto)
    assert result.changes.total == 0
    assert any("model is at opset 17" in m for m in result.changes.misses)
