"""SmoothQuant keeps the float model's outputs, folds where it can, and cuts int8 error on outlier channels."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from tests.helpers import parse
from zonnx import zoo
from zonnx.errors import OptionError
from zonnx.ir.io import to_ir, to_proto
from zonnx.quantization.api import quantize_static
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.enums import QuantType
from zonnx.quantization.options import parse_extra_options
from zonnx.quantization.recovery.smooth_quant import smooth_quant, smooth_scales
from zonnx.verify import run_ort

C, N = 64, 32
SYM_INT8 = {"per_channel": True, "activation_type": QuantType.QInt8}


def _ln_matmul(outliers: bool = True) -> onnx.ModelProto:
    """LayerNormalization -> MatMul -> Add; gamma has two outlier channels (x40, x-25) when asked."""
    rng = np.random.default_rng(0)
    gamma = (rng.random(C) + 0.5).astype(np.float32)
    if outliers:
        gamma[5], gamma[17] = 40.0, -25.0
    beta = (rng.normal(size=C) * 0.1).astype(np.float32)
    w = (rng.normal(size=(C, N)) / 8).astype(np.float32)
    b = (rng.normal(size=N) * 0.1).astype(np.float32)
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[B, 16, 64] x) => (float[B, 16, 32] y) {
      ln = LayerNormalization <axis = -1> (x, gamma, beta)
      h = MatMul(ln, W)
      y = Add(h, b)
    }"""
    return parse(text, ("gamma", gamma), ("beta", beta), ("W", w), ("b", b))


def _qkv_model() -> onnx.ModelProto:
    """A decomposed LayerNorm affine (Mul gamma, Add beta) read by three projections, a Gemm (on a graph
    input: a Mul is inserted) feeding a Gemm, and a 3x3 Conv feeding a 1x1 Conv."""
    rng = np.random.default_rng(1)

    def w(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.normal(size=shape) * scale).astype(np.float32)

    gamma = w(C, scale=1.0)
    gamma[3] = 30.0
    text = """<ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 8, 64] x, float[2, 64] z, float[1, 4, 6, 6] img)
      => (float[2, 8, 64] q, float[2, 8, 64] k, float[2, 8, 64] v, float[2, 32] g2, float[1, 8, 6, 6] c) {
      m = Mul(x, gamma)
      a = Add(m, beta)
      q = MatMul(a, Wq)
      k = MatMul(a, Wk)
      v = MatMul(a, Wv)
      g1 = Gemm <transB = 1> (z, G1, c1)
      g2 = Gemm(g1, G2, c2)
      c0 = Conv <pads = [1, 1, 1, 1]> (img, K0, b0)
      c = Conv(c0, K)
    }"""
    return parse(
        text,
        ("gamma", gamma),
        ("beta", w(C)),
        ("Wq", w(C, C)),
        ("Wk", w(C, C)),
        ("Wv", w(C, C)),
        ("G1", w(48, C)),
        ("c1", w(48)),
        ("G2", w(48, 32)),
        ("c2", w(32)),
        ("K0", w(16, 4, 3, 3)),
        ("b0", w(16)),
        ("K", w(8, 16, 1, 1)),
    )


