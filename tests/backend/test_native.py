"""The native kernel library: Requant / Im2col / BytePlane equal the numpy reference on edge cases, run
safely from many threads, and the loader refuses what it cannot use with one clear line."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import zonnx
import zonnx.hostcpu
from tests.backend.native_support import lowered_session
from tests.backend.test_ort_lowering import _tie_accs
from zonnx import zoo
from zonnx.backend import native
from zonnx.backend.compiler import Op, Program, TensorInfo, quantize_multiplier
from zonnx.backend.compiler.requant import ROUND_MODES, requantize
from zonnx.backend.runtime.ort_kernels import Builder, Term, storage_of
from zonnx.backend.runtime.ort_lowering import program_to_model
from zonnx.backend.runtime.ort_native import (
    NATIVE_DOMAIN,
    emit_byte_plane,
    emit_dwconv,
    emit_im2col,
    emit_maxpool_i32,
    emit_maxpool_u8,
    emit_native_requant,
    emit_qconv,
    emit_qdwconv,
    native_requant_attrs,
)
from zonnx.backend.runtime.reference import run_program
from zonnx.errors import OptionError
from zonnx.quantization.calibration.readers import ListReader

pytestmark = pytest.mark.exactness


def _model(b: Builder, out: str, ins: list[tuple[str, int, list | None]], out_type: int) -> onnx.ModelProto:
    b.op("Identity", [out], "y")
    g = helper.make_graph(
        b.nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in ins],
        [helper.make_tensor_value_info("y", out_type, None)],
        b.initializers,
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(NATIVE_DOMAIN, 1)]
    )
    model.ir_version = 10
    return model


@pytest.mark.parametrize("bits", [15, 31, 39])
@pytest.mark.parametrize("mode", ROUND_MODES)
def test_requant_ties_negatives_saturation(bits: int, mode: str) -> None:
    """Per-channel NCHW and NHWC, uint8 and int32 outputs; 39-bit multipliers (products beyond 2^62) take the __int128 loop."""
    rng = np.random.default_rng(bits)
    ratios = np.concatenate([rng.uniform(1e-5, 3e-3, 6), [0.5, 1.0]])
    pairs = [quantize_multiplier(float(r), min(bits, 31), (0, 63)) for r in ratios]
    m = np.array([p[0] for p in pairs], np.int64) << (bits - 31 if bits > 31 else 0)
    s = np.array([p[1] for p in pairs], np.int64) + (bits - 31 if bits > 31 else 0)
    bias = rng.integers(-5000, 5000, size=len(m))
    acc = _tie_accs(m, s, 64, rng).transpose(1, 0, 2).reshape(len(m), -1)
    acc = np.clip(acc, -(1 << 31), (1 << 31) - 1).astype(np.int32)
    for out_dtype, zp, lo, hi in (
        ("int8", -3, -128, 127),
        ("uint8", 131, 131, 255),
        ("int16", 5, -30000, 32767),
    ):
        want = requantize(
            acc.astype(np.int64) + bias[:, None], m[:, None], s[:, None], mode, zero_point=zp, lo=lo, hi=hi
        )
        st = storage_of(out_dtype)
        for nhwc in (False, True):
            b = Builder("r")
            term = Term("acc", m.astype(object), float(1 << 31))
            const = m.astype(object) * bias.astype(object)
            y = emit_native_requant(
                b, [term], const, s, mode, zp, lo, hi, st, (-1,) if nhwc else (-1, 1), where="t"
            )
            assert y is not None and b.nodes[-1].op_type in ("RequantU8", "RequantI32")
            wide = next(a.i for a in b.nodes[-1].attribute if a.name == "wide")
            assert wide == (bits == 39)
            sess = lowered_session(_model(b, y, [("acc", TensorProto.INT32, None)], st.onnx_type), True)
            feed = np.ascontiguousarray(acc.T) if nhwc else acc
            got = sess.run(None, {"acc": feed})[0].astype(np.int64) - st.offset
            got = got.T if nhwc else got
            assert np.array_equal(got, want), (mode, bits, out_dtype, nhwc, int(np.sum(got != want)))


@pytest.mark.parametrize("mode", ["half_even", "half_away", "trunc"])
def test_requant_two_terms_broadcast(mode: str) -> None:
    """Two uint8 terms of different shapes broadcast like numpy (the add of a program with broadcasting)."""
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, size=(2, 3, 4)).astype(np.uint8)
    c = rng.integers(0, 256, size=(3, 1)).astype(np.uint8)
    m, k, s = [7, -3], -1000, 3
    want = requantize(
        m[0] * a.astype(np.int64) + m[1] * c.astype(np.int64) + k, 1, s, mode, zero_point=4, lo=0, hi=200
    )
    for cc in (c, np.broadcast_to(c, a.shape).copy()):  # broadcast loop and same-shape loop
        b = Builder("r")
        terms = [Term("a", np.array(m[0]), 255), Term("c", np.array(m[1]), 255)]
        y = emit_native_requant(
            b, terms, np.array(k), np.array([s]), mode, 4, 0, 200, storage_of("uint8"), (), where="t"
        )
        sess = lowered_session(
            _model(b, y, [("a", TensorProto.UINT8, None), ("c", TensorProto.UINT8, None)], TensorProto.UINT8),
            True,
        )
        assert np.array_equal(sess.run(None, {"a": a, "c": cc})[0], want)


@pytest.mark.parametrize("mode", ROUND_MODES)
def test_requant_two_int32_terms(mode: str) -> None:
    """Two int32 terms into int32 (a 16-bit residual add, fused in one pass): per channel along the last axis
    (NHWC) and the second (NCHW); ties (both inputs 0 where K is a tie), negative multipliers and both clamp
    ends, equal to the numpy formula."""
    rng = np.random.default_rng(7)
    ch = 19
    pairs = [quantize_multiplier(float(r), 31, (0, 63)) for r in rng.uniform(1e-3, 0.9, ch)]
    m1 = np.array([p[0] for p in pairs], np.int64)
    s = np.array([p[1] for p in pairs], np.int64)
    m2 = (m1 * rng.uniform(0.2, 1.5, ch)).astype(np.int64)
    m2[:3] *= -1
    k = (rng.integers(-3, 4, size=ch) << s) + (1 << (s - 1))  # a tie where both inputs are 0
    x1, x2 = (rng.integers(0, 65536, size=(3, ch, 5, 7)).astype(np.int32) for _ in range(2))
    x1[0, :, 0], x2[0, :, 0] = 65535, 65535
    x1[1, :, 0], x2[1, :, 0] = 0, 65535
    x1[2, :, 0], x2[2, :, 0] = 0, 0
    acc = m1[:, None, None] * x1.astype(np.int64) + m2[:, None, None] * x2.astype(np.int64) + k[:, None, None]
    st = storage_of("int16")
    want = requantize(acc, 1, s[:, None, None], mode, zero_point=7, lo=-20000, hi=20000) + st.offset
    for nhwc in (False, True):
        b = Builder("r")
        terms = [Term("a", m1.astype(object), 65535.0), Term("c", m2.astype(object), 65535.0)]
        y = emit_native_requant(
            b,
            terms,
            k.astype(object),
            s,
            mode,
            7,
            -20000,
            20000,
            st,
            (-1,) if nhwc else (-1, 1, 1),
            where="t",
        )
        assert y is not None and b.nodes[-1].op_type == "RequantI32"
        assert next(a.i for a in b.nodes[-1].attribute if a.name == "wide") == 0
        inputs = [("a", TensorProto.INT32, None), ("c", TensorProto.INT32, None)]
        sess = lowered_session(_model(b, y, inputs, TensorProto.INT32), True)
        feed = [np.ascontiguousarray(v.transpose(0, 2, 3, 1)) if nhwc else v for v in (x1, x2)]
        got = sess.run(None, {"a": feed[0], "c": feed[1]})[0]
        got = got.transpose(0, 3, 1, 2) if nhwc else got
        assert np.array_equal(got, want), (mode, nhwc, int(np.sum(got != want)))


@pytest.mark.parametrize("dil", [[1, 2], [2, 1]])  # [2, 1]: adjacent taps copied as one run
@pytest.mark.parametrize("plane", [0, 1, 2])
def test_im2col_and_byte_planes(plane: int, dil: list[int]) -> None:
    rng = np.random.default_rng(plane)
    dtype, hi = (np.uint8, 256) if plane == 0 else (np.int32, 1 << 16)
    x = rng.integers(0, hi, size=(2, 7, 6, 3)).astype(dtype)
    kernel, strides, pads, pad = [3, 2], [2, 1], [1, 0, 2, 1], 300 if plane else 9
    b = Builder("i")
    y = emit_im2col(b, "x", kernel, strides, pads, dil, pad, plane)
    onnx_type = TensorProto.UINT8 if plane == 0 else TensorProto.INT32
    got = lowered_session(_model(b, y, [("x", onnx_type, None)], TensorProto.UINT8), True).run(
        None, {"x": x}
    )[0]
    xp = np.pad(
        x.astype(np.int64), [(0, 0), (pads[0], pads[2]), (pads[1], pads[3]), (0, 0)], constant_values=pad
    )
    oh = (xp.shape[1] - ((kernel[0] - 1) * dil[0] + 1)) // strides[0] + 1
    ow = (xp.shape[2] - ((kernel[1] - 1) * dil[1] + 1)) // strides[1] + 1
    taps = [
        xp[:, i * dil[0] : i * dil[0] + strides[0] * (oh - 1) + 1 : strides[0],
           j * dil[1] : j * dil[1] + strides[1] * (ow - 1) + 1 : strides[1]]
        for i in range(kernel[0]) for j in range(kernel[1])
    ]  # fmt: skip
    want = np.concatenate(taps, axis=3)
    want = {0: want, 1: want & 255, 2: want >> 8}[plane]
    assert got.shape == want.shape and np.array_equal(got, want)
    if plane:
        b = Builder("p")
        y = emit_byte_plane(b, "x", plane)
        sess = lowered_session(_model(b, y, [("x", TensorProto.INT32, None)], TensorProto.UINT8), True)
        assert np.array_equal(sess.run(None, {"x": x})[0], {1: x & 255, 2: x >> 8}[plane])


def test_concurrent_runs_equal_single_thread(tmp_path: Path) -> None:
    """8 threads calling run() on one native session give the single-threaded results bit for bit."""
    src = zoo.get("digits_cnn")
    feeds = zoo.sample_inputs("digits_cnn", 16, seed=2)
    q = tmp_path / "q.onnx"
    zonnx.quantize_static(str(src), str(q), ListReader(feeds[:4]), extra_options={"Target": "bm1684x"})
    opts = {"target": "bm1684x", "cache_dir": str(tmp_path / "c"), "kernels": "native"}
    sess = zonnx.InferenceSession(
        str(q), providers=[("ZonnxNPUExecutionProvider", opts), "CPUExecutionProvider"]
    )
    assert sess.kernels is not None and sess.kernels.available
    name = sess.get_inputs()[0].name
    single = [sess.run(None, {name: f[name]})[0] for f in feeds]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        multi = list(pool.map(lambda f: sess.run(None, {name: f[name]})[0], feeds * 4))
    assert all(np.array_equal(a, b) for a, b in zip(single * 4, multi, strict=True))
    onnx_opts = dict(opts, kernels="onnx")
    plain = zonnx.InferenceSession(
        str(q), providers=[("ZonnxNPUExecutionProvider", onnx_opts), "CPUExecutionProvider"]
    )
    assert not plain.kernels.available
    assert all(
        np.array_equal(plain.run(None, {name: f[name]})[0], s) for f, s in zip(feeds, single, strict=True)
    )


def test_loader_refuses_what_it_cannot_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Missing and foreign libraries: one line each; kernels=native then refuses, auto falls back."""
    monkeypatch.setenv("ZONNX_NATIVE_DIR", str(tmp_path))
    native.native_status.cache_clear()
    try:
        missing = native.native_status()
        assert not missing.available and "not built for these sources" in missing.reason
        path = native.library_path()
        path.parent.mkdir(parents=True)
        path.write_bytes(b"\x7fELF not really")
        native.native_status.cache_clear()
        foreign = native.native_status()
        assert not foreign.available and "not a zonnx kernel library" in foreign.reason
        with pytest.raises(OptionError, match="kernels=native: .*not a zonnx kernel library"):
            native.choose_kernels("native")
        with pytest.raises(OptionError, match="must be one of auto, native, onnx"):
            native.choose_kernels("fast")
        monkeypatch.setenv(native.KERNELS_ENV, "onnx")
        assert native.choose_kernels("auto").reason.startswith("pure-ONNX")
    finally:
        native.native_status.cache_clear()


