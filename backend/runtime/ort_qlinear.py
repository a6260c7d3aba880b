"""Emit program convs and adds as ORT's fused QLinearConv / QLinearAdd where ``qlinear_exact`` proves them exact.

One fused kernel replaces im2col + MatMulInteger + the float64 requantization passes, and ORT's NHWC
transformer then runs whole chains of them channels-last. Returns None (caller uses the general lowering)
when an op does not qualify. Tensors are stored uint8 (``ort_kernels`` storage: code + offset).
"""

from __future__ import annotations

__all__ = ["conv_plan", "emit_qlinear_conv", "emit_qlinear_add", "emit_float32_add", "MS_DOMAIN"]

import math

import numpy as np

from zonnx.backend.compiler.program import Op
from zonnx.hostcpu import IntPath

from .ort_kernels import Builder, Storage, int8_weights
from .qlinear_exact import FLOOR_TYPE, ConvRequant, add_ratios, alpha_int, int32_safe, plan_conv_requant

MS_DOMAIN = "com.microsoft"


def conv_plan(op: Op, x_st: Storage, out_st: Storage) -> ConvRequant | None:
    """The QLinearConv requantization of ``op`` (any group), or None when it is not provably exact."""
    if x_st.dtype != np.uint8 or out_st.dtype != np.uint8:
        return None
    w = op.params["w"]
    if w.dtype != np.int8 or w.ndim != 4:
        return None
    a = op.attrs
    zs_out = int(a["zp_out"]) + out_st.offset
    plan = plan_conv_requant(op.params["multiplier"], op.params["shift"], a["round_mode"], zs_out, w.shape[0])
    if plan is None:
        return None
    zs_in = int(a["pad_value"]) + x_st.offset
    if not 0 <= zs_in <= 255:
        return None
    k = int(np.prod(w.shape[1:]))
    bias = _ort_bias(op, plan)
    bound = k * max(zs_in, 255 - zs_in) * int(np.abs(w.astype(np.int64)).max(initial=0))
    return plan if int32_safe(bound + int(np.abs(bias).max(initial=0))) else None


def _ort_bias(op: Op, plan: ConvRequant) -> np.ndarray:
    """``bias + pad_value * sum(w) + raise``: MLAS sums ``(x - zs_in) w``, the program ``q w`` with padding."""
    w = op.params["w"].astype(np.int64)
    wsum = w.reshape(w.shape[0], -1).sum(axis=1)
    bias = np.broadcast_to(op.params["bias"].astype(np.int64).reshape(-1), wsum.shape)
    return bias + int(op.attrs["pad_value"]) * wsum + plan.bias_raise


def _clip_u8(b: Builder, name: str, lo: int, hi: int) -> str:
    if lo <= 0 and hi >= 255:
        return name
    return b.op("Clip", [name, b.const(max(lo, 0), np.uint8, "lo"), b.const(min(hi, 255), np.uint8, "hi")])


def emit_qlinear_conv(
    b: Builder,
    x: str,
    op: Op,
    plan: ConvRequant,
    x_st: Storage,
    out_st: Storage,
    *,
    path: IntPath,
    channels_last: bool = False,
) -> str:
    """``QLinearConv`` (x_scale = y_scale = 1, w_scale = sigma) plus a uint8 Clip for narrow bounds.

    Weights by integer ``path`` (``ort_kernels.int8_weights``): ORT requires one weight zero point for
    all channels, which both forms have (0 or 128).

    ``channels_last``: ORT's ``com.microsoft`` QLinearConv on NHWC tensors (the kernel ORT's own NHWC
    transformer would pick; emitting it directly does not depend on that transformer's cost model).
    """
    a, w = op.attrs, op.params["w"]
    o = w.shape[0]
    sigma = plan.sigma if np.unique(plan.sigma).size > 1 else plan.sigma[:1].reshape(())
    bias = _ort_bias(op, plan).astype(np.int32)
    wname, wzp = int8_weights(b, w, path, (o,) if sigma.ndim else ())
    out = b.op(
        "QLinearConv",
        [
            x,
            b.const(1.0, np.float32, "one"),
            b.const(int(a["pad_value"]) + x_st.offset, np.uint8, "xzp"),
            wname,
            b.const(sigma, np.float32, "sigma"),
            wzp,
            b.const(1.0, np.float32, "one"),
            b.const(plan.y_zp, np.uint8, "yzp"),
            b.const(bias, np.int32, "bias"),
        ],
        kernel_shape=list(w.shape[2:]),
        strides=a["strides"],
        pads=a["pads"],
        dilations=a["dilations"],
        group=a["group"],
        **({"channels_last": 1, "domain": MS_DOMAIN} if channels_last else {}),
    )
    return _clip_u8(b, out, int(a["lo"]) + out_st.offset, int(a["hi"]) + out_st.offset)


