"""ONNX nodes for the native kernel library's custom ops (domain ``zonnx.native``), bit-exact to the reference.

The library (``zonnx.backend.native``, C++ under ``backend/native/src``) adds six CPU kernels to ORT:

- ``RequantU8`` / ``RequantI32``: ``y = clamp(R((sum_t M_t[c] x_t + K[c]) / 2^s[c]) + zs, lo, hi)`` over one to
  four integer inputs of one shape (uint8, int32 or int64), per channel ``c`` along the axis
  ``caxis_from_end`` places from the end (inputs of different shapes broadcast like numpy, on a slower
  scalar loop), in the stored domain (``ort_kernels`` storage), with the
  rounding ``R`` of ``requant.rshift_round`` (``mode`` indexes ``ROUND_MODES``). Products are int64
  when ``sum max|x_t| max|M_t| + max|K| < 2^62`` and ``__int128`` otherwise (``wide``), so the result
  is the exact integer formula with no float step; shifts must lie in [0, 62] (negative shifts are
  folded into ``M`` and ``K`` as exact left shifts, as ``emit_requant`` does).
- ``Im2col``: NHWC ``[N, H, W, C] -> [N, OH, OW, KH KW C]`` uint8 with the stored pad value outside the
  input, columns in (kh, kw, c) order (the weight layout of ``emit_im2col_matmul``); ``plane`` 1/2 take
  the low/high byte of int32-stored 16-bit codes.
- ``BytePlane``: that byte selection elementwise.
- ``QConv``: a whole 8-bit convolution (NHWC uint8 in and out, int8 weights as (kh kw C, O)): im2col rows
  of a block of output positions built in cache, the int8 GEMM with int32 sums (AVX-512 VNNI or AVX-VNNI
  where the CPU has it, else portable C++: the same exact integers), and RequantU8's one-term rule on every finished
  tile, in one kernel; ``x_zero_point`` is the stored pad code, subtracted from every column. The weights
  must be an initializer (packed once when ORT creates the kernel). Optionally a residual add fused in:
  input 2 a uint8 skip tensor ``x`` and attributes ``add_mult`` (``M1`` for each of ``n`` channels, then
  ``M2``; ``n`` is 1 or the output channels), ``add_cnst``, ``add_shift`` (``n`` each), ``add_mode``,
  ``add_zs``, ``add_lo``, ``add_hi``: every finished output row ``v`` (the conv's own requantized codes)
  becomes RequantU8's two-term ``clamp(R((M1 v + M2 x + K) / 2^s) + zs, lo, hi)`` while in cache, per
  channel along C, int64 products only (``ort_fuse`` emits it); a skip tensor of another shape is added
  with numpy broadcasting after the conv.
- ``QConv16``: the same for int32-stored 16-bit codes in and out: each im2col row is split into its low and
  high byte planes, both multiplied by the int8 weights (exact int32 sums), combined in int64 as
  ``256 S_hi + S_lo - x_zero_point sum w`` and requantized once (``x_zero_point`` up to 65535).
- ``DwConv``: depthwise convolution of an NHWC uint8 tensor with int8 weights (attribute, ``[C, kh, kw]``),
  ``sum (x - zp) w`` in int32 (exact: ``kh kw 255 128 < 2^31``), positions outside the input adding 0.
- ``QDwConv``: ``DwConv``'s sums requantized by RequantU8's one-term rule in the same kernel (uint8 out; the
  clamp ``[lo, hi]`` carries a fused ReLU/ReLU6), each output row's sums kept in cache: no int32 tensor.

- ``Int8ToU8``: int8 program inputs to their uint8 storage, ``q + 128`` (the byte with its top bit flipped),
  one pass instead of Cast + Add + Cast.
- ``SumHwU8``: the window sums of a global average pool on NHWC uint8 (int32 ``[N, 1, 1, C]``), one pass
  instead of Cast + ReduceSum.
- ``MaxPoolU8``: the same windows on NHWC uint8 codes (8-bit programs; faster than ORT's NhwcMaxPool).
- ``MaxPoolI32``: NHWC max pooling of int32-stored codes (16-bit programs), ONNX MaxPool's windows and
  output size (``ceil_mode`` too), padding never winning; integer comparisons, so exact for any width.

So an 8-bit convolution is one ``QConv`` (or, when its requantization needs int128 products or an int32
output, ``Im2col -> MatMulInteger -> RequantU8``) instead of Pad, one Slice per tap, Concat, MatMulInteger
and four to five float64 passes; a 16-bit one is one Im2col and one
MatMulInteger per byte plane and a single ``Requant`` whose terms are the planes with multipliers
``256^k M`` (``sum x w = sum_ij 256^(i+j) sum x_i w_j``, ``ort_wide``).
"""