def test_build_reports_a_compile_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler that fails names its first error line and the log (no headers download: they are cached)."""
    from zonnx.backend.native import build

    monkeypatch.setenv("CXX", "false")
    monkeypatch.setattr(build, "fetch_headers", lambda root=None: tmp_path)
    monkeypatch.setenv("ZONNX_NATIVE_DIR", str(tmp_path))
    with pytest.raises(native.NativeBuildError, match=r"did not compile: .*full log: .*build\.log"):
        build.build_library()
    monkeypatch.setenv("CXX", "")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(native.NativeBuildError, match="no C\\+\\+ compiler"):
        build.build_library()


@pytest.mark.parametrize(
    ("c", "stride", "pad", "dil"), [(32, 1, 1, 1), (32, 2, 1, 1), (7, 1, 2, 2), (2000, 1, 1, 1)]
)
def test_dwconv_matches_numpy(c: int, stride: int, pad: int, dil: int) -> None:
    """Depthwise sums (x - zp) w with the pad code adding 0; stride 1 runs whole rows per tap."""
    rng = np.random.default_rng(c)
    w = rng.integers(-128, 128, size=(c, 1, 3, 3))
    x = rng.integers(0, 256, size=(2, 9, 8, c)).astype(np.uint8)
    x[0] = 255
    b = Builder("d")
    y = emit_dwconv(b, "x", w, [stride, stride], [pad] * 4, [dil, dil], 7)
    got = lowered_session(_model(b, y, [("x", TensorProto.UINT8, None)], TensorProto.INT32), True).run(
        None, {"x": x}
    )[0]
    xp = np.pad(x.astype(np.int64) - 7, [(0, 0), (pad, pad), (pad, pad), (0, 0)])
    oh, ow = ((s + 2 * pad - 2 * dil - 1) // stride + 1 for s in x.shape[1:3])
    want = sum(
        xp[
            :,
            i * dil : i * dil + stride * (oh - 1) + 1 : stride,
            j * dil : j * dil + stride * (ow - 1) + 1 : stride,
        ]
        * w[:, 0, i, j]
        for i in range(3)
        for j in range(3)
    )
    assert got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize(("dt_a", "dt_b"), [("int16", "int16"), ("uint8", "int16")])
def test_matmul2_16bit(dt_a: str, dt_b: str) -> None:
    """Two 16-bit activations (attention's QK^T on A16 programs): byte-plane MatMulIntegers, one Requant."""
    rng = np.random.default_rng(5)

    def info(name: str, dt: str, shape: list[int]) -> TensorInfo:
        lo, hi = {"int16": (-32768, 32767), "uint8": (0, 255)}[dt]
        return TensorInfo(name, dt, lo, hi, [1.0], [0], None, shape)

    def codes(dt: str, shape: tuple) -> np.ndarray:
        lo, hi = {"int16": (-32768, 32768), "uint8": (0, 256)}[dt]
        return rng.integers(lo, hi, shape).astype(dt)

    a, b = codes(dt_a, (2, 5, 37)), codes(dt_b, (2, 37, 4))
    a[0, 0, :] = np.iinfo(dt_a).max  # saturating rows
    m, s = quantize_multiplier(3e-9 if dt_a == "int16" else 2e-4, 15)
    attrs = dict(
        zp_a=7 if dt_a == "uint8" else -300, zp_b=250, zp_out=-5, lo=-32768, hi=32767, round_mode="half_even"
    )
    ins = [info("a", dt_a, list(a.shape)), info("b", dt_b, list(b.shape))]
    out = info("y", "int16", None)
    op = Op("matmul2", "mm", ["a", "b"], ["y"], attrs, {"multiplier": np.array([m]), "shift": np.array([s])})
    prog = Program(ins, [out], [op], {t.name: t for t in [*ins, out]}, "test")
    ref = run_program(prog, {"a": a, "b": b})["y"]
    model = program_to_model(prog, name="p", native=True)
    assert sum(n.op_type == "MatMulInteger" for n in model.graph.node) == (4 if dt_a == "int16" else 2)
    got = lowered_session(model, True).run(None, {"p/a": a, "p/b": b})[0]
    assert np.array_equal(got.astype(np.int64), ref) and ref.min() < 0 < ref.max()


def test_a16w8_transformer_runs_in_ort(tmp_path: Path) -> None:
    """16-bit attention (matmul2 of two activations) runs on the native kernels, not the numpy fallback."""
    feeds = zoo.sample_inputs("transformer-random", 2, seed=1)
    q = tmp_path / "a16.onnx"
    zonnx.quantize_static(
        str(zoo.get("transformer-random")),
        str(q),
        ListReader(feeds),
        activation_type="int16",
        weight_type="int8",
        extra_options={"Target": "zhouyi-x2"},
    )

    def session(**extra: str) -> zonnx.InferenceSession:
        opts = {"target": "zhouyi-x2", "cache_dir": str(tmp_path / "c"), **extra}
        return zonnx.InferenceSession(
            str(q), providers=[("ZonnxNPUExecutionProvider", opts), "CPUExecutionProvider"]
        )

    fast, ref = session(kernels="native"), session(executor="reference")
    assert fast.executor == "ort" and fast.kernels.available
    for f in feeds:
        assert all(np.array_equal(a, b) for a, b in zip(fast.run(None, f), ref.run(None, f), strict=True))


def _qconv_case(
    rng: np.random.Generator,
    c: int,
    o: int,
    kernel: list[int],
    strides: list[int],
    pads: list[int],
    dil: list[int],
) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """(x NHWC uint8, w (kh kw C, O) int8, pad code, int64 acc = sum (col - pad) w over the padded input)."""
    x = rng.integers(0, 256, size=(2, 9, 8, c)).astype(np.uint8)
    x[0, :2] = 255  # saturated activations next to the padding
    w = rng.integers(-128, 128, size=(kernel[0] * kernel[1] * c, o)).astype(np.int8)
    w[:, 0] = -128  # the most negative weight in every tap of channel 0
    zp = 37
    xp = np.pad(
        x.astype(np.int64), [(0, 0), (pads[0], pads[2]), (pads[1], pads[3]), (0, 0)], constant_values=zp
    )
    oh = (xp.shape[1] - ((kernel[0] - 1) * dil[0] + 1)) // strides[0] + 1
    ow = (xp.shape[2] - ((kernel[1] - 1) * dil[1] + 1)) // strides[1] + 1
    taps = [
        xp[:, i * dil[0] : i * dil[0] + strides[0] * (oh - 1) + 1 : strides[0],
           j * dil[1] : j * dil[1] + strides[1] * (ow - 1) + 1 : strides[1]]
        for i in range(kernel[0]) for j in range(kernel[1])
    ]  # fmt: skip
    col = np.concatenate(taps, axis=3) - zp
    return x, w, zp, col @ w.astype(np.int64)


def _expected_isa(forced: str) -> set[str]:
    """The GEMM paths ``conv_isa`` may report on this CPU under ``$ZONNX_NATIVE_ISA=forced``."""
    host = zonnx.hostcpu.host_isa()
    best = {"amx-int8": "avx512-vnni", "avx512-vnni": "avx512-vnni", "avx-vnni": "avx-vnni"}.get(
        host, "portable"
    )
    if forced == "baseline" or best == "portable":
        return {"portable"}
    if forced == "avx-vnni":  # an AVX-512 VNNI CPU may lack the VEX form
        return {"avx-vnni"} if best == "avx-vnni" else {"avx-vnni", "portable"}
    return {best}


@pytest.mark.parametrize("isa", ["host", "avx-vnni", "baseline"])
@pytest.mark.parametrize(
    ("c", "o", "kernel", "strides", "pads", "dil"),
    [
        (5, 70, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),  # K = 45 (not a multiple of 4), a partial panel
        (3, 16, [7, 7], [2, 2], [3, 3, 3, 3], [1, 1]),  # the ResNet stem's geometry
        (8, 64, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1]),  # pointwise: rows read in place
        (4, 130, [3, 2], [2, 1], [0, 2, 1, 0], [2, 1]),  # asymmetric pads, dilation, three panels
        (64, 200, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),  # one block of positions: split into panel groups
    ],
)
@pytest.mark.parametrize("big", [False, True])
def test_qconv_matches_numpy(
    c: int,
    o: int,
    kernel: list,
    strides: list,
    pads: list,
    dil: list,
    isa: str,
    big: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """QConv (im2col tile + int8 GEMM + requantization in one kernel) == the numpy formula on every output,
    for each rounding mode, on the host's GEMM path and on the forced AVX-VNNI and portable ones; ``big``:
    one channel's constant M b above 2^52 (the float64 requantization form is then refused, the int64 one runs)."""
    if isa == "host":
        monkeypatch.delenv(native.ISA_ENV, raising=False)
    else:
        monkeypatch.setenv(native.ISA_ENV, isa)
    assert native.conv_isa() in _expected_isa(isa)
    rng = np.random.default_rng(o)
    x, w, zp, acc = _qconv_case(rng, c, o, kernel, strides, pads, dil)
    pairs = [quantize_multiplier(float(r), 31, (0, 63)) for r in rng.uniform(1e-5, 3e-3, o)]
    m, s = (np.array([p[i] for p in pairs], np.int64) for i in (0, 1))
    bias = rng.integers(-50000, 50000, size=o)
    if big:
        bias[0] = 2**23
        m[0], s[0] = 2**30, 62
    for mode in ROUND_MODES:
        want = requantize(acc + bias, m, s, mode, zero_point=3, lo=0, hi=255)
        term = Term("", m.astype(object), float(w.shape[0] * 255 * 128))
        attrs = native_requant_attrs(
            [term],
            m.astype(object) * bias.astype(object),
            s,
            mode,
            3,
            0,
            255,
            storage_of("uint8"),
            (-1,),
            where="t",
        )
        b = Builder("q")
        y = emit_qconv(b, "x", w, kernel, strides, pads, dil, zp, attrs)
        assert y is not None and [n.op_type for n in b.nodes] == ["QConv"]
        sess = lowered_session(_model(b, y, [("x", TensorProto.UINT8, None)], TensorProto.UINT8), True)
        got = sess.run(None, {"x": x})[0]
        assert got.shape == want.shape and np.array_equal(got, want), (mode, int(np.sum(got != want)))


@pytest.mark.parametrize("isa", ["host", "baseline"])
@pytest.mark.parametrize(
    ("c", "kernel", "stride", "pad", "dil"),
    # 96, 144: partial blocks; 32: two pixels per block (stride 1, any dilation: one 64-byte load; stride 2: halves)
    [
        (32, 3, 1, 1, 1),
        (96, 3, 2, 1, 1),
        (7, 3, 1, 2, 2),
        (144, 5, 1, 2, 1),
        (32, 3, 2, 1, 1),
        (32, 3, 1, 2, 2),
    ],
)
@pytest.mark.parametrize("big", [False, True])
def test_qdwconv_matches_numpy(
    c: int, kernel: int, stride: int, pad: int, dil: int, isa: str, big: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """QDwConv (depthwise sums and their requantization in one kernel) == the numpy formula on every output,
    for each rounding mode and a ReLU6-like clamp, on the host's path (AVX-512 VNNI here) and the portable one;
    ``big``: one channel's constant above 2^52 (the int64 requantization form instead of the float64 one)."""
    if isa == "host":
        monkeypatch.delenv(native.ISA_ENV, raising=False)
    else:
        monkeypatch.setenv(native.ISA_ENV, isa)
    rng = np.random.default_rng(c)
    w = rng.integers(-128, 128, size=(c, 1, kernel, kernel))
    w[0] = -128
    x = rng.integers(0, 256, size=(2, 9, 8, c)).astype(np.uint8)
    x[0, :2] = 255
    zp = 37
    xp = np.pad(x.astype(np.int64) - zp, [(0, 0), (pad, pad), (pad, pad), (0, 0)])
    oh, ow = ((s + 2 * pad - dil * (kernel - 1) - 1) // stride + 1 for s in x.shape[1:3])
    acc = sum(
        xp[
            :,
            i * dil : i * dil + stride * (oh - 1) + 1 : stride,
            j * dil : j * dil + stride * (ow - 1) + 1 : stride,
        ]
        * w[:, 0, i, j]
        for i in range(kernel)
        for j in range(kernel)
    )
    pairs = [quantize_multiplier(float(r), 31, (0, 63)) for r in rng.uniform(1e-4, 3e-2, c)]
    m, s = (np.array([p[i] for p in pairs], np.int64) for i in (0, 1))
    bias = rng.integers(-50000, 50000, size=c)
    if big:
        bias[0] = 2**23
        m[0], s[0] = 2**30, 62
    for mode, hi in zip(ROUND_MODES, [255, 200] * 4, strict=False):
        want = requantize(acc + bias, m, s, mode, zero_point=3, lo=3, hi=hi)
        term = Term("", m.astype(object), float(kernel * kernel * 255 * 128))
        attrs = native_requant_attrs(
            [term],
            m.astype(object) * bias.astype(object),
            s,
            mode,
            3,
            3,
            hi,
            storage_of("uint8"),
            (-1,),
            where="t",
        )
        b = Builder("q")
        y = emit_qdwconv(b, "x", w, [stride, stride], [pad] * 4, [dil, dil], zp, attrs)
        assert y is not None and [n.op_type for n in b.nodes] == ["QDwConv"]
        sess = lowered_session(_model(b, y, [("x", TensorProto.UINT8, None)], TensorProto.UINT8), True)
        got = sess.run(None, {"x": x})[0]
        assert got.shape == want.shape and np.array_equal(got, want), (mode, int(np.sum(got != want)))


@pytest.mark.parametrize("isa", ["host", "avx-vnni", "baseline"])
@pytest.mark.parametrize(
    ("c", "o", "kernel", "strides", "pads", "dil"),
    [
        (5, 70, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
        (3, 16, [7, 7], [2, 2], [3, 3, 3, 3], [1, 1]),  # the stem: kernel rows of 21 bytes, padded to 24
        (8, 130, [1, 1], [1, 1], [0] * 4, [1, 1]),
        (16, 200, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),  # two blocks of positions: split into panel groups
        (4, 70, [3, 2], [2, 1], [0, 2, 1, 0], [2, 1]),  # asymmetric pads, row dilation: kernel-row segments
        (6, 20, [2, 3], [1, 2], [1, 0, 0, 1], [1, 2]),  # column dilation: one segment per tap, 6 -> 8 bytes
    ],
)
@pytest.mark.parametrize("big", [False, True])
def test_qconv16_matches_numpy(
    c: int,
    o: int,
    kernel: list,
    strides: list,
    pads: list,
    dil: list,
    isa: str,
    big: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """QConv16 (16-bit codes x int8 weights: two byte planes, int64 combination, one requantization) == the
    numpy formula with exact int64 sums, for each rounding mode, on every GEMM path (the AVX-512 one reads
    the padded planes in kernel-row or tap segments, the others build im2col rows); ``big``: one multiplier
    beyond int32 (the AVX-512 requantization then takes int64 multipliers instead of vpmuldq)."""
    if isa == "host":
        monkeypatch.delenv(native.ISA_ENV, raising=False)
    else:
        monkeypatch.setenv(native.ISA_ENV, isa)
    rng = np.random.default_rng(o + c)
    x = rng.integers(0, 65536, size=(2, 9, 8, c)).astype(np.int32)
    x[0, :2] = 65535  # saturated codes next to the padding
    w = rng.integers(-128, 128, size=(kernel[0] * kernel[1] * c, o)).astype(np.int8)
    w[:, 0] = -128
    zp = 32768 + 1234  # a stored pad code with both bytes nonzero
    xp = np.pad(
        x.astype(np.int64), [(0, 0), (pads[0], pads[2]), (pads[1], pads[3]), (0, 0)], constant_values=zp
    )
    oh = (xp.shape[1] - ((kernel[0] - 1) * dil[0] + 1)) // strides[0] + 1
    ow = (xp.shape[2] - ((kernel[1] - 1) * dil[1] + 1)) // strides[1] + 1
    taps = [
        xp[:, i * dil[0] : i * dil[0] + strides[0] * (oh - 1) + 1 : strides[0],
           j * dil[1] : j * dil[1] + strides[1] * (ow - 1) + 1 : strides[1]]
        for i in range(kernel[0]) for j in range(kernel[1])
    ]  # fmt: skip
    acc = (np.concatenate(taps, axis=3) - zp) @ w.astype(np.int64)
    pairs = [quantize_multiplier(float(r), 31, (0, 63)) for r in rng.uniform(1e-4, 3e-2, o)]
    m, s = (np.array([p[i] for p in pairs], np.int64) for i in (0, 1))
    bias = rng.integers(-50000, 50000, size=o)
    if big:
        m[0], s[0] = 2**31 + 5, 45
    st = storage_of("int16")
    for mode in ROUND_MODES:
        want = requantize(acc + bias, m, s, mode, zero_point=-5, lo=-32768, hi=32767) + st.offset
        term = Term("", m.astype(object), float(w.shape[0] * 65535 * 128))
        attrs = native_requant_attrs(
            [term], m.astype(object) * bias.astype(object), s, mode, -5, -32768, 32767, st, (-1,), where="t"
        )
        b = Builder("q")
        y = emit_qconv(b, "x", w, kernel, strides, pads, dil, zp, attrs, wide=True)
        assert y is not None and [n.op_type for n in b.nodes] == ["QConv16"]
        sess = lowered_session(_model(b, y, [("x", TensorProto.INT32, None)], TensorProto.INT32), True)
        got = sess.run(None, {"x": x})[0]
        assert got.shape == want.shape and np.array_equal(got, want), (mode, int(np.sum(got != want)))


@pytest.mark.parametrize(
    ("kernel", "strides", "pads", "dil", "ceil"),
    [
        ([3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 0),
        ([3, 2], [2, 2], [1, 0, 0, 1], [1, 2], 1),
        ([2, 2], [3, 3], [0] * 4, [1, 1], 1),
    ],
)
@pytest.mark.parametrize("u8", [False, True])
def test_maxpool_i32_matches_ort(
    kernel: list, strides: list, pads: list, dil: list, ceil: int, u8: bool
) -> None:
    """MaxPoolI32 (NHWC int32 codes) and MaxPoolU8 (NHWC uint8 codes) == ORT's MaxPool on the same codes
    (float32: exact below 2^24), ceil_mode and end windows included; extremes next to the padding."""
    top = 255 if u8 else 65535
    x = np.random.default_rng(3).integers(0, top + 1, size=(2, 9, 10, 5)).astype(np.uint8 if u8 else np.int32)
    x[0, :, :2] = 0
    x[1, :2] = top
    attrs = {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dil, "ceil_mode": ceil}
    b = Builder("m")
    y = (emit_maxpool_u8 if u8 else emit_maxpool_i32)(b, "x", attrs)
    assert [n.op_type for n in b.nodes] == ["MaxPoolU8" if u8 else "MaxPoolI32"]
    t = TensorProto.UINT8 if u8 else TensorProto.INT32
    got = lowered_session(_model(b, y, [("x", t, None)], t), True).run(None, {"x": x})[0]
    node = helper.make_node(
        "MaxPool",
        ["x"],
        ["y"],
        kernel_shape=kernel,
        strides=strides,
        pads=pads,
        dilations=dil,
        ceil_mode=ceil,
    )
    g = helper.make_graph(
        [node],
        "p",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    ref = onnx.helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    ref.ir_version = 10
    sess = ort.InferenceSession(ref.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x.transpose(0, 3, 1, 2).astype(np.float32)})[0].transpose(0, 2, 3, 1)
    assert got.shape == want.shape and np.array_equal(got, want.astype(np.int64))
