"""A residual add fused into the native QConv (``ort_fuse``): the fused kernel == QConv + RequantU8 == the numpy
formula bit for bit, per tensor and per channel, every rounding mode, saturation at both clamp bounds, the
float64 and int64 forms, broadcast skip tensors, on every GEMM path; and the lowering fuses exactly where the
conv's output is read by nothing else."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.backend.native_support import lowered_session
from zonnx.backend import native
from zonnx.backend.compiler import Op, Program, TensorInfo, quantize_multiplier
from zonnx.backend.compiler.requant import ROUND_MODES, requantize
from zonnx.backend.runtime.ort_fuse import fuse_residual_adds
from zonnx.backend.runtime.ort_kernels import Builder, Term, storage_of
from zonnx.backend.runtime.ort_lowering import program_to_model
from zonnx.backend.runtime.ort_native import (
    NATIVE_DOMAIN,
    emit_native_requant,
    emit_qconv,
    native_requant_attrs,
)
from zonnx.backend.runtime.reference import run_program

pytestmark = pytest.mark.exactness

U8 = storage_of("uint8")


def _model(nodes: list, inits: list, inputs: list[tuple[str, int]]) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        inits,
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(NATIVE_DOMAIN, 1)]
    )
    model.ir_version = 10
    return model


def _conv_codes(rng: np.random.Generator, x: np.ndarray, w: np.ndarray, zp: int) -> tuple[np.ndarray, dict]:
    """(the conv's uint8 output codes by numpy, QConv's requantization attributes): 3x3, pads 1, stride 1."""
    n, h, wd, c = x.shape
    xp = np.pad(x.astype(np.int64), [(0, 0), (1, 1), (1, 1), (0, 0)], constant_values=zp)
    taps = [xp[:, i : i + h, j : j + wd] for i in range(3) for j in range(3)]
    acc = (np.concatenate(taps, axis=3) - zp) @ w.astype(np.int64)
    o = w.shape[1]
    pairs = [quantize_multiplier(float(r), 31, (0, 63)) for r in rng.uniform(2e-5, 3e-3, o)]
    m, s = (np.array([p[i] for p in pairs], np.int64) for i in (0, 1))
    bias = rng.integers(-50000, 50000, size=o)
    v = requantize(acc + bias, m, s, "half_even", zero_point=9, lo=0, hi=255)
    term = Term("", m.astype(object), float(w.shape[0] * 255 * 128))
    rq = native_requant_attrs(
        [term], m.astype(object) * bias.astype(object), s, "half_even", 9, 0, 255, U8, (-1,), where="c"
    )
    return v, rq


def _add_params(rng: np.random.Generator, o: int, per_channel: bool, form: str) -> tuple:
    """(M1, M2, K, shift) of a two-term requantization, arrays of ``o`` (per channel) or 1 values, ratios 1
    to 4 around code 128 (both clamp bounds saturate). ``form`` m31: 31-bit multipliers, shift 29 (one rule
    for all: the pair form for the floor-type modes, else the float64 form); m15: 15-bit ones, shift 13
    (every value fits int32: the int32 form); ties: 3 2^26 and 2^26, shift 27 (half the sums are ties; the
    pair form); per channel also small ones with shift 1 (ties) and a negative one; i64: one channel's
    products beyond 2^52 (the float64 form is refused, the int64 loop runs)."""
    n = o if per_channel else 1
    bits = 15 if form == "m15" else 31
    m1 = rng.integers(1 << (bits - 2), 1 << bits, size=n).astype(object)
    m2 = rng.integers(1 << (bits - 2), 1 << bits, size=n).astype(object)
    s = np.full(n, bits - 2)
    if form == "ties":
        m1[:], m2[:], s[:] = 3 << 26, 1 << 26, 27
    k = np.array([-(int(a) + int(b)) * 128 for a, b in zip(m1, m2, strict=True)], dtype=object)
    if per_channel:  # channel 1: ties; channel 2: a negative multiplier
        m1[1], m2[1], k[1], s[1] = 3, 1, -200, 1
        m2[2], k[2] = -m2[2], int(m2[2]) * 90
    if form == "i64":
        m1[0], m2[0], k[0], s[0] = (1 << 44) + 3, -(1 << 43) + 5, 1 << 50, 50
    return m1, m2, k, s


def _fused_pair(
    x: np.ndarray, w: np.ndarray, rq: dict, skip: str, add: tuple, mode: str, clamp: tuple, conv_term: int
) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(QConv + RequantU8, the fused QConv) of ``x`` and the skip tensor ``skip``."""
    m1, m2, k, s = add
    b = Builder("q")
    v = emit_qconv(b, "x", w, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 37, rq)
    terms = [Term(v, np.asarray(m1), 255), Term(skip, np.asarray(m2), 255)]
    terms = terms if conv_term == 0 else terms[::-1]
    y = emit_native_requant(b, terms, k, s, mode, *clamp, U8, (-1,), where="a")
    assert y is not None and b.nodes[-1].op_type == "RequantU8"
    b.op("Identity", [y], "y")
    ins = [("x", TensorProto.UINT8), (skip, TensorProto.UINT8)]
    fused = fuse_residual_adds(list(b.nodes), ["y"], {skip})
    assert [n.op_type for n in fused] == ["QConv", "Identity"] and list(fused[0].input)[2] == skip
    return _model(b.nodes, b.initializers, ins), _model(fused, b.initializers, ins)