from __future__ import annotations

__all__ = [
    "NATIVE_DOMAIN",
    "emit_native_requant",
    "native_requant_attrs",
    "emit_qconv",
    "emit_im2col",
    "emit_byte_plane",
    "emit_dwconv",
    "emit_qdwconv",
    "emit_maxpool_i32",
    "emit_maxpool_u8",
    "emit_int8_to_u8",
    "emit_sum_hw_u8",
    "is_depthwise",
    "native_plane_terms",
    "native_matmul2_terms",
]

import logging

import numpy as np

from zonnx.backend.compiler.requant import ROUND_MODES, canonical_round_mode
from zonnx.hostcpu import IntPath

from .ort_kernels import Builder, KernelError, Storage, Term, int8_weights

logger = logging.getLogger(__name__)

NATIVE_DOMAIN = "zonnx.native"
_I62 = 1 << 62
_I63 = 1 << 63
_OPS = {np.dtype(np.uint8): "RequantU8", np.dtype(np.int32): "RequantI32"}


def native_requant_attrs(
    terms: list[Term],
    const: np.ndarray,
    shift: np.ndarray,
    mode: str,
    zp: int,
    lo: int,
    hi: int,
    out_storage: Storage,
    bshape: tuple[int, ...],
    *,
    where: str,
) -> dict | None:
    """The ``Requant`` attributes of ``emit_requant``'s formula (same arguments), or None when the op cannot
    take it: more than four terms, a shift above 62 or an integer that does not fit int64."""
    if np.dtype(out_storage.dtype) not in _OPS or not 1 <= len(terms) <= 4:
        return None
    s = np.asarray(shift, dtype=np.int64).reshape(-1)
    sizes = [s.size, np.asarray(const).size] + [np.asarray(t.multiplier).size for t in terms]
    n = max(sizes)
    if any(v not in (1, n) for v in sizes):
        return None
    s = np.broadcast_to(s, (n,))
    left = [max(-int(v), 0) for v in s]
    ms = [
        [
            int(v) << sh
            for v, sh in zip(np.broadcast_to(np.asarray(t.multiplier).reshape(-1), (n,)), left, strict=True)
        ]
        for t in terms
    ]
    cs = [
        int(v) << sh for v, sh in zip(np.broadcast_to(np.asarray(const).reshape(-1), (n,)), left, strict=True)
    ]
    shifts = [max(int(v), 0) for v in s]
    if max(shifts) > 62 or any(abs(v) >= _I63 for v in cs + [m for row in ms for m in row]):
        return None
    off = out_storage.offset
    zs, los, his = zp + off, max(lo, 0 - off) + off, hi + off
    if los < 0:
        raise KernelError(f"op {where!r}: clamp bound {lo} is below the storage range.")
    bound = sum(t.xmax * max(abs(v) for v in m) for t, m in zip(terms, ms, strict=True)) + max(
        abs(v) for v in cs
    )
    caxis = len(bshape) - 1 if n > 1 and bshape else 0  # bshape (-1, 1, 1): NCHW; () or (-1,): last axis
    return {
        "terms": len(terms),
        "mult": [v for row in ms for v in row],
        "cnst": cs,
        "shift": shifts,
        "mode": ROUND_MODES.index(canonical_round_mode(mode)),
        "zs": int(zs),
        "lo": int(los),
        "hi": int(his),
        "caxis_from_end": caxis,
        "wide": int(bound >= _I62),
    }


def emit_native_requant(
    b: Builder,
    terms: list[Term],
    const: np.ndarray,
    shift: np.ndarray,
    mode: str,
    zp: int,
    lo: int,
    hi: int,
    out_storage: Storage,
    bshape: tuple[int, ...],
    *,
    where: str,
) -> str | None:
    """One ``Requant`` node for ``emit_requant``'s formula (same arguments), or None when it cannot take it
    (``native_requant_attrs``); the ONNX lowering then handles the op."""
    attrs = native_requant_attrs(terms, const, shift, mode, zp, lo, hi, out_storage, bshape, where=where)
    if attrs is None:
        return None
    op_type = _OPS[np.dtype(out_storage.dtype)]
    return b.op(op_type, [t.name for t in terms], **attrs, domain=NATIVE_DOMAIN)


def _fused_requant(requant: dict, channels: int) -> dict | None:
    """The requantization attributes a fused kernel (QConv, QConv16, QDwConv) takes: one int64 term, the
    per-channel ``mult``/``cnst``/``shift`` spelled out for each of ``channels``; None when ``requant``
    has several terms, int128 products or a per-channel list of another length."""
    if requant["terms"] != 1 or requant["wide"]:
        return None
    per = {k: list(requant[k]) for k in ("mult", "cnst", "shift")}
    if any(len(v) not in (1, channels) for v in per.values()):
        return None
    per = {k: v * channels if len(v) == 1 else v for k, v in per.items()}
    return {"mode": requant["mode"], "zs": requant["zs"], "lo": requant["lo"], "hi": requant["hi"], **per}


