"""``lut``: one-variable functions by a lookup table over every input code.

Sigmoid, Tanh, HardSigmoid, HardSwish, LeakyRelu, Gelu, Erf, Exp, Softplus, Elu::

    table[q - qmin_x] = Q_y(clip(f(S_x (q - Z_x)) * mul))     for every input code q
    q_y = table[q_x - qmin_x]

``S_x (q - Z_x)`` is the float32 DequantizeLinear value, ``f`` is evaluated in float64 and rounded with
the output quantizer's rounding (``params.quantize_float``); fused Relu/Clip clip before rounding.
Inputs of at most 16 bits. ORT lowering: ``Gather`` from the table indexed by the stored code (the table
shifted by the storage offsets, clamped at its ends).
"""

from __future__ import annotations

__all__ = ["SPEC", "LUT_FUNCS", "lut_table", "compile_lut", "reference", "lower_ort"]

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from zonnx.backend.compiler.params import QParams, node_attrs, quantize_float
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.values import CompileError
from zonnx.backend.runtime.ort_kernels import Storage
from zonnx.backend.runtime.ort_values import Val

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)


def _gelu(x: np.ndarray, a: dict) -> np.ndarray:
    if a.get("approximate", b"none") in (b"tanh", "tanh"):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + _erf(x / np.sqrt(2.0)))


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


#: One-variable ops computed by a lookup table: f(x float64, attrs) -> float64.
LUT_FUNCS: dict[str, Callable[[np.ndarray, dict], np.ndarray]] = {
    "Sigmoid": lambda x, a: 1.0 / (1.0 + np.exp(-x)),
    "Tanh": lambda x, a: np.tanh(x),
    "HardSigmoid": lambda x, a: np.clip(a.get("alpha", 0.2) * x + a.get("beta", 0.5), 0, 1),
    "HardSwish": lambda x, a: x * np.clip(x / 6.0 + 0.5, 0, 1),
    "LeakyRelu": lambda x, a: np.where(x >= 0, x, a.get("alpha", 0.01) * x),
    "Elu": lambda x, a: np.where(x >= 0, x, a.get("alpha", 1.0) * np.expm1(x)),
    "Softplus": lambda x, a: np.logaddexp(0.0, x),
    "Exp": lambda x, a: np.exp(x),
    "Erf": lambda x, a: _erf(x),
    "Gelu": _gelu,
}


def lut_table(node: onnx.NodeProto, xq: QParams, yq: QParams, acts: list, mul: float) -> np.ndarray:
    """``table[q - qmin_x] = Q_y(clip(f(S_x (q - Z_x)) * mul))`` for every input code q."""
    sx, zx = xq.per_tensor(f"node {node.name!r} input")
    if xq.qmax - xq.qmin > 1 << 16:
        raise CompileError(f"node {node.name!r}: a lookup table needs inputs of at most 16 bits.")
    q = np.arange(xq.qmin, xq.qmax + 1, dtype=np.int64)
    x = np.float32(sx) * (q - zx).astype(np.float32)  # the float32 DequantizeLinear value
    with np.errstate(over="ignore"):
        y = LUT_FUNCS[node.op_type](x.astype(np.float64), node_attrs(node)) * mul
    for _, lo, hi in acts:
        y = np.clip(y, lo, hi)
    return quantize_float(y.astype(np.float32), yq).astype(np.dtype(yq.dtype))


def compile_lut(low: Any, p: Any, out: str, qp: QParams, sources: list[str], base: dict) -> None:
    """Emit the ``lut`` of a pending one-variable function."""
    node = p.node
    x = low.codes(p.ins[0], node)
    table = lut_table(node, x.qp, qp, p.acts, p.mul)
    low.emit("lut", node.name, [x.tensor], [out], {"qmin_in": x.qp.qmin}, {"table": table}, sources)


def reference(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``table[q_x - qmin_in]``."""
    return op.params["table"].astype(np.int64)[args[0] - op.attrs["qmin_in"]]


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """``Gather`` from the storage-shifted table at the stored code."""
    (x,) = args
    table = op.params["table"].astype(np.int64)
    size = 256 if x.st.dtype == np.uint8 else 1 << 16
    codes = np.arange(size) - x.st.offset - int(op.attrs["qmin_in"])
    full = table[np.clip(codes, 0, table.size - 1)] + ost.offset
    idx = low.b.op("Cast", [x.name], to=TensorProto.INT32)
    return low.b.op("Gather", [low.b.const(full, ost.dtype, "table"), idx], axis=0)


SPEC = OpSpec(
    module=__name__,
    kinds=(Kind("lut", reference, lower_ort, "input"),),
    rules=(Rule(frozenset(LUT_FUNCS), "pending", compile_lut),),
)