def _feeds(model: onnx.ModelProto, n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for vi in model.graph.input:
        dims = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
        out.append((vi.name, dims))
    return [{name: rng.normal(size=dims).astype(np.float32) for name, dims in out} for _ in range(n)]


def _assert_same_outputs(before: onnx.ModelProto, after: onnx.ModelProto, feeds) -> None:
    for feed in feeds:
        want, got = run_ort(before, feed), run_ort(after, feed)
        for name, ref in want.items():
            err = np.abs(got[name] - ref).max() / np.abs(ref).max()
            assert err < 1e-4, (name, err)


def test_scales_follow_the_formula_and_guard_zeros():
    s = smooth_scales(np.array([4.0, 0.0, 9.0]), np.array([1.0, 2.0, 0.0]), 0.5)
    np.testing.assert_allclose(s, [2.0, 1.0, 1.0])
    np.testing.assert_allclose(smooth_scales(np.array([8.0]), np.array([2.0]), 1.0), [8.0])
    np.testing.assert_allclose(smooth_scales(np.array([8.0]), np.array([2.0]), 0.0), [0.5])


@pytest.mark.parametrize("folding", [True, False])
def test_layernorm_fold_or_mul_keeps_float_outputs(folding):
    proto = _ln_matmul()
    feeds = _feeds(proto, 6)
    model = to_ir(onnx.ModelProto.FromString(proto.SerializeToString()))
    res = smooth_quant(model, feeds[:4], alpha=0.5, folding=folding)
    after = to_proto(model)
    assert (res.smoothed, res.folded, res.inserted) == ((1, 1, 0) if folding else (1, 0, 1))
    ops = [n.op_type for n in after.graph.node]
    assert ops.count("Mul") == (0 if folding else 1) and res.samples == 4
    assert res.outlier_ratio["ln"] > 10
    _assert_same_outputs(proto, after, feeds[4:])
    if folding:  # gamma and beta carry 1/s; W rows carry s
        inits = {t.name: onnx.numpy_helper.to_array(t) for t in after.graph.initializer}
        gamma = next(v for k, v in inits.items() if k.startswith("gamma"))
        assert abs(gamma[5]) < 40.0 / 2


def test_post_ln_output_with_a_residual_reader_gets_a_mul():
    rng = np.random.default_rng(4)
    gamma = (rng.random(C) + 0.5).astype(np.float32)
    gamma[9] = 50.0
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 8, 64] x) => (float[2, 8, 32] y, float[2, 8, 64] r) {
      ln = LayerNormalization <axis = -1> (x, gamma, beta)
      y = MatMul(ln, W)
      r = Add(ln, x)
    }"""
    proto = parse(
        text,
        ("gamma", gamma),
        ("beta", np.zeros(C, np.float32)),
        ("W", (rng.normal(size=(C, N)) * 0.1).astype(np.float32)),
    )
    feeds = _feeds(proto, 4, seed=5)
    model = to_ir(onnx.ModelProto.FromString(proto.SerializeToString()))
    res = smooth_quant(model, feeds[:2])
    after = to_proto(model)
    assert (res.smoothed, res.folded, res.inserted) == (1, 0, 1)
    mul = next(n for n in after.graph.node if n.op_type == "Mul")
    readers = {n.op_type: list(n.input) for n in after.graph.node if n.op_type in ("MatMul", "Add")}
    assert mul.input[0] == "ln" and readers["MatMul"][0] == mul.output[0] and readers["Add"][0] == "ln"
    _assert_same_outputs(proto, after, feeds[2:])


def test_affine_without_gamma_gets_its_gamma_back():
    rng = np.random.default_rng(6)
    beta = (rng.normal(size=C) * 0.1).astype(np.float32)
    beta[7] = 20.0
    text = """<ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 8, 64] x, float[2, 8, 1] d) => (float[2, 8, 32] y) {
      n = Div(x, d)
      a = Add(n, beta)
      y = MatMul(a, W)
    }"""
    proto = parse(text, ("beta", beta), ("W", (rng.normal(size=(C, N)) * 0.1).astype(np.float32)))
    feeds = [{"x": f["x"], "d": np.abs(f["d"]) + 0.5} for f in _feeds(proto, 4, seed=7)]
    model = to_ir(onnx.ModelProto.FromString(proto.SerializeToString()))
    res = smooth_quant(model, feeds[:2])
    after = to_proto(model)
    assert (res.smoothed, res.folded, res.inserted) == (1, 1, 0)
    ops = {n.op_type: n for n in after.graph.node}
    assert ops["Mul"].input[0] == "n" and ops["Add"].input[0] == ops["Mul"].output[0]
    assert ops["MatMul"].input[0] == "a"
    _assert_same_outputs(proto, after, feeds[2:])


def test_shared_scale_for_qkv_and_folds_into_gemm_and_affine():
    proto = _qkv_model()
    feeds = _feeds(proto, 5)
    model = to_ir(onnx.ModelProto.FromString(proto.SerializeToString()))
    res = smooth_quant(model, feeds[:3])
    after = to_proto(model)
    # folded: a (decomposed LN affine: beta, then gamma), g1 (Gemm rows of B and C), c0 (3x3 Conv filters
    # and bias); z is a graph input, so a Mul is inserted; the 3x3 Conv is no per-channel linear map
    assert (res.smoothed, res.folded, res.inserted) == (4, 3, 1), res
    assert set(res.outlier_ratio) == {"a", "z", "g1", "c0"}
    _assert_same_outputs(proto, after, feeds[3:])
    before = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in after.graph.initializer}
    weights = {n.output[0]: inits[n.input[1]] for n in after.graph.node if n.output[0] in ("q", "k", "v")}
    ratios = [weights[o] / before[w] for o, w in (("q", "Wq"), ("k", "Wk"), ("v", "Wv"))]
    np.testing.assert_allclose(ratios[0], ratios[1], rtol=1e-5)  # one s per row, shared by Q, K and V
    np.testing.assert_allclose(ratios[0], ratios[2], rtol=1e-5)
    assert np.ptp(ratios[0][:, 0]) > 0.1 and np.allclose(ratios[0], ratios[0][:, :1], rtol=1e-5)


def test_quantization_error_drops_on_an_outlier_channel():
    proto = _ln_matmul()
    feeds = _feeds(proto, 24, seed=2)
    held_out = feeds[16:]
    ref = [run_ort(proto, f)["y"] for f in held_out]

    def rmse(extra: dict) -> float:
        r = quantize_static(
            proto,
            None,
            ListReader(feeds[:16]),
            **SYM_INT8,
            extra_options={"ActivationSymmetric": True, **extra},
        )
        got = [run_ort(r.model, f)["y"] for f in held_out]
        return float(np.sqrt(np.mean([np.mean((g - e) ** 2) for g, e in zip(got, ref, strict=True)])))

    plain, smooth = rmse({}), rmse({"SmoothQuant": True})
    assert smooth < 0.8 * plain, (plain, smooth)


class _GetNextOnly:
    """An ORT-style reader: get_next() only, no rewind."""

    def __init__(self, feeds) -> None:
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)


def test_reader_without_rewind_is_replayed_to_calibration():
    proto = _ln_matmul()
    feeds = _feeds(proto, 8, seed=3)
    kw = {**SYM_INT8, "extra_options": {"SmoothQuant": True, "SmoothQuantAlpha": 0.7}}
    a = quantize_static(proto, None, ListReader(feeds), **kw)
    b = quantize_static(proto, None, _GetNextOnly(feeds), **kw)
    assert (
        a.recovery["smooth_quant"]["reader"] == "rewind" and b.recovery["smooth_quant"]["reader"] == "buffer"
    )
    assert b.recovery["smooth_quant"]["samples"] == 8 and not b.recovery["smooth_quant"]["partial_statistics"]
    assert a.model.SerializeToString() == b.model.SerializeToString()


def test_options_are_checked():
    opts = parse_extra_options({"SmoothQuant": True, "SmoothQuantAlpha": 0.75, "SmoothQuantFolding": False})
    assert (opts.smooth_quant, opts.smooth_quant_alpha, opts.smooth_quant_folding) == (True, 0.75, False)
    with pytest.raises(OptionError, match="SmoothQuantAlpha.*must be in"):
        parse_extra_options({"SmoothQuant": True, "SmoothQuantAlpha": 1.5})
    with pytest.raises(OptionError, match="no effect without SmoothQuant"):
        parse_extra_options({"SmoothQuantAlpha": 0.6})
    with pytest.raises(OptionError, match="needs calibration data"):
        quantize_static(_ln_matmul(), None, None, extra_options={"SmoothQuant": True})


def test_nothing_to_smooth_changes_nothing(caplog):
    proto = parse("""<ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 4] x, float[4, 3] w) => (float[2, 3] y) { y = MatMul(x, w) }""")
    model = to_ir(proto)
    res = smooth_quant(model, [])
    assert res.smoothed == 0 and "nothing smoothed" in caplog.text
    assert isinstance(model, ir.Model) and [n.op_type for n in to_proto(model).graph.node] == ["MatMul"]


# ---------------------------------------------------------------- BERT encoder (zoo)

BERT = "bert_encoder-random"


@pytest.fixture(scope="module")
def bert_data():
    """The prepared float BERT (as quantize_static prepares it), calibration feeds and a held-out batch."""
    from zonnx.passes.catalog import make_pass
    from zonnx.quantization.prepare import PREP_PASSES

    model = to_ir(str(zoo.get(BERT)))
    for name in PREP_PASSES:
        make_pass(name)(model)
    held = zoo.sample_inputs(BERT, 6, seed=1)
    batch = {k: np.concatenate([f[k] for f in held]) for k in held[0]}
    return to_proto(model), zoo.sample_inputs(BERT, 4, seed=0), batch


def test_bert_float_outputs_unchanged_by_smoothing(bert_data):
    proto, calib, batch = bert_data
    model = to_ir(onnx.ModelProto.FromString(proto.SerializeToString()))
    res = smooth_quant(model, calib, alpha=0.5)
    # per layer: the FFN2 input folds into GELU's Mul by 0.5; the Q/K/V and FFN1 inputs (LayerNorm outputs
    # also read by the residual Add) and the attention output projection's (a Reshape) get a Mul
    assert (res.smoothed, res.folded, res.inserted) == (24, 6, 18), res
    assert max(res.outlier_ratio.values()) > 5
    _assert_same_outputs(proto, to_proto(model), [batch])


def _centered_cosine(got: np.ndarray, ref: np.ndarray) -> float:
    """Mean cosine to the float embeddings after removing the float batch mean (the part that differs
    between sentences; the raw cosine is dominated by the shared outlier channels)."""
    a, b = got - ref.mean(0), ref - ref.mean(0)
    return float(np.mean(np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))


def test_bert_int8_embedding_improves_with_smooth_quant(bert_data):
    proto, calib, batch = bert_data
    ref = run_ort(proto, batch)["embedding"]

    def cosine(extra: dict) -> float:
        r = quantize_static(
            proto,
            None,
            ListReader(calib),
            op_types_to_quantize=["MatMul"],
            **SYM_INT8,
            extra_options={"ActivationSymmetric": True, **extra},
        )
        return _centered_cosine(run_ort(r.model, batch)["embedding"], ref)

    plain, smooth = cosine({}), cosine({"SmoothQuant": True})
    assert smooth > plain + 0.1 and smooth > 0.85, (plain, smooth)
