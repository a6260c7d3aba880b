"""``avgpool`` and ``maxpool``: window pools over NCHW codes (AveragePool, GlobalAveragePool, MaxPool,
GlobalMaxPool).

``avgpool`` (``R`` is ``rshift_round`` with ``quant.activation_round_mode``; pads contribute 0)::

    q_y = clamp(R(M * sum_window(q_x - Z_x), s) + Z_y, lo, hi),   M / 2^s ~= S_x / (S_y n)

A target with ``[quant.avgpool]`` uses its ``k / 2^n`` for ``1/n`` on power-of-two grids (a refinement
``Mul(pool, n k / 2^n)`` before the quantizer is then absorbed). Windowed pools with pads need
``count_include_pad=1``; GlobalAveragePool needs a known input shape.

``maxpool``: ``q_y = max_window(q_x)`` on codes (monotone, same grid; pads read ``pad_value = qmin``),
per-channel grids allowed; a following quantizer with another grid adds a ``rescale``.

ORT lowering: window sums by ``ReduceSum`` (global; ``SumHwU8`` on NHWC uint8 with the native kernels)
or a depthwise ``ConvInteger`` with a ones kernel and ``x_zp = Z_in + off`` (padding then adds 0),
requantized once; max pools by ``MaxPool`` / ``ReduceMax``
(the storage minimum pads like ``qmin``), ``com.microsoft`` ``NhwcMaxPool`` on channels-last uint8
(``MaxPoolU8`` with the native kernels), 16-bit
codes through float32 (exact below 2^24).
"""

from __future__ import annotations

__all__ = ["SPEC", "compile_avgpool", "compile_maxpool", "reference_avgpool", "reference_maxpool"]

import logging
import math
from typing import Any

import numpy as np
from onnx import TensorProto

from zonnx.backend.compiler.params import QParams, multipliers, node_attrs
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.requant import requantize_op
from zonnx.backend.compiler.values import Codes, CompileError, emit_code
from zonnx.backend.runtime.ort_kernels import KernelError, Storage, Term
from zonnx.backend.runtime.ort_native import emit_maxpool_i32, emit_maxpool_u8, emit_sum_hw_u8
from zonnx.backend.runtime.ort_values import MS_DOMAIN, Val, is_rank4
from zonnx.backend.runtime.ref_math import ceil_pads, pad_nchw, windows

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)


# -- compile rules -----------------------------------------------------------------------------------
def _avgpool_params(
    node: Any, xq: QParams, yq: QParams, mul: float, shape: list | None, target: Any
) -> tuple[dict, dict[str, np.ndarray]]:
    """avgpool attrs (kernel, strides, pads or global) and {multiplier, shift} for ``S_x / (S_y n)``."""
    sx, zx = xq.per_tensor(f"node {node.name!r} input")
    sy, _ = yq.per_tensor(f"node {node.name!r} output")
    a = node_attrs(node)
    if node.op_type == "GlobalAveragePool":
        if not shape or any(not isinstance(d, int) or d <= 0 for d in shape[2:]):
            raise CompileError(
                f"node {node.name!r}: GlobalAveragePool needs a known input shape; run shape inference."
            )
        kernel = [int(d) for d in shape[2:]]
        attrs: dict[str, Any] = {"global": 1, "kernel": kernel}
    else:
        kernel = list(a["kernel_shape"])
        pads = list(a.get("pads", [0] * 2 * len(kernel)))
        if any(pads) and not a.get("count_include_pad", 0):
            raise CompileError(
                f"node {node.name!r}: AveragePool with pads needs count_include_pad=1 on the NPU."
            )
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            raise CompileError(f"node {node.name!r}: auto_pad is not supported; make pads explicit.")
        attrs = {
            "global": 0,
            "kernel": kernel,
            "strides": list(a.get("strides", [1] * len(kernel))),
            "pads": pads,
            "ceil_mode": int(a.get("ceil_mode", 0)),
        }
    attrs["zp_in"] = zx
    area = math.prod(kernel)
    factor = target.quant.avgpool.factor(*kernel) if target.quant.avgpool and len(kernel) == 2 else None
    if factor is not None and xq.pos is not None and yq.pos is not None:
        k, n = factor
        if not math.isclose(mul, 1.0) and not math.isclose(mul, area * k / 2.0**n, rel_tol=1e-6):
            raise CompileError(
                f"node {node.name!r}: a Mul by {mul:g} after the pool is not the NPU factor of its "
                f"{'x'.join(map(str, kernel))} window here ({area * k / 2.0**n:g}); a model quantized for "
                "inputs of another shape (the calibration samples') is compiled for that shape "
                "(--input-shape), or quantized again with samples of this one."
            )
        s = n + xq.pos - yq.pos
        m = k << max(0, -s)
        return attrs, {"multiplier": np.array([m], np.int64), "shift": np.array([max(s, 0)], np.int64)}
    m, s = multipliers(np.array([sx / (sy * area) * mul]), target, node.name, eltwise=True)
    return attrs, {"multiplier": m, "shift": s}


