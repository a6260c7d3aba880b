"""``conv``: a 2-D convolution with constant weights, fused bias, Relu/Clip and requantization.

Integer formula (``real = S (q - Z)``; ``R(v, s)`` is ``rshift_round(v, s, quant.requant.round_mode)``)::

    acc  = conv(pad(q_x, Z_x), w) + b'        padding with Z_x;  b' = b_acc - Z_x * sum(q_w)  (per oc)
    b_acc = round(B / (S_x S_w))              (= the int32 bias codes when S_b == S_x S_w)
    q_y  = clamp(R(acc * M[oc], shift[oc]) + Z_y, lo, hi)
    M / 2^shift ~= S_x S_w / S_y              (per channel with per-channel weights)

``lo = max(qmin, Z_y)`` for a fused Relu; Clip(a, b) gives ``lo/hi = Q_y(a)/Q_y(b)`` (exact: Q is
monotone). Power-of-two targets (``requant.mode = "shift"``) have ``M = 1``, ``shift = wpos + ipos - opos``.
Shared steps: ``compiler.linear``. Weights must be quantized per output channel (axis 0).

Reference: ``acc`` by im2col and an exact integer product (``runtime.ref_math``), grouped convolutions by
a float64 einsum that is exact below 2^53 (checked).

ORT lowering (``sum (q - Z_x) w`` with zero-point padding; that term and the folded bias go into one
requantization constant): group 1 NHWC as im2col (Pad with ``Z_x + off``, one strided Slice per tap,
Concat) and one ``MatMulInteger`` (2.3-7x faster per 3x3 layer than ConvInteger); grouped NCHW as
``ConvInteger(x_u8, w + 128 as u8, x_zp = Z_x + off, w_zp = 128)``; 16-bit codes by byte planes
(``ort_wide``); ``QLinearConv`` where its float32 requantization is provably exact (``qlinear_exact``).
Native kernels (``ort_native``): ``QConv`` (im2col tile, int8 GEMM and requantization in one kernel),
``DwConv`` for depthwise, ``Im2col`` / ``BytePlane`` + ``MatMulInteger`` + ``RequantU8/I32`` otherwise.
"""

from __future__ import annotations

__all__ = ["SPEC", "compile_conv", "reference", "lower_ort", "layout", "wants_nhwc"]

import logging
from typing import Any

import numpy as np

from zonnx.backend.compiler.linear import linear_operands, linear_params
from zonnx.backend.compiler.params import QParams, broadcast_channels, node_attrs
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.requant import requantize
from zonnx.backend.compiler.values import CompileError
from zonnx.backend.runtime.ort_kernels import Storage, Term, emit_im2col_matmul, int8_weights
from zonnx.backend.runtime.ort_native import (
    emit_byte_plane,
    emit_dwconv,
    emit_im2col,
    emit_qconv,
    emit_qdwconv,
    is_depthwise,
    native_plane_terms,
    native_requant_attrs,
)
from zonnx.backend.runtime.ort_qlinear import conv_plan, emit_qlinear_conv
from zonnx.backend.runtime.ort_values import Val, is_rank4
from zonnx.backend.runtime.ort_wide import emit_wide_conv, is_int8
from zonnx.backend.runtime.ref_math import EXACT_F64, ReferenceError, matmul_exact, pad_nchw, windows

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)


# -- compile rule ----------------------------------------------------------------------------------
def compile_conv(low: Any, p: Any, out: str, qp: QParams, sources: list[str], base: dict) -> None:
    """Emit the ``conv`` of a pending Conv whose output quantizer writes ``out`` on grid ``qp``."""
    node = p.node
    x, w, bias = linear_operands(p)
    xq, wq = x.qp, w.qp
    _, zx = xq.per_tensor(f"node {node.name!r} input")
    sy, _ = qp.per_tensor(f"node {node.name!r} output")
    a = node_attrs(node)
    wv = np.asarray(w.value, np.int64)
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise CompileError(
            f"node {node.name!r}: auto_pad is not supported; run the optimizer to make pads explicit."
        )
    if wq.axis not in (None, 0):
        raise CompileError(f"node {node.name!r}: weights must be quantized per output channel (axis 0).")
    n_out, spatial = wv.shape[0], wv.ndim - 2
    w_int = wv - broadcast_channels(wq.zp, wv.ndim, wq.axis)
    sw = np.broadcast_to(wq.scale.reshape(-1), (n_out,))
    attrs = {
        "strides": list(a.get("strides", [1] * spatial)),
        "pads": list(a.get("pads", [0] * 2 * spatial)),
        "dilations": list(a.get("dilations", [1] * spatial)),
        "group": int(a.get("group", 1)),
        "pad_value": zx,
    }
    params = linear_params(node, "conv", w_int, sw, 1.0, 1.0, xq, bias, sy, p.mul, low.target)
    attrs.update(base, round_mode=low.target.quant.requant.round_mode)
    low.emit("conv", node.name, [x.tensor], [out], attrs, params, sources)


