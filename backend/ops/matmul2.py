"""``matmul2``: MatMul of two quantized activations (attention's ``Q K^T`` and ``P V``).

Integer formula (``R(v, s)`` is ``rshift_round(v, s, quant.requant.round_mode)``, like Conv/MatMul)::

    q_y = clamp(R(sum_k (q_a - Z_a)(q_b - Z_b) M, s) + Z_y, lo, hi),   M / 2^s ~= S_a S_b / S_y

Reference: numpy matmul of the centred codes in int64 (exact).

ORT lowering: ``MatMulInteger(u8, u8)`` with zero points ``Z + off`` (exact int32 sums), requantized;
16-bit operands with the native kernels: one MatMulInteger per pair of byte planes
(``ort_native.native_matmul2_terms``) and one native ``RequantU8/I32``.
"""

from __future__ import annotations

__all__ = ["SPEC", "claims", "compile_matmul2", "reference", "lower_ort"]

import logging
from typing import Any

import numpy as np

from zonnx.backend.compiler.params import QParams, multipliers
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.requant import requantize_op
from zonnx.backend.compiler.values import Codes, CompileError
from zonnx.backend.runtime.ort_kernels import Storage, Term
from zonnx.backend.runtime.ort_native import native_matmul2_terms
from zonnx.backend.runtime.ort_values import Val, centred_max

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)

_I32 = float(1 << 31)


def claims(p: Any) -> bool:
    """A MatMul whose second operand is an activation (else ``matmul`` takes it)."""
    return len(p.ins) > 1 and isinstance(p.ins[1], Codes)


def compile_matmul2(low: Any, p: Any, out: str, qp: QParams, sources: list[str], base: dict) -> None:
    """Emit the ``matmul2`` of a pending MatMul of two activations."""
    node = p.node
    a, b = p.ins[0], p.ins[1]
    if not isinstance(a, Codes) or not isinstance(b, Codes):
        raise CompileError(f"node {node.name!r}: MatMul needs two quantized activations here.")
    sa, za = a.qp.per_tensor(f"node {node.name!r} input 0")
    sb, zb = b.qp.per_tensor(f"node {node.name!r} input 1")
    sy, _ = qp.per_tensor(f"node {node.name!r} output")
    m, s = multipliers(np.array([sa * sb / sy * p.mul]), low.target, node.name)
    attrs = dict(base, zp_a=za, zp_b=zb, round_mode=low.target.quant.requant.round_mode)
    params = {"multiplier": m.astype(np.int64), "shift": s.astype(np.int64)}
    low.emit("matmul2", node.name, [a.tensor, b.tensor], [out], attrs, params, sources)


def reference(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``clamp(R(((q_a - zp_a) @ (q_b - zp_b)) M, s) + zp_out)``."""
    a = op.attrs
    return requantize_op(np.matmul(args[0] - a["zp_a"], args[1] - a["zp_b"]), op)


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """``MatMulInteger`` of two stored activations, requantized (module docstring)."""
    a, m = op.attrs, int(op.params["multiplier"][0])
    xa, xb = args
    if low.native and any(v.st.dtype != np.uint8 for v in args):  # 16-bit: byte planes
        k = xa.info.shape[-1] if xa.info.shape and isinstance(xa.info.shape[-1], int) else None
        za, zb = xa.st.offset + a["zp_a"], xb.st.offset + a["zp_b"]
        terms = native_matmul2_terms(low.b, xa.name, xa.st, za, xb.name, xb.st, zb, m, k)
        return low.req(op, terms, 0, ost, ())
    for v in args:
        low.u8(v, op)
    za, zb = xa.st.offset + a["zp_a"], xb.st.offset + a["zp_b"]
    mm = low.b.op(
        "MatMulInteger",
        [xa.name, xb.name, low.b.const(za, np.uint8, "azp"), low.b.const(zb, np.uint8, "bzp")],
    )
    k = xa.info.shape[-1] if xa.info.shape and isinstance(xa.info.shape[-1], int) else None
    bound = centred_max(xa.info, a["zp_a"]) * centred_max(xb.info, a["zp_b"])
    xmax = min(k * bound, _I32) if k else _I32
    return low.req(op, [Term(mm, np.array(m), xmax)], 0, ost, ())


SPEC = OpSpec(
    module=__name__,
    kinds=(Kind("matmul2", reference, lower_ort, native=("BytePlane", "RequantU8", "RequantI32")),),
    rules=(Rule(frozenset({"MatMul"}), "pending", compile_matmul2, claims),),
)