def compile_avgpool(low: Any, p: Any, out: str, qp: QParams, sources: list[str], base: dict) -> None:
    """Emit the ``avgpool`` of a pending AveragePool / GlobalAveragePool."""
    node = p.node
    x = low.codes(p.ins[0], node)
    attrs, params = _avgpool_params(node, x.qp, qp, p.mul, low.shapes.get(node.input[0]), low.target)
    attrs.update(base, round_mode=low.target.quant.activation_round_mode)
    low.emit("avgpool", node.name, [x.tensor], [out], attrs, params, sources)


def compile_maxpool(low: Any, node: Any, x: Codes, ins: list[Any]) -> None:
    """Emit the ``maxpool`` of a MaxPool / GlobalMaxPool on codes (pads read ``qmin``)."""
    a = node_attrs(node)
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise CompileError(f"node {node.name!r}: auto_pad is not supported; make pads explicit.")
    if node.op_type == "GlobalMaxPool":
        attrs: dict[str, Any] = {"global": 1}
    else:
        k = list(a["kernel_shape"])
        attrs = {
            "global": 0,
            "kernel": k,
            "strides": list(a.get("strides", [1] * len(k))),
            "pads": list(a.get("pads", [0] * 2 * len(k))),
            "dilations": list(a.get("dilations", [1] * len(k))),
            "ceil_mode": int(a.get("ceil_mode", 0)),
        }
    attrs["pad_value"] = x.qp.qmin
    emit_code(low, node, x, "maxpool", attrs, per_channel=True)


# -- reference ---------------------------------------------------------------------------------------
def _windows(x: np.ndarray, op: Op, pad_value: int) -> np.ndarray:
    """Window views (N, C, oh, ow, kh*kw) of a pool op, or the whole spatial extent when global."""
    a = op.attrs
    if a.get("global"):
        return x.reshape(*x.shape[:2], 1, 1, -1)
    k = a["kernel"]
    dil = a.get("dilations", [1] * len(k))
    pads = ceil_pads(x.shape, k, a["strides"], a["pads"], dil, a.get("ceil_mode", 0))
    win = windows(pad_nchw(x, pads, pad_value), k, a["strides"], dil)
    return win.reshape(*win.shape[:4], -1)


