"""The float32 shortcut of the native kernels' float64 requantization (``F32Tables`` / ``rq64_f64`` in
``rq_avx512.h``) equals the numpy formula in every rounding mode, for QConv (1x1 rows read in place, a 3x3
im2col; a full and a half panel, a panel of three 16-lane blocks run as four, one partial block) and QDwConv
(32 channels, two pixels per block; 144, a partial block; strides 1 and 2), each with one channel of zero
weights (a constant result, stored in the tables as such), and output zero points 100, 300 (clamp [3, 200])
and -200 (folded into the tables' constant). Three multiplier sets, all within
the shortcut's bound so every kernel takes it: ``ties`` (31-bit multipliers 2^30 + d with shifts 31 and 32:
the values lie within 2^-20 of an integer or a half in a quarter of the lanes, so most rows fail the test
and run again in float64), ``spread`` (31-bit multipliers for ratios 10^-3.5 .. 10^-2.3: the float32 values
are used) and ``pow2`` (multiplier 1, shifts 1 .. 4: exact in float32, exact ties, no test)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.backend.native_support import lowered_session
from zonnx.backend.compiler import quantize_multiplier
from zonnx.backend.compiler.requant import ROUND_MODES, requantize
from zonnx.backend.runtime.ort_kernels import Builder, Term, storage_of
from zonnx.backend.runtime.ort_native import NATIVE_DOMAIN, emit_qconv, emit_qdwconv, native_requant_attrs

pytestmark = pytest.mark.exactness

ZP, ZS, LO, HI = 5, 100, 0, 255
SETS = ["ties", "spread", "pow2"]
#: output zero point and clamp: the folded zero point beyond [lo, hi] on either side, a narrow clamp
OUTS = [(ZS, LO, HI), (300, 3, 200), (-200, 0, 255)]


def _run(b: Builder, out: str, x: np.ndarray) -> np.ndarray:
    """The lowered one-node model run on the native library."""
    b.op("Identity", [out], "y")
    g = helper.make_graph(
        b.nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, None)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        b.initializers,
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(NATIVE_DOMAIN, 1)]
    )
    model.ir_version = 10
    return lowered_session(model, True).run(None, {"x": x})[0]


def _multipliers(rng: np.random.Generator, kind: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    if kind == "ties":
        return 2**30 + rng.integers(-3, 4, n), rng.choice([31, 32], n)
    if kind == "pow2":
        return np.ones(n, np.int64), rng.integers(1, 5, n)
    pairs = [quantize_multiplier(float(r), 31, (0, 63)) for r in 10 ** rng.uniform(-3.5, -2.3, n)]
    return tuple(np.array([p[i] for p in pairs], np.int64) for i in (0, 1))


def _within_bound(w_abs_sum: np.ndarray, w_sum: np.ndarray, m, s, bias) -> bool:
    """The rule F32Tables builds under (2^-22 (A |fm| + |fc|) <= 2^-8, A = 255 sum |w|), with margin, or the
    exact case (multiplier 1)."""
    fm = m / 2.0**s
    fc = (m * bias - m * ZP * w_sum) / 2.0**s
    return bool(np.all(m == 1) or np.all(255 * w_abs_sum * fm + np.abs(fc) + 1 < 16000))


def _check(got: np.ndarray, acc: np.ndarray, m, s, bias, kind: str, mode: str, out=OUTS[0]) -> None:
    y = m * (acc + bias) / 2.0**s
    if kind == "ties":  # a quarter of the lanes within 2^-20 of an integer or a half
        near = np.abs(2 * y - np.rint(2 * y)) < 2**-19
        assert near.mean() > 0.2
    zs, lo, hi = out
    want = requantize(acc + bias, m, s, mode, zero_point=zs, lo=lo, hi=hi)
    assert ((want > lo) & (want < hi)).any() and ((want == hi) | (want == lo)).any()
    assert got.shape == want.shape and np.array_equal(got, want), (kind, mode, int(np.sum(got != want)))


def _attrs(m, s, bias, mode: str, k: int, out=OUTS[0]) -> dict:
    term = Term("", m.astype(object), float(k * 255 * 128))
    const = m.astype(object) * bias.astype(object)
    return native_requant_attrs([term], const, s, mode, *out, storage_of("uint8"), (-1,), where="t")


@pytest.mark.parametrize("out", OUTS)
@pytest.mark.parametrize("kind", SETS)
@pytest.mark.parametrize(("c", "o", "kernel"), [(16, 96, 1), (16, 112, 1), (32, 24, 1), (5, 70, 3)])
def test_qconv_float32_form(kind: str, c: int, o: int, kernel: int, out: tuple[int, int, int]) -> None:
    rng = np.random.default_rng(c * o + kernel)
    x = rng.integers(0, 256, size=(1, 11, 13, c)).astype(np.uint8)
    wmax = 120 if kind != "ties" else 6 * 16 // (kernel * kernel * c)
    w = rng.integers(-wmax, wmax + 1, size=(kernel * kernel * c, o)).astype(np.int8)
    w[:, 3] = 0  # a constant channel
    pad = kernel // 2
    xp = np.pad(x.astype(np.int64), [(0, 0), (pad, pad), (pad, pad), (0, 0)], constant_values=ZP)
    taps = [xp[:, i : i + 11, j : j + 13] for i in range(kernel) for j in range(kernel)]
    acc = (np.concatenate(taps, axis=3) - ZP) @ w.astype(np.int64)
    m, s = _multipliers(rng, kind, o)
    bias = rng.integers(-200, 200, size=o)
    w64 = w.astype(np.int64)
    assert _within_bound(np.abs(w64).sum(0), w64.sum(0), m, s, bias)
    for mode in ROUND_MODES:
        b = Builder("q")
        y = emit_qconv(b, "x", w, [kernel] * 2, [1, 1], [pad] * 4, [1, 1], ZP,
                       _attrs(m, s, bias, mode, w.shape[0], out))  # fmt: skip
        assert y is not None and [n.op_type for n in b.nodes] == ["QConv"]
        _check(_run(b, y, x), acc, m, s, bias, kind, mode, out)


@pytest.mark.parametrize("out", OUTS)
@pytest.mark.parametrize("kind", SETS)
@pytest.mark.parametrize(("c", "stride"), [(32, 1), (32, 2), (144, 1), (144, 2)])
def test_qdwconv_float32_form(kind: str, c: int, stride: int, out: tuple[int, int, int]) -> None:
    rng = np.random.default_rng(c + stride)
    wmax = 12 if kind == "ties" else 127
    w = rng.integers(-wmax, wmax + 1, size=(c, 1, 3, 3))
    w[5] = 0  # a constant channel
    x = rng.integers(0, 256, size=(1, 12, 11, c)).astype(np.uint8)
    xp = np.pad(x.astype(np.int64) - ZP, [(0, 0), (1, 1), (1, 1), (0, 0)])
    oh, ow = ((n - 1) // stride + 1 for n in x.shape[1:3])
    acc = sum(
        xp[:, i : i + stride * (oh - 1) + 1 : stride, j : j + stride * (ow - 1) + 1 : stride] * w[:, 0, i, j]
        for i in range(3)
        for j in range(3)
    )
    m, s = _multipliers(rng, kind, c)
    if kind == "spread":
        s = s - 4  # depthwise sums are smaller: 16x the ratios
    bias = rng.integers(-200, 200, size=c)
    wf = w.reshape(c, 9)
    assert _within_bound(np.abs(wf).sum(1), wf.sum(1), m, s, bias)
    for mode in ROUND_MODES:
        b = Builder("q")
        y = emit_qdwconv(b, "x", w, [stride] * 2, [1] * 4, [1, 1], ZP, _attrs(m, s, bias, mode, 9, out))
        assert y is not None and [n.op_type for n in b.nodes] == ["QDwConv"]
        _check(_run(b, y, x), acc, m, s, bias, kind, mode, out)


@pytest.mark.parametrize("wide", [False, True])
def test_qconv_float32_form_with_integer_fallback(wide: bool) -> None:
    """Where the float64 form does not apply, rows failing the float32 test run the integer form: 31-bit
    multipliers 2^31 - 1 - d with shift 33 on 160 input channels (|M| max |acc - zw| >= 2^52 for some
    channel: rq16_32), or multipliers 2^38 + d beyond int32 with shift 40 (rq16); both near ties."""
    rng = np.random.default_rng(11 + wide)
    c, o, zp = 160 if not wide else 16, 40, 0
    x = rng.integers(0, 256, size=(1, 11, 13, c)).astype(np.uint8)
    wmax = 127 if not wide else 6
    w = rng.integers(-wmax, wmax + 1, size=(c, o)).astype(np.int8)
    acc = (x.astype(np.int64) - zp) @ w.astype(np.int64)
    d = rng.integers(0, 7, o)
    m, s = (2**31 - 1 - d, np.full(o, 33)) if not wide else (2**38 + d, np.full(o, 40))
    bias = rng.integers(-200, 200, size=o)
    a = 255 * np.abs(w.astype(np.int64)).sum(0)
    assert np.all(a * m / 2.0**s + np.abs(m * bias / 2.0**s) < 2**20 * 0.9)  # F32Tables' bound E <= 1/4
    assert wide or np.any(m * a >= 2**52)  # no float64 form (wide: multipliers beyond int32)
    for mode in ROUND_MODES:
        b = Builder("q")
        y = emit_qconv(b, "x", w, [1, 1], [1, 1], [0] * 4, [1, 1], zp, _attrs(m, s, bias, mode, c))
        assert y is not None and [n.op_type for n in b.nodes] == ["QConv"]
        want = requantize(acc + bias, m, s, mode, zero_point=ZS, lo=LO, hi=HI)
        yv = m * (acc + bias) / 2.0**s  # a quarter of the lanes within 2^-13 of an integer
        assert (np.abs(yv - np.rint(yv)) < 2**-13).mean() > 0.2 and ((want > LO) & (want < HI)).any()
        got = _run(b, y, x)
        assert np.array_equal(got, want), (wide, mode, int(np.sum(got != want)))