@pytest.mark.parametrize("isa", ["host", "avx-vnni", "baseline"])
@pytest.mark.parametrize(
    ("per_channel", "form"),
    [(False, "m31"), (False, "m15"), (False, "ties"), (True, "m31"), (True, "m15"), (True, "i64")],
)
@pytest.mark.parametrize(("conv_term", "o"), [(0, 70), (1, 70), (1, 24)])
def test_fused_residual_matches_numpy(
    isa: str, per_channel: bool, form: str, conv_term: int, o: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """QConv with the add fused == QConv then RequantU8 == numpy, each rounding mode, clamps [0, 255] (no
    ReLU: both bounds saturate) and [zs, 200] (a ReLU and a low upper bound: half_away and trunc then run
    as half_up and floor); 70 channels (two panels, the second partial) or 24 (one panel: a block's rows are
    one contiguous run)."""
    if isa == "host":
        monkeypatch.delenv(native.ISA_ENV, raising=False)
    else:
        monkeypatch.setenv(native.ISA_ENV, isa)
    rng = np.random.default_rng(3 + conv_term + 2 * per_channel + 4 * len(form) + o)
    c = 5
    x = rng.integers(0, 256, size=(2, 9, 8, c)).astype(np.uint8)
    x[0, :2] = 255
    w = rng.integers(-128, 128, size=(9 * c, o)).astype(np.int8)
    v, rq = _conv_codes(rng, x, w, 37)
    r = rng.integers(0, 256, size=v.shape).astype(np.uint8)
    r[1, :3] = 0
    r[1, 3:5] = 255
    add = _add_params(rng, o, per_channel, form)
    m1, m2, k, s = (np.asarray(a).astype(np.int64) for a in add)
    p = m1 * v + m2 * r.astype(np.int64) + k  # |p| < 2^62 (the int64 rule)
    for mode, clamp in itertools.product(ROUND_MODES, [(128, 0, 255), (128, 128, 200)]):
        want = requantize(p, 1, s, mode, zero_point=clamp[0], lo=clamp[1], hi=clamp[2])
        assert np.sum(want == clamp[1]) > 0 and 0 < np.sum(want == clamp[2]) < want.size
        plain, fused = _fused_pair(x, w, rq, "r", add, mode, clamp, conv_term)
        feed = {"x": x, "r": r}
        apart = lowered_session(plain, True).run(None, feed)[0]
        got = lowered_session(fused, True).run(None, feed)[0]
        assert np.array_equal(apart, want), (mode, int(np.sum(apart != want)))
        assert np.array_equal(got, want), (mode, int(np.sum(got != want)))


@pytest.mark.parametrize("isa", ["host", "baseline"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 70), (2, 1, 1, 1), (70,), (3, 1, 9, 8, 70)])
def test_fused_residual_broadcast_skip(shape: tuple, isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A skip tensor of another shape (the lowering cannot see shapes) is added after the conv with numpy
    broadcasting, the output taking the broadcast shape, exactly as RequantU8 adds it."""
    if isa == "host":
        monkeypatch.delenv(native.ISA_ENV, raising=False)
    else:
        monkeypatch.setenv(native.ISA_ENV, isa)
    rng = np.random.default_rng(len(shape))
    x = rng.integers(0, 256, size=(2, 9, 8, 4)).astype(np.uint8)
    w = rng.integers(-128, 128, size=(36, 70)).astype(np.int8)
    v, rq = _conv_codes(rng, x, w, 37)
    r = rng.integers(0, 256, size=shape).astype(np.uint8)
    add = _add_params(rng, 70, True, "m31")
    m1, m2, k, s = (np.asarray(a).astype(np.int64) for a in add)
    want = requantize(m1 * v + m2 * r.astype(np.int64) + k, 1, s, "half_away", zero_point=128, lo=0, hi=255)
    plain, fused = _fused_pair(x, w, rq, "r", add, "half_away", (128, 0, 255), 1)
    apart = lowered_session(plain, True).run(None, {"x": x, "r": r})[0]
    got = lowered_session(fused, True).run(None, {"x": x, "r": r})[0]
    assert got.shape == want.shape == apart.shape
    assert np.array_equal(apart, want) and np.array_equal(got, want)


def test_fused_qconv_refuses_a_half_residual() -> None:
    """A skip input without the add_* attributes, or the attributes without the input, fails with one line."""
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, size=(1, 4, 4, 4)).astype(np.uint8)
    w = rng.integers(-128, 128, size=(36, 8)).astype(np.int8)
    _, rq = _conv_codes(rng, x, w, 37)
    add = _add_params(rng, 8, False, "m31")
    _, fused = _fused_pair(x, w, rq, "r", add, "floor", (0, 0, 255), 0)
    conv = fused.graph.node[0]
    no_attrs = helper.make_node("QConv", list(conv.input), ["y"], domain=NATIVE_DOMAIN)
    no_attrs.attribute.extend(a for a in conv.attribute if not a.name.startswith("add_"))
    no_input = helper.make_node("QConv", list(conv.input)[:2], ["y"], domain=NATIVE_DOMAIN)
    no_input.attribute.extend(conv.attribute)
    feeds = {"x": x, "r": np.zeros((1, 4, 4, 8), np.uint8)}
    for node, msg in ((no_attrs, "input 2 .* needs the add_"), (no_input, "attributes need input 2")):
        ins = [("x", TensorProto.UINT8), ("r", TensorProto.UINT8)][: len(node.input) - 1]
        sess = lowered_session(_model([node], list(fused.graph.initializer), ins), True)
        with pytest.raises(Exception, match=msg):
            sess.run(None, {n: feeds[n] for n, _ in ins})


# -- the lowering ------------------------------------------------------------------------------------
def _info(name: str, dtype: str, zp: int = 0) -> TensorInfo:
    lo, hi = (-128, 127) if dtype == "int8" else (0, 255)
    return TensorInfo(name, dtype, lo, hi, [1.0], [zp], None, None)


def _conv(rng: np.random.Generator, name: str, x: str, y: str, k: int, zp_in: int, zp_out: int) -> Op:
    """A 16 -> 16 channel conv with k x k taps (pads k // 2), 31-bit multipliers, half_up."""
    c = 16
    w = rng.integers(-128, 128, size=(c, c, k, k)).astype(np.int8)
    pairs = [quantize_multiplier(float(r), 31) for r in rng.uniform(1e-4, 2e-3, c)]
    attrs = {"strides": [1, 1], "pads": [k // 2] * 4, "dilations": [1, 1], "group": 1, "pad_value": zp_in,
             "zp_out": zp_out, "lo": -128, "hi": 127, "round_mode": "half_up"}  # fmt: skip
    params = {"w": w, "bias": rng.integers(-20000, 20000, c), "multiplier": np.array([p[0] for p in pairs]),
              "shift": np.array([p[1] for p in pairs])}  # fmt: skip
    return Op("conv", name, [x], [y], attrs, params)


def _block(rng: np.random.Generator, order: int, extra_reader: bool) -> Program:
    """x -> 1x1 conv -> t -> 3x3 conv -> h; y = add(h, t) (``order`` 1: add(t, h)); ``extra_reader``: h is
    also rescaled."""
    (ma, s), (mb, _) = quantize_multiplier(0.8, 31), quantize_multiplier(0.6, 31)
    ins = ["h", "t"] if order == 0 else ["t", "h"]
    attrs = {"zp_a": -2 if order == 0 else 3, "zp_b": 3 if order == 0 else -2, "zp_out": 5, "lo": -128,
             "hi": 127, "round_mode": "half_away"}  # fmt: skip
    add = Op("add", "a", ins, ["y"], attrs, {"multiplier": np.array([ma, mb]), "shift": np.array([s])})
    ops = [_conv(rng, "c0", "x", "t", 1, 0, 3), _conv(rng, "c1", "t", "h", 3, 3, -2), add]
    infos = [_info("x", "int8"), _info("t", "int8", 3), _info("h", "int8", -2), _info("y", "int8", 5)]
    if extra_reader:
        rescale = Op("rescale", "r", ["h"], ["z"], {"zp_in": -2, "zp_out": 0, "lo": -128, "hi": 127,
                     "round_mode": "half_up"}, {"multiplier": np.array([1 << 30]), "shift": np.array([31])})  # fmt: skip
        ops.append(rescale)
        infos.append(_info("z", "int8"))
    outs = [infos[3]] + ([infos[4]] if extra_reader else [])
    return Program([infos[0]], outs, ops, {t.name: t for t in infos}, "block")


@pytest.mark.parametrize("order", [0, 1])
@pytest.mark.parametrize("extra_reader", [False, True])
def test_lowering_fuses_only_a_private_conv_output(order: int, extra_reader: bool) -> None:
    """A residual block: fused (one QConv with three inputs) when the conv's output is read by the add only,
    apart when another op reads it or it is exposed; the outputs equal the reference and each other."""
    rng = np.random.default_rng(order)
    prog = _block(rng, order, extra_reader)
    x = rng.integers(-128, 128, size=(2, 16, 9, 8)).astype(np.int8)
    x[0, :, :3] = 127
    ref = run_program(prog, {"x": x}, debug=True)
    results = []
    for fuse, expose in ((True, None), (False, None), (True, ["h"])):
        model = program_to_model(prog, name="p", native=True, fuse=fuse, expose=expose)
        qconvs = [n for n in model.graph.node if n.op_type == "QConv"]
        fused = fuse and expose is None and not extra_reader
        assert [len(n.input) for n in qconvs] == [2, 3 if fused else 2]
        assert sum(n.op_type == "RequantU8" for n in model.graph.node) == (0 if fused else 1) + extra_reader
        sess = lowered_session(model, True)
        outs = sess.run(None, {"p/x": x})
        got = {o.name[2:]: v for o, v in zip(sess.get_outputs(), outs, strict=True)}
        for name, value in got.items():
            assert np.array_equal(value.astype(np.int64), ref[name]), (fuse, expose, name)
        results.append(got["y"])
    assert all(np.array_equal(results[0], r) for r in results[1:])