def emit_qlinear_add(
    b: Builder, xa: str, xb: str, op: Op, sta: Storage, stb: Storage, out_st: Storage
) -> str | None:
    """``com.microsoft`` QLinearAdd when the add's result is an exact integer (``add_ratios``), else None."""
    if not sta.dtype == stb.dtype == out_st.dtype == np.uint8:
        return None
    a = op.attrs
    ratios = add_ratios([int(v) for v in op.params["multiplier"]], int(op.params["shift"][0]))
    zs = int(a["zp_out"]) + out_st.offset
    za, zb = int(a["zp_a"]) + sta.offset, int(a["zp_b"]) + stb.offset
    if ratios is None or not all(0 <= z <= 255 for z in (zs, za, zb)):
        return None
    out = b.op(
        "QLinearAdd",
        [
            xa,
            b.const(ratios[0], np.float32, "ra"),
            b.const(za, np.uint8, "za"),
            xb,
            b.const(ratios[1], np.float32, "rb"),
            b.const(zb, np.uint8, "zb"),
            b.const(1.0, np.float32, "one"),
            b.const(zs, np.uint8, "zc"),
        ],
        domain=MS_DOMAIN,
    )
    return _clip_u8(b, out, int(a["lo"]) + out_st.offset, int(a["hi"]) + out_st.offset)


def emit_float32_add(
    b: Builder, xa: str, xb: str, op: Op, sta: Storage, stb: Storage, out_st: Storage
) -> str | None:
    """A power-of-two add that rounds, in float32 (two DequantizeLinear, two Adds; ORT's variadic Sum was slower) + QuantizeLinear, exact by the bound below; else None.

    ``u = r_a (a - z_a) + r_b (b - z_b)`` with ``r_i = M_i / 2^s`` is a multiple of ``2^-s``. Floor-type
    modes: ``floor(u + A/2^s) + zs = round_ne(u + A/2^s + zs - 1/2 + 2^-(s+1))`` (no value is a tie any
    more); half_even: ``round_ne(u) + zs = round_ne(u + zs - Y) + Y`` with ``Y = zs mod 2``. QuantizeLinear
    (scale 1, zero point ``Y``) clamps to ``[-Y, 255 - Y]``, rounds half to even and adds ``Y``. Every
    float32 value is a multiple of ``2^-(s+1)`` below ``2^(22-s)`` in magnitude, hence exact.
    """
    a, mode = op.attrs, op.attrs["round_mode"]
    if not sta.dtype == stb.dtype == out_st.dtype == np.uint8:
        return None
    if mode not in FLOOR_TYPE and mode != "half_even":
        return None
    ms, s = [int(v) for v in op.params["multiplier"]], int(op.params["shift"][0])
    if s < 0 or any(m <= 0 or m & (m - 1) for m in ms):
        return None
    rs = [math.ldexp(m, -s) for m in ms]
    zs = int(a["zp_out"]) + out_st.offset
    za, zb = int(a["zp_a"]) + sta.offset, int(a["zp_b"]) + stb.offset
    y = zs % 2 if mode == "half_even" else 0
    c = -rs[0] * za - rs[1] * zb + zs - y
    if mode != "half_even":
        c += math.ldexp(alpha_int(mode, s), -s) - (0.5 - math.ldexp(1.0, -s - 1) if s > 0 else 0.0)
    if (rs[0] + rs[1]) * 255 + abs(c) >= math.ldexp(1.0, 22 - s):
        return None
    terms = [  # DequantizeLinear: (x - 0) * r in one pass from uint8 (exact: small integers times 2^k)
        b.op("DequantizeLinear", [name, b.const(r, np.float32, "r"), b.const(0, np.uint8, "z0")])
        for name, r in ((xa, rs[0]), (xb, rs[1]))
    ]
    v = b.op("Add", [b.op("Add", terms), b.const(c, np.float32, "c")])
    out = b.op("QuantizeLinear", [v, b.const(1.0, np.float32, "one"), b.const(y, np.uint8, "yzp")])
    return _clip_u8(b, out, int(a["lo"]) + out_st.offset, int(a["hi"]) + out_st.offset)
