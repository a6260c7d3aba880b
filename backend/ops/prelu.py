"""``prelu``: PRelu with a constant slope ``a`` (per tensor or per channel) by lookup tables.

A table per slope entry ``k`` over every input code, exact like ``lut``::

    x = S_x (q - Z_x)  (float32);  table[k, q - qmin] = Q_y(x >= 0 ? x : a_k x)  (float32 product)
    q_y = table[index, q - qmin]   with ``index`` = arange(K) in the slope's broadcast shape

ORT lowering: one ``Gather`` from the tables laid end to end, at ``index * size + stored`` (``size``
stored codes per table; the index constant laid out like ``x``).
"""

from __future__ import annotations

__all__ = ["SPEC", "compile_prelu", "reference", "lower_ort"]

import logging
from typing import Any

import numpy as np
from onnx import TensorProto

from zonnx.backend.compiler.params import QParams, narrow_ints, quantize_float
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.values import Codes, CompileError, Const
from zonnx.backend.runtime.ort_kernels import Storage
from zonnx.backend.runtime.ort_values import Val, for_layout

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)


def compile_prelu(low: Any, p: Any, out: str, qp: QParams, sources: list[str], base: dict) -> None:
    """Emit the ``prelu`` tables of a pending PRelu."""
    node = p.node
    x, a = p.ins[0], p.ins[1]
    if not isinstance(x, Codes) or not isinstance(a, Const):
        raise CompileError(f"node {node.name!r}: PRelu needs a quantized input and a constant slope.")
    if a.qp is None:
        slope = np.asarray(a.value, np.float32)
    else:
        sa, za = a.qp.per_tensor(f"node {node.name!r} slope")
        slope = np.float32(sa) * (np.asarray(a.value, np.int64) - za).astype(np.float32)
    sx, zx = x.qp.per_tensor(f"node {node.name!r} input")
    if x.qp.qmax - x.qp.qmin > 1 << 16:
        raise CompileError(f"node {node.name!r}: PRelu tables need inputs of at most 16 bits.")
    q = np.arange(x.qp.qmin, x.qp.qmax + 1, dtype=np.int64)
    xf = np.float32(sx) * (q - zx).astype(np.float32)  # the float32 DequantizeLinear value
    flat = slope.reshape(-1, 1)
    y = np.where(xf[None, :] >= 0, xf[None, :], flat * xf[None, :]).astype(np.float64) * p.mul
    for _, lo, hi in p.acts:
        y = np.clip(y, lo, hi)
    table = quantize_float(y.astype(np.float32), qp).astype(np.dtype(qp.dtype))
    rank = len(low.shapes.get(node.input[0]) or ()) or slope.ndim
    index = np.arange(slope.size, dtype=np.int64).reshape((1,) * max(rank - slope.ndim, 0) + slope.shape)
    attrs = {"qmin_in": int(x.qp.qmin)}
    params = {"table": table, "index": narrow_ints(index)}
    low.emit("prelu", node.name, [x.tensor], [out], attrs, params, sources)


def reference(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``table[index, q_x - qmin_in]`` (``index`` broadcasts like the slope)."""
    x = args[0]
    index = np.broadcast_to(op.params["index"].astype(np.int64), x.shape)
    return op.params["table"].astype(np.int64)[index, x - op.attrs["qmin_in"]]


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """``table[index, q - qmin]`` as one Gather over the flattened, storage-shifted tables."""
    (x,) = args
    table = op.params["table"].astype(np.int64)
    size = 256 if x.st.dtype == np.uint8 else 1 << 16
    codes = np.arange(size) - x.st.offset - int(op.attrs["qmin_in"])
    full = table[:, np.clip(codes, 0, table.shape[1] - 1)] + ost.offset
    index = for_layout(op.params["index"].astype(np.int64) * size, x.nhwc)
    stored = low.b.op("Cast", [x.name], to=TensorProto.INT32)
    at = low.b.op("Add", [stored, low.b.const(index, np.int32, "prelu_base")])
    return low.b.op("Gather", [low.b.const(full.reshape(-1), ost.dtype, "prelu_table"), at], axis=0)


SPEC = OpSpec(
    module=__name__,
    kinds=(Kind("prelu", reference, lower_ort, "input"),),
    rules=(Rule(frozenset({"PRelu"}), "pending", compile_prelu),),
)