def reference_avgpool(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``clamp(R(sum_window(q_x - zp_in), M, s) + zp_out)``."""
    return requantize_op(_windows(args[0] - op.attrs["zp_in"], op, 0).sum(axis=-1), op)


def reference_maxpool(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``max_window(q_x)``, pads reading ``pad_value``."""
    return _windows(args[0], op, op.attrs.get("pad_value", np.iinfo(np.int64).min)).max(axis=-1)


# -- ORT lowering ------------------------------------------------------------------------------------
def _ceil_pads(shape: list, kernel: list, strides: list, pads: list, ceil: int) -> list[int]:
    """End pads that make ceil_mode windows explicit (as the reference executor does)."""
    out = list(pads)
    if not ceil:
        return out
    n = len(kernel)
    for i, (k, s) in enumerate(zip(kernel, strides, strict=True)):
        size = shape[2 + i] + pads[i] + pads[i + n]
        n_out = math.ceil((size - k) / s) + 1
        if (n_out - 1) * s >= shape[2 + i] + pads[i]:
            n_out -= 1
        out[i + n] += max(0, (n_out - 1) * s + k - size)
    return out


def lower_avgpool(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """Window sums (ReduceSum / ones-kernel ConvInteger), requantized once (module docstring)."""
    (x,), a, m = args, op.attrs, int(op.params["multiplier"][0])
    zs = x.st.offset + a["zp_in"]
    area = math.prod(a["kernel"])
    if a.get("global"):
        if low.native and x.nhwc and x.st.dtype == np.uint8 and is_rank4(x):
            total = emit_sum_hw_u8(low.b, x.name)
        else:
            wide = low.b.op("Cast", [x.name], to=TensorProto.INT32)
            axes = [1, 2] if x.nhwc else [2, 3]
            total = low.b.op("ReduceSum", [wide, low.b.const(axes, np.int64, "axes")], keepdims=1)
        return low.req(op, [Term(total, np.array(m), area * low.xmax(x))], -m * area * zs, ost, ())
    low.u8(x, op)
    shape = x.info.shape
    if not shape or any(not isinstance(d, int) for d in shape[1:]):
        raise KernelError(f"op {op.name!r}: a windowed average pool needs a static input shape.")
    pads = _ceil_pads(shape, a["kernel"], a["strides"], a["pads"], a.get("ceil_mode", 0))
    ones = np.ones((shape[1], 1, *a["kernel"]), np.uint8)
    total = low.b.op(
        "ConvInteger",
        [x.name, low.b.const(ones, np.uint8, "ones"), low.b.const(zs, np.uint8, "xzp")],
        kernel_shape=list(a["kernel"]),
        strides=a["strides"],
        pads=pads,
        group=shape[1],
    )
    return low.req(op, [Term(total, np.array(m), area * 255)], 0, ost, ())


def lower_maxpool(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """MaxPool / NhwcMaxPool / ReduceMax on stored codes (an offset commutes with max)."""
    (x,), a = args, op.attrs
    if a.get("global"):
        return low.b.op("ReduceMax", [x.name], axes=[1, 2] if x.nhwc else [2, 3], keepdims=1)
    wide = x.st.dtype != np.uint8  # 16-bit codes: MaxPool in float32 (exact below 2^24)
    if wide and x.nhwc:  # only with the native kernels (layout_maxpool)
        return emit_maxpool_i32(low.b, x.name, a)
    if low.native and x.nhwc and len(a["kernel"]) == 2:
        return emit_maxpool_u8(low.b, x.name, a)
    src = low.b.op("Cast", [x.name], to=TensorProto.FLOAT) if wide else x.name
    out = low.b.op(
        "NhwcMaxPool" if x.nhwc else "MaxPool",
        [src],
        kernel_shape=a["kernel"],
        strides=a["strides"],
        pads=a["pads"],
        dilations=a.get("dilations", [1] * len(a["kernel"])),
        ceil_mode=a.get("ceil_mode", 0),
        **({"domain": MS_DOMAIN} if x.nhwc else {}),
    )
    return low.b.op("Cast", [out], to=ost.onnx_type) if wide else out


def layout_avgpool(low: Any, op: Op, args: list[Val], ost: Storage) -> bool:
    """Global average pools whose input is already NHWC stay channels-last."""
    x = args[0]
    return low.nhwc_ok and is_rank4(x) and bool(op.attrs.get("global")) and x.nhwc


def layout_maxpool(low: Any, op: Op, args: list[Val], ost: Storage) -> bool:
    """Windowed max pools on an NHWC input stay channels-last: uint8 codes (NhwcMaxPool), or, with the
    native kernels, 2-D pools of int32-stored 16-bit codes (MaxPoolI32)."""
    x = args[0]
    two_d = len(op.attrs.get("kernel", ())) == 2
    return (
        low.nhwc_ok
        and is_rank4(x)
        and x.nhwc
        and (x.st.dtype == np.uint8 or (low.native and two_d))
        and not op.attrs.get("global")
        and op.attrs.get("pad_value", 0) is not None
    )


SPEC = OpSpec(
    module=__name__,
    kinds=(
        Kind(
            "avgpool",
            reference_avgpool,
            lower_avgpool,
            layout_avgpool,
            native=("RequantU8", "RequantI32", "SumHwU8"),
        ),
        Kind("maxpool", reference_maxpool, lower_maxpool, layout_maxpool, native=("MaxPoolI32", "MaxPoolU8")),
    ),
    rules=(
        Rule(frozenset({"AveragePool", "GlobalAveragePool"}), "pending", compile_avgpool),
        Rule(frozenset({"MaxPool", "GlobalMaxPool"}), "code", compile_maxpool),
    ),
)
