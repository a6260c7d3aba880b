"""Tests for canonicalize-gemm: MatMul+Add to Gemm, attribute folding, Add into C, and what is kept."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from tests.helpers import op_types, parse, run_pass_and_compare
from zonnx.passes.catalog import make_pass
from zonnx.passes.fusion.gemm import CanonicalizeGemmPass


def _export(module: nn.Module, x: torch.Tensor, path, fold: bool) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(), (x,), str(path), dynamo=False, opset_version=13, do_constant_folding=fold
        )
    return onnx.load(str(path))


@pytest.fixture(scope="module")
def torch_models(tmp_path_factory) -> dict[str, onnx.ModelProto]:
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("gemm")
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return {
        "mlp_2d": _export(mlp, torch.randn(3, 8), d / "mlp2.onnx", fold=False),
        # constant folding turns the exporter's Transpose(weight) into a constant [K, N] weight
        "mlp_3d": _export(mlp, torch.randn(2, 3, 8), d / "mlp3.onnx", fold=True),
    }


def _attrs(node) -> dict:
    return {k: v.value for k, v in node.attributes.items()}


def test_torch_linear_weights_are_stored_k_by_n(torch_models):
    model, result = run_pass_and_compare(CanonicalizeGemmPass(), torch_models["mlp_2d"])
    assert result.changes.counts == {"folded transB into Gemm weight": 2}
    gemms = [n for n in model.graph if n.op_type == "Gemm"]
    assert [g.inputs[1].const_value.numpy().shape for g in gemms] == [(8, 16), (16, 4)]
    assert all(_attrs(g).get("transB", 0) == 0 for g in gemms)
    assert "0.weight" not in model.graph.initializers  # the transposed original is gone


def test_rank3_matmul_add_is_kept_with_a_reason(torch_models):
    model, result = run_pass_and_compare(CanonicalizeGemmPass(), torch_models["mlp_3d"])
    assert result.changes.total == 0
    assert op_types(model).count("MatMul") == 2 and "Gemm" not in op_types(model)
    assert len(result.changes.misses) == 2
    assert all("has rank 3 and Gemm takes 2-D inputs" in m for m in result.changes.misses)


_RNG = np.random.default_rng(0)
_W = _RNG.standard_normal((6, 5)).astype(np.float32)  # [K, N]
_B = _RNG.standard_normal(5).astype(np.float32)


def test_matmul_add_becomes_gemm():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[N, 6] x) => (float[N, 5] y) {
      h = MatMul(x, W)
      y = Add(b, h)
    }
    """
    model, result = run_pass_and_compare(
        CanonicalizeGemmPass(), parse(text, ("W", _W), ("b", _B)), shapes={"x": (4, 6)}
    )
    assert result.changes.counts == {"fused MatMul+Add into Gemm": 1}
    assert op_types(model) == ["Gemm"]
    assert model.graph.outputs[0].name == "y"
    assert _attrs(model.graph.node(0)) == {}


def test_matmul_read_twice_is_kept():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[4, 6] x) => (float[4, 5] y, float[4, 5] h) {
      h = MatMul(x, W)
      y = Add(h, b)
    }
    """
    model, result = run_pass_and_compare(CanonicalizeGemmPass(), parse(text, ("W", _W), ("b", _B)))
    assert result.changes.total == 0
    assert op_types(model) == ["MatMul", "Add"]
    assert any("h is also a graph output" in m for m in result.changes.misses)


def test_alpha_beta_trans_b_are_folded():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[4, 6] x) => (float[4, 5] y) {
      y = Gemm <alpha = 2.0, beta = 0.5, transB = 1> (x, Wt, c)
    }
    """
    proto = parse(text, ("Wt", _W.T.copy()), ("c", _B.reshape(1, 5)))
    model, result = run_pass_and_compare(CanonicalizeGemmPass(), proto)
    assert result.changes.counts == {
        "folded transB into Gemm weight": 1,
        "folded alpha into Gemm weight": 1,
        "folded beta into Gemm bias": 1,
    }
    gemm = model.graph.node(0)
    assert _attrs(gemm) == {}
    np.testing.assert_allclose(gemm.inputs[1].const_value.numpy(), 2 * _W, rtol=1e-6)
    np.testing.assert_allclose(gemm.inputs[2].const_value.numpy(), 0.5 * _B.reshape(1, 5), rtol=1e-6)


def test_trans_a_on_activation_and_shared_weight_are_kept():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[6, 4] x) => (float[4, 5] y, float[4, 5] z) {
      y = Gemm <transA = 1, transB = 1> (x, Wt)
      z = Gemm <transA = 1, transB = 1> (x, Wt)
    }
    """
    model, result = run_pass_and_compare(CanonicalizeGemmPass(), parse(text, ("Wt", _W.T.copy())))
    assert result.changes.total == 0
    misses = " | ".join(result.changes.misses)
    assert "transA=1 kept: A (x) is not constant" in misses
    assert "transB=1 kept: Wt is also used by" in misses


def test_add_after_gemm_goes_into_c():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[4, 6] x) => (float[4, 5] y) {
      h = Gemm <beta = 2.0> (x, W, c)
      y = Add(h, k)
    }
    """
    k = np.linspace(-1, 1, 5, dtype=np.float32)
    model, result = run_pass_and_compare(CanonicalizeGemmPass(), parse(text, ("W", _W), ("c", _B), ("k", k)))
    assert result.changes.counts == {"folded beta into Gemm bias": 1, "folded Add into Gemm bias": 1}
    assert op_types(model) == ["Gemm"]
    assert model.graph.outputs[0].name == "y"
    np.testing.assert_allclose(model.graph.node(0).inputs[2].const_value.numpy(), 2 * _B + k, rtol=1e-6)


def test_add_that_would_grow_the_output_is_kept():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[4, 6] x) => (float[2, 4, 5] y) {
      h = Gemm(x, W)
      y = Add(h, k)
    }
    """
    k = np.ones((2, 1, 5), np.float32)
    model, result = run_pass_and_compare(CanonicalizeGemmPass(), parse(text, ("W", _W), ("k", k)))
    assert result.changes.total == 0
    assert op_types(model) == ["Gemm", "Add"]
    assert any("it has rank 3" in m for m in result.changes.misses)


def test_add_after_gemm_without_c_becomes_c():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[4, 6] x) => (float[4, 5] y) {
      h = Gemm(x, W)
      y = Add(k, h)
    }
    """
    k = np.linspace(-1, 1, 5, dtype=np.float32).reshape(1, 5)
    model, result = run_pass_and_compare(CanonicalizeGemmPass(), parse(text, ("W", _W), ("k", k)))
    assert result.changes.counts == {"folded Add into Gemm bias": 1}
    assert op_types(model) == ["Gemm"]
    np.testing.assert_array_equal(model.graph.node(0).inputs[2].const_value.numpy(), k)


def test_catalog_builds_the_fusion_passes():
    names = ["fold-batchnorm", "fuse-layernorm", "fuse-gelu", "canonicalize-gemm", "cancel-transpose-reshape"]
    passes = [make_pass(n, target_opset=18) for n in names]
    assert [p.name for p in passes] == names
    assert passes[1].target_opset == passes[2].target_opset == 18