def emit_qconv(
    b: Builder,
    x: str,
    wm: np.ndarray,
    kernel: list[int],
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    xzp: int,
    requant: dict,
    *,
    wide: bool = False,
) -> str | None:
    """One ``QConv`` (im2col tile, int8 GEMM, requantization in one kernel) for an NHWC uint8 tensor, int8
    weights ``wm`` as (kh kw C, O) and the one-term uint8 ``requant`` attributes of ``native_requant_attrs``;
    None when they do not fit it (int128 products, several terms, or int32 sums that could overflow).
    ``wide``: ``QConv16`` (int32-stored 16-bit codes in, int32 codes out, ``requant`` for int32 storage)."""
    if wm.shape[0] * 255 * 128 >= 1 << 31:
        return None
    fused = _fused_requant(requant, wm.shape[1])
    if fused is None:
        return None
    return b.op(
        "QConv16" if wide else "QConv",
        [x, b.const(wm.astype(np.int8), np.int8, "w")],
        kernel=list(kernel),
        strides=list(strides),
        pads=list(pads),
        dilations=list(dilations),
        x_zero_point=int(xzp),
        **fused,
        domain=NATIVE_DOMAIN,
    )


def emit_im2col(
    b: Builder,
    x: str,
    kernel: list[int],
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    pad: int,
    plane: int,
) -> str:
    """``Im2col`` of an NHWC tensor (module docstring); ``pad`` is the stored pad value."""
    return b.op(
        "Im2col",
        [x],
        kernel=list(kernel),
        strides=list(strides),
        pads=list(pads),
        dilations=list(dilations),
        pad_value=int(pad),
        plane=int(plane),
        domain=NATIVE_DOMAIN,
    )


def emit_byte_plane(b: Builder, x: str, plane: int) -> str:
    """The low (1) or high (2) byte of an int32-stored 16-bit tensor, as uint8."""
    return b.op("BytePlane", [x], plane=int(plane), domain=NATIVE_DOMAIN)


def is_depthwise(w: np.ndarray, group: int, channels_in: int | None) -> bool:
    """One int8 filter per input channel (``DwConv`` takes it): ``group == C_in == C_out``, 2-D."""
    return (
        w.ndim == 4
        and w.shape[1] == 1
        and group == w.shape[0]
        and channels_in in (None, group)
        and bool(w.size == 0 or (int(w.min()) >= -128 and int(w.max()) <= 127))
    )


def emit_dwconv(
    b: Builder, x: str, w: np.ndarray, strides: list[int], pads: list[int], dilations: list[int], zp: int
) -> str:
    """``DwConv`` of an NHWC uint8 tensor: int32 ``sum (x - zp) w`` per channel (module docstring)."""
    return b.op(
        "DwConv",
        [x],
        weights=[int(v) for v in w.reshape(-1)],
        kernel=list(w.shape[2:]),
        strides=list(strides),
        pads=list(pads),
        dilations=list(dilations),
        x_zero_point=int(zp),
        domain=NATIVE_DOMAIN,
    )


def emit_qdwconv(
    b: Builder,
    x: str,
    w: np.ndarray,
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    zp: int,
    requant: dict,
) -> str | None:
    """One ``QDwConv`` (depthwise sums and their requantization in one kernel) for an NHWC uint8 tensor and
    the one-term uint8 ``requant`` attributes of ``native_requant_attrs``; None when they do not fit it
    (int128 products or several terms: ``DwConv`` and a ``Requant`` then run it)."""
    fused = _fused_requant(requant, w.shape[0])
    if fused is None:
        return None
    return b.op(
        "QDwConv",
        [x],
        weights=[int(v) for v in w.reshape(-1)],
        kernel=list(w.shape[2:]),
        strides=list(strides),
        pads=list(pads),
        dilations=list(dilations),
        x_zero_point=int(zp),
        **fused,
        domain=NATIVE_DOMAIN,
    )


def emit_int8_to_u8(b: Builder, x: str) -> str:
    """``Int8ToU8``: the uint8 storage ``q + 128`` of the int8 tensor ``x`` (``ort_kernels.storage_of``)."""
    return b.op("Int8ToU8", [x], domain=NATIVE_DOMAIN)


def emit_sum_hw_u8(b: Builder, x: str) -> str:
    """``SumHwU8``: int32 ``[N, 1, 1, C]`` sums over H and W of the NHWC uint8 tensor ``x``."""
    return b.op("SumHwU8", [x], domain=NATIVE_DOMAIN)


