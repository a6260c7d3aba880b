"""The float64 requantization forms of the native kernels equal the numpy formula: QConv and QDwConv's
packed store (``pack64_u8`` in ``rq_avx512.h``: int16 then uint8 saturation, then the [lo, hi] clamp) where
the rounded values leave the int16 range on both sides, for output zero points up to 300 and clamps
narrower than [0, 255]; RequantU8's two-term form (``requant_f64.cpp``, the residual adds) in every
rounding mode on exact ties, 31-bit multipliers of both signs, per-tensor and per-channel (channels last and
NCHW) parameters, saturation at both ends and lengths that are no multiple of 16. ``Int8ToU8`` (int8
program inputs to their storage) on every code; ``SumHwU8`` (global average pool sums) at full scale."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.backend.native_support import lowered_session
from zonnx.backend.compiler import quantize_multiplier
from zonnx.backend.compiler.requant import ROUND_MODES, requantize
from zonnx.backend.runtime.ort_kernels import Builder, Term, storage_of, to_storage
from zonnx.backend.runtime.ort_native import (
    NATIVE_DOMAIN,
    emit_int8_to_u8,
    emit_native_requant,
    emit_qconv,
    emit_qdwconv,
    emit_sum_hw_u8,
    native_requant_attrs,
)

pytestmark = pytest.mark.exactness


def _run(b: Builder, out: str, x: np.ndarray, x2: np.ndarray | None = None) -> np.ndarray:
    """The lowered one-node model run on the native library (inputs ``x`` and, if given, ``x2``)."""
    b.op("Identity", [out], "y")
    names = ["x"] if x2 is None else ["x", "x2"]
    g = helper.make_graph(
        b.nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.UINT8, None) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        b.initializers,
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(NATIVE_DOMAIN, 1)]
    )
    model.ir_version = 10
    feeds = {"x": x} if x2 is None else {"x": x, "x2": x2}
    return lowered_session(model, True).run(None, feeds)[0]


def _attrs(m: np.ndarray, s: np.ndarray, bias: np.ndarray, mode: str, zs: int, lo: int, hi: int, k: int):
    term = Term("", m.astype(object), float(k * 255 * 128))
    const = m.astype(object) * bias.astype(object)
    return native_requant_attrs([term], const, s, mode, zs, lo, hi, storage_of("uint8"), (-1,), where="t")


def _scales(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel multipliers and shifts for ratios 10^-4 .. 3 (log-uniform): some channels' rounded values
    reach about +-10^5, others stay inside [0, 255]."""
    pairs = [quantize_multiplier(float(r), 31, (0, 63)) for r in 10 ** rng.uniform(-4, 0.5, n)]
    return tuple(np.array([p[i] for p in pairs], np.int64) for i in (0, 1))


def _check(got: np.ndarray, acc: np.ndarray, m, s, bias, mode: str, zs: int, lo: int, hi: int) -> None:
    v = requantize(acc + bias, m, s, mode, zero_point=0, lo=-(2**40), hi=2**40)
    assert (v > 32767).any() and (v < -32768).any()  # both int16 saturations are exercised
    want = requantize(acc + bias, m, s, mode, zero_point=zs, lo=lo, hi=hi)
    assert ((want > lo) & (want < hi)).any()  # not all clamped
    assert got.shape == want.shape and np.array_equal(got, want), (mode, int(np.sum(got != want)))


@pytest.mark.parametrize(("zs", "lo", "hi"), [(0, 0, 255), (128, 128, 255), (300, 3, 200), (-200, 0, 255)])
@pytest.mark.parametrize(("c", "o", "kernel"), [(16, 96, 1), (32, 16, 1), (5, 70, 3)])
def test_qconv_packed_requant_saturates_exactly(
    c: int, o: int, kernel: int, zs: int, lo: int, hi: int
) -> None:
    """QConv: 1x1 (rows read in place; 96 = a full and a half panel, 16 = one block) and 3x3 padded."""
    rng = np.random.default_rng(c * o)
    x = rng.integers(0, 256, size=(1, 7, 9, c)).astype(np.uint8)
    w = rng.integers(-128, 128, size=(kernel * kernel * c, o)).astype(np.int8)
    zp, pad = 37, kernel // 2
    xp = np.pad(x.astype(np.int64), [(0, 0), (pad, pad), (pad, pad), (0, 0)], constant_values=zp)
    taps = [xp[:, i : i + 7, j : j + 9] for i in range(kernel) for j in range(kernel)]
    acc = (np.concatenate(taps, axis=3) - zp) @ w.astype(np.int64)
    m, s = _scales(rng, o)
    bias = rng.integers(-5000, 5000, size=o)
    for mode in ROUND_MODES:
        b = Builder("q")
        y = emit_qconv(b, "x", w, [kernel] * 2, [1, 1], [pad] * 4, [1, 1], zp,
                       _attrs(m, s, bias, mode, zs, lo, hi, w.shape[0]))  # fmt: skip
        assert y is not None and [n.op_type for n in b.nodes] == ["QConv"]
        _check(_run(b, y, x), acc, m, s, bias, mode, zs, lo, hi)