# -- reference ---------------------------------------------------------------------------------------
def reference(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``clamp(R(conv(pad(q_x, pad_value), w) + bias, M[oc], s[oc]) + zp_out)`` in int64."""
    x = args[0]
    a, w = op.attrs, op.params["w"].astype(np.int64)
    if x.ndim != 4:
        raise ReferenceError(
            f"op {op.name!r}: the reference runs 2-D convolutions only (input rank {x.ndim})."
        )
    xp = pad_nchw(x, a["pads"], a["pad_value"])
    win = windows(xp, list(w.shape[2:]), a["strides"], a["dilations"])
    n, _, oh, ow = win.shape[:4]
    o, cg, kh, kw = w.shape
    g = a["group"]
    if g == 1:
        cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, cg * kh * kw)
        acc = matmul_exact(cols, w.reshape(o, -1).T).reshape(n, oh, ow, o).transpose(0, 3, 1, 2)
    else:
        wg = w.reshape(g, o // g, cg, kh, kw).astype(np.float64)
        xg = win.reshape(n, g, cg, oh, ow, kh, kw).astype(np.float64)
        if cg * kh * kw * float(np.abs(xg).max(initial=0)) * float(np.abs(wg).max(initial=0)) >= EXACT_F64:
            raise ReferenceError(f"op {op.name!r}: grouped convolution sums may exceed 2^53.")
        acc = np.einsum("ngcxyij,gocij->ngoxy", xg, wg, optimize=True).reshape(n, o, oh, ow).astype(np.int64)
    acc = acc + op.params["bias"].reshape(1, -1, 1, 1)
    m, s = op.params["multiplier"].reshape(-1, 1, 1), op.params["shift"].reshape(-1, 1, 1)
    return requantize(acc, m, s, a["round_mode"], zero_point=a["zp_out"], lo=a["lo"], hi=a["hi"])


# -- ORT lowering ------------------------------------------------------------------------------------
def wants_nhwc(op: Op, x: Val, native: bool = False) -> bool:
    """Group-1 2-D convolutions (im2col + MatMulInteger; any code width with the native ops, and
    depthwise ones with ``DwConv``) run channels-last."""
    if x.info.shape is not None and len(x.info.shape) != 4:
        return False
    if native:
        shape = x.info.shape
        cin = shape[1] if shape is not None and isinstance(shape[1], int) else None
        depthwise = x.st.dtype == np.uint8 and is_depthwise(op.params["w"], op.attrs["group"], cin)
        return op.attrs["group"] == 1 or depthwise
    return op.attrs["group"] == 1 and x.st.dtype == np.uint8 and is_int8(op.params["w"])


def layout(low: Any, op: Op, args: list[Val], ost: Storage) -> bool:
    """Channels-last for QLinearConv (planned here) and for ``wants_nhwc`` convolutions."""
    plan = conv_plan(op, args[0].st, ost) if low.qlinear else None
    if plan is not None:  # QLinearConv: channels-last (com.microsoft) unless NHWC is off
        low.plans[op.name] = plan
        return low.nhwc_ok and is_rank4(args[0])
    return low.nhwc_ok and wants_nhwc(op, args[0], low.native)


def _rq_attrs(
    low: Any, op: Op, term: Term, const: object, ost: Storage, dtype: type = np.uint8
) -> dict | None:
    """The one-term requantization attributes of a fused native conv with ``dtype`` output, else None."""
    if np.dtype(ost.dtype) != np.dtype(dtype):
        return None
    form = low.requant_form(op, [term], const, ost, (-1,))
    return native_requant_attrs(*form.args(), where=form.where)


def _qconv(
    low: Any, op: Op, x: Val, wm: np.ndarray, geo: tuple, term: Term, const: object, ost: Storage
) -> str | None:
    """The whole conv as one native ``QConv`` (uint8 output, one int64 requantization term), else None."""
    rq = _rq_attrs(low, op, term, const, ost)
    return None if rq is None else emit_qconv(low.b, x.name, wm, *geo, rq)


def _native_conv(low: Any, op: Op, x: Val, ost: Storage, wsum: np.ndarray) -> str:
    """NHWC group-1 conv by the native ops: Im2col per byte plane, MatMulInteger, one Requant."""
    a, w = op.attrs, op.params["w"].astype(np.int64)
    m = op.params["multiplier"].astype(object)
    o, c, kh, kw = w.shape
    wm = np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(kh * kw * c, o))
    zs = int(a["pad_value"]) + x.st.offset
    if a["group"] != 1:  # depthwise (wants_nhwc): QDwConv, else DwConv sums (x - zs) w + one Requant
        xm = kh * kw * max(zs, 255 - zs) * int(np.abs(w).max(initial=0))
        const = m * (op.params["bias"].astype(object) + int(a["pad_value"]) * wsum.astype(object))
        rq = _rq_attrs(low, op, Term("", m, xm), const, ost)
        geo_dw = (a["strides"], a["pads"], a["dilations"], zs)
        fused = None if rq is None else emit_qdwconv(low.b, x.name, w, *geo_dw, rq)
        if fused is not None:
            return fused
        acc = emit_dwconv(low.b, x.name, w, *geo_dw)
        return low.req(op, [Term(acc, m, xm)], const, ost, (-1,))
    geo = (list(w.shape[2:]), a["strides"], a["pads"], a["dilations"], zs)
    pointwise = (kh, kw) == (1, 1) and list(a["strides"]) == [1, 1] and not any(a["pads"])
    if x.st.dtype == np.uint8 and is_int8(w):  # one uint8 plane with the pad code as zero point
        xm = wm.shape[0] * max(zs, 255 - zs) * int(np.abs(w).max(initial=0))
        const = m * (op.params["bias"].astype(object) + int(a["pad_value"]) * wsum.astype(object))
        fused = _qconv(low, op, x, wm, geo, Term("", m, xm), const, ost)
        if fused is not None:
            return fused
        col = x.name if pointwise else emit_im2col(low.b, x.name, *geo, 0)
        wname, wzp = int8_weights(low.b, wm.astype(np.int8), low.path)
        mm = low.b.op("MatMulInteger", [col, wname, low.b.const(zs, np.uint8, "xzp"), wzp])
        return low.req(op, [Term(mm, m, xm)], const, ost, (-1,))
    if np.dtype(x.info.dtype).itemsize == 2 and ost.dtype == np.int32 and is_int8(w):  # 16-bit: QConv16
        xm = wm.shape[0] * max(zs, 65535 - zs) * int(np.abs(w).max(initial=0))
        const = m * (op.params["bias"].astype(object) + int(a["pad_value"]) * wsum.astype(object))
        rq = _rq_attrs(low, op, Term("", m, xm), const, ost, np.int32)
        fused = None if rq is None else emit_qconv(low.b, x.name, wm, *geo, rq, wide=True)
        if fused is not None:
            return fused
    if x.st.dtype == np.uint8:
        planes = [(emit_im2col(low.b, x.name, *geo, 0), 0)]
    else:  # split the stored codes into byte planes once, then im2col each plane by copies
        lo, hi = emit_byte_plane(low.b, x.name, 1), emit_byte_plane(low.b, x.name, 2)
        planes = [
            (emit_im2col(low.b, lo, *geo[:4], zs & 255, 0), 0),
            (emit_im2col(low.b, hi, *geo[:4], zs >> 8, 0), 1),
        ]
    terms = native_plane_terms(low.b, planes, wm, m, low.path)
    const = m * (op.params["bias"].astype(object) - x.st.offset * wsum.astype(object))
    return low.req(op, terms, const, ost, (-1,))


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """Exact ORT nodes of ``conv`` (module docstring); returns the stored output."""
    (x,), a, w = args, op.attrs, op.params["w"].astype(np.int64)
    if op.name in low.plans:
        return emit_qlinear_conv(
            low.b, x.name, op, low.plans[op.name], x.st, ost, path=low.path, channels_last=x.nhwc
        )
    wsum = w.reshape(w.shape[0], -1).sum(axis=1)
    if low.native and x.nhwc:
        return _native_conv(low, op, x, ost, wsum)
    m = op.params["multiplier"].astype(object)
    if x.st.dtype != np.uint8 or not is_int8(w):  # 16-bit: byte planes (ort_wide), NCHW
        acc, xm = emit_wide_conv(low.b, x.name, op, x.st)
        const = m * (op.params["bias"].astype(object) - x.st.offset * wsum.astype(object))
        return low.req(op, [Term(acc, m, xm)], const, ost, (-1, 1, 1))
    zs = int(a["pad_value"]) + x.st.offset
    k = int(np.prod(w.shape[1:]))
    xm = k * max(zs, 255 - zs) * int(np.abs(w).max(initial=0))
    const = m * (op.params["bias"].astype(object) + int(a["pad_value"]) * wsum.astype(object))
    if x.nhwc:
        mm = emit_im2col_matmul(low.b, x.name, w, zs, a["strides"], a["pads"], a["dilations"], low.path)
        return low.req(op, [Term(mm, m, xm)], const, ost, (-1,))
    ci = low.b.op(
        "ConvInteger",
        [
            x.name,
            low.b.const((w + 128).astype(np.uint8), np.uint8, "w"),
            low.b.const(zs, np.uint8, "xzp"),
            low.b.const(128, np.uint8, "wzp"),
        ],
        kernel_shape=list(w.shape[2:]),
        strides=a["strides"],
        pads=a["pads"],
        dilations=a["dilations"],
        group=a["group"],
    )
    return low.req(op, [Term(ci, m, xm)], const, ost, (-1, 1, 1))


SPEC = OpSpec(
    module=__name__,
    kinds=(
        Kind(
            "conv",
            reference,
            lower_ort,
            layout,
            native=(
                "QConv",
                "QConv16",
                "QDwConv",
                "DwConv",
                "Im2col",
                "BytePlane",
                "RequantU8",
                "RequantI32",
            ),
        ),
    ),
    rules=(Rule(frozenset({"Conv"}), "pending", compile_conv),),
    const_inputs={"Conv": (1,)},
)