def emit_maxpool_i32(b: Builder, x: str, attrs: dict) -> str:
    """``MaxPoolI32`` of an NHWC int32 tensor with a maxpool op's ``kernel``/``strides``/``pads``/
    ``dilations``/``ceil_mode`` attributes (2-D)."""
    return _maxpool(b, "MaxPoolI32", x, attrs)


def emit_maxpool_u8(b: Builder, x: str, attrs: dict) -> str:
    """``MaxPoolU8``: the same on an NHWC uint8 tensor (8-bit codes)."""
    return _maxpool(b, "MaxPoolU8", x, attrs)


def _maxpool(b: Builder, op_type: str, x: str, attrs: dict) -> str:
    kernel = list(attrs["kernel"])
    return b.op(
        op_type,
        [x],
        kernel=kernel,
        strides=list(attrs["strides"]),
        pads=list(attrs["pads"]),
        dilations=list(attrs.get("dilations") or [1] * len(kernel)),
        ceil_mode=int(attrs.get("ceil_mode", 0)),
        domain=NATIVE_DOMAIN,
    )


def _code_planes(b: Builder, name: str, st: Storage, zs: int) -> list[tuple[str, int, int]]:
    """[(uint8 plane, its zero point byte, byte power)]: ``stored - zs`` as ``sum 256^i (plane_i - z_i)``."""
    if st.dtype == np.uint8:
        return [(name, zs, 0)]
    return [(emit_byte_plane(b, name, 1), zs & 255, 0), (emit_byte_plane(b, name, 2), zs >> 8, 1)]


def native_matmul2_terms(
    b: Builder, xa: str, sta: Storage, za: int, xb: str, stb: Storage, zb: int, multiplier: int, k: int | None
) -> list[Term]:
    """Requant terms of ``M sum_k (a - za)(b - zb)`` for stored activations of 8 or 16 bits: with
    ``a - za = sum_i 256^i (a_i - z_i)`` over byte planes (and likewise ``b``), the product is
    ``sum_ij 256^(i+j) MatMulInteger(a_i, b_j, z_i, w_j)``, each exact in int32 (``K 255 255 < 2^31``)."""
    if k is not None and k * 255 * 255 >= 1 << 31:
        raise KernelError(f"{k} products per output overflow int32 byte-plane sums.")
    bound = float(k * 255 * 255) if k is not None else float((1 << 31) - 1)
    terms = []
    for pa, zpa, i in _code_planes(b, xa, sta, za):
        for pb, zpb, j in _code_planes(b, xb, stb, zb):
            mm = b.op(
                "MatMulInteger",
                [pa, pb, b.const(zpa, np.uint8, "azp"), b.const(zpb, np.uint8, "bzp")],
            )
            terms.append(Term(mm, np.array(multiplier * 256 ** (i + j), dtype=object), bound))
    return terms


def _weight_planes(w: np.ndarray) -> list[tuple[np.ndarray, int, bool]]:
    """[(plane, byte power, signed)]: int8 weights as one signed plane, else unsigned low + signed high."""
    w = w.astype(np.int64)
    if w.size == 0 or (int(w.min()) >= -128 and int(w.max()) <= 127):
        return [(w, 0, True)]
    lo = w & 255
    return [(lo, 0, False), ((w - lo) >> 8, 1, True)]


def native_plane_terms(
    b: Builder, planes: list[tuple[str, int]], wm: np.ndarray, multiplier: np.ndarray, path: IntPath
) -> list[Term]:
    """Requant terms ``256^(i+j) M (x_i @ w_j)``: one MatMulInteger per input plane ``x_i`` (uint8, its
    byte power ``i``) and weight plane ``w_j`` of the (K, N) weights ``wm`` (exact int32 sums: K 255 255 <
    2^31, checked)."""
    k = wm.shape[0]
    if k * 255 * 255 >= 1 << 31:
        raise KernelError(f"{k} products per output overflow int32 byte-plane sums.")
    m = np.asarray(multiplier, dtype=object).reshape(-1)
    terms = []
    for name, i in planes:
        for wj, j, signed in _weight_planes(wm):
            if signed:
                wname, wzp = int8_weights(b, wj, path)
            else:
                wname, wzp = b.const(wj.astype(np.uint8), np.uint8, "w"), b.const(0, np.uint8, "wzp")
            mm = b.op("MatMulInteger", [name, wname, b.const(0, np.uint8, "xzp"), wzp])
            xmax = k * 255 * int(np.abs(wj).max(initial=0))
            terms.append(Term(mm, m * (256 ** (i + j)), xmax))
    return terms