@pytest.mark.parametrize(("zs", "lo", "hi"), [(0, 0, 255), (128, 128, 255), (300, 3, 200), (-200, 0, 255)])
@pytest.mark.parametrize(("c", "stride"), [(32, 1), (96, 2), (144, 1)])
def test_qdwconv_packed_requant_saturates_exactly(c: int, stride: int, zs: int, lo: int, hi: int) -> None:
    """QDwConv 3x3: 32 channels (two pixels per block), 96 and 144 (partial blocks)."""
    rng = np.random.default_rng(c)
    w = rng.integers(-128, 128, size=(c, 1, 3, 3))
    x = rng.integers(0, 256, size=(1, 9, 8, c)).astype(np.uint8)
    zp = 37
    xp = np.pad(x.astype(np.int64) - zp, [(0, 0), (1, 1), (1, 1), (0, 0)])
    oh, ow = ((n - 1) // stride + 1 for n in x.shape[1:3])
    acc = sum(
        xp[:, i : i + stride * (oh - 1) + 1 : stride, j : j + stride * (ow - 1) + 1 : stride] * w[:, 0, i, j]
        for i in range(3)
        for j in range(3)
    )
    m, s = _scales(rng, c)
    s = np.maximum(s - 3, 0)  # depthwise sums are smaller: 8x the ratios reach the int16 limits
    bias = rng.integers(-500, 500, size=c)
    for mode in ROUND_MODES:
        b = Builder("q")
        y = emit_qdwconv(
            b, "x", w, [stride] * 2, [1] * 4, [1, 1], zp, _attrs(m, s, bias, mode, zs, lo, hi, 9)
        )
        assert y is not None and [n.op_type for n in b.nodes] == ["QDwConv"]
        _check(_run(b, y, x), acc, m, s, bias, mode, zs, lo, hi)


@pytest.mark.parametrize("layout", ["tensor", "last", "nchw"])
@pytest.mark.parametrize("scale", ["ties", "wide"])
def test_requant_two_terms_float64_form(layout: str, scale: str) -> None:
    """RequantU8 of two uint8 terms: ``ties`` (small multipliers, shifts 1 .. 3: many exact halves) and
    ``wide`` (31-bit multipliers of both signs, shifts 29 .. 31); per-tensor or 24 channels."""
    rng = np.random.default_rng(7)
    shape = (1, 24, 5, 7) if layout == "nchw" else (1, 5, 7, 24)
    a, c = (rng.integers(0, 256, size=shape).astype(np.uint8) for _ in range(2))
    a.reshape(-1)[:40], c.reshape(-1)[:40] = 255, 0  # saturation at hi (M1 > 0 in channel 0) ...
    a.reshape(-1)[40:80], c.reshape(-1)[40:80] = 0, 255  # ... and at lo (M2 < 0)
    n = 1 if layout == "tensor" else 24
    if scale == "ties":
        m1, m2 = rng.integers(1, 9, n), -rng.integers(1, 9, n)
        k, s = rng.integers(-300, 300, n), rng.integers(1, 4, n)
    else:
        m1 = rng.integers(2**30, 2**31, n) * np.r_[1, rng.choice([-1, 1], n - 1)]
        m2 = -rng.integers(2**30, 2**31, n)
        k, s = rng.integers(-(2**34), 2**34, n), np.r_[29, rng.integers(29, 32, n - 1)]
    bshape = (-1, 1, 1) if layout == "nchw" else ((-1,) if n > 1 else ())
    pshape = (1, -1, 1, 1) if layout == "nchw" else (-1,)
    p = m1.reshape(pshape) * a.astype(np.int64) + m2.reshape(pshape) * c.astype(np.int64) + k.reshape(pshape)
    for mode in ROUND_MODES:
        want = requantize(p, 1, s.reshape(pshape), mode, zero_point=9, lo=2, hi=250)
        assert (want == 2).any() and (want == 250).any() and ((want > 2) & (want < 250)).any()
        b = Builder("r")
        terms = [Term("x", m1, 255), Term("x2", m2, 255)]
        y = emit_native_requant(b, terms, k, s, mode, 9, 2, 250, storage_of("uint8"), bshape, where="t")
        assert y is not None and [nd.op_type for nd in b.nodes] == ["RequantU8"]
        got = _run(b, y, a, c)
        assert np.array_equal(got, want), (mode, int(np.sum(got != want)))


def test_int8_to_u8_every_code() -> None:
    """Int8ToU8 == the ONNX lowering's Cast + Add + Cast (``to_storage``) == q + 128 on all 256 codes, in a
    tensor longer than one parallel chunk."""
    q = np.tile(np.arange(-128, 128, dtype=np.int8), 300).reshape(3, 100, 256)
    outs = []
    for native in (True, False):
        b = Builder("s")
        y = emit_int8_to_u8(b, "x") if native else to_storage(b, "x", "int8")
        b.op("Identity", [y], "y")
        g = helper.make_graph(
            b.nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.INT8, None)],
            [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
            b.initializers,
        )
        model = helper.make_model(
            g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(NATIVE_DOMAIN, 1)]
        )
        model.ir_version = 10
        assert [n.op_type for n in b.nodes][0] == ("Int8ToU8" if native else "Cast")
        outs.append(lowered_session(model, native).run(None, {"x": q})[0])
    assert outs[0].dtype == np.uint8 and np.array_equal(outs[0], q.astype(np.int64) + 128)
    assert np.array_equal(outs[0], outs[1])


def test_sum_hw_u8_full_scale() -> None:
    """SumHwU8 == numpy's int64 sum over H and W, with one channel of all 255 (the largest sums), batch 2."""
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, size=(2, 7, 9, 1280)).astype(np.uint8)
    x[:, :, :, 3] = 255
    b = Builder("p")
    y = emit_sum_hw_u8(b, "x")
    b.op("Identity", [y], "y")
    g = helper.make_graph(
        b.nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, None)],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        b.initializers,
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(NATIVE_DOMAIN, 1)]
    )
    model.ir_version = 10
    got = lowered_session(model, True).run(None, {"x": x})[0]
    want = x.astype(np.int64).sum(axis=(1, 2), keepdims=True)
    assert got.dtype == np.int32 and int(got[1, 0, 0, 3]) == 63 * 255 and np.array_equal(got, want)
