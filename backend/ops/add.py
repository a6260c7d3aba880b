"""``add``: Add of two quantized activations, one common shift.

Integer formula (``R`` is ``rshift_round`` with ``quant.activation_round_mode``; TPU-MLIR eltwise rounds
half away)::

    q_y = clamp(R(M_a (q_a - Z_a) + M_b (q_b - Z_b), s) + Z_y, lo, hi),   M_i / 2^s ~= S_i / S_y

with one common shift (exact shifts on power-of-two targets: DPU shift_read/write). An Add with a
constant operand is a ``lincomb``.

ORT lowering: ``QLinearAdd`` or a float32 Add where they are provably exact (``ort_qlinear``), else one
linear form ``M_a x_a + M_b x_b + C`` (zero points and storage offsets fold into ``C``) requantized once.
"""

from __future__ import annotations

__all__ = ["SPEC", "compile_add", "reference", "lower_ort"]

import logging
from typing import Any

import numpy as np

from zonnx.backend.compiler.params import QParams, multipliers
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.requant import rshift_round
from zonnx.backend.runtime.ort_kernels import Storage, Term
from zonnx.backend.runtime.ort_qlinear import emit_float32_add, emit_qlinear_add
from zonnx.backend.runtime.ort_values import Val

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)


def compile_add(low: Any, p: Any, out: str, qp: QParams, sources: list[str], base: dict) -> None:
    """Emit the ``add`` of a pending Add of two activations."""
    node = p.node
    a, b = (low.codes(v, node) for v in p.ins)
    ratios = np.array([float(a.qp.scale), float(b.qp.scale)]) / float(qp.scale) * p.mul
    m, s = multipliers(ratios, low.target, node.name, eltwise=True, common_shift=True)
    attrs = dict(
        base, zp_a=int(a.qp.zp), zp_b=int(b.qp.zp), round_mode=low.target.quant.activation_round_mode
    )
    low.emit("add", node.name, [a.tensor, b.tensor], [out], attrs, {"multiplier": m, "shift": s}, sources)


def reference(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``clamp(R(M_a (q_a - zp_a) + M_b (q_b - zp_b), s) + zp_out)`` (numpy broadcasting)."""
    qa, qb = args[0], args[1]
    a, m = op.attrs, op.params["multiplier"]
    acc = int(m[0]) * (qa - a["zp_a"]) + int(m[1]) * (qb - a["zp_b"])
    return np.clip(
        rshift_round(acc, int(op.params["shift"][0]), a["round_mode"]) + a["zp_out"], a["lo"], a["hi"]
    )


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """Exact ORT nodes of ``add`` (module docstring)."""
    a, m = op.attrs, [int(v) for v in op.params["multiplier"]]
    xa, xb = args
    for emit in (emit_qlinear_add, emit_float32_add) if low.qlinear else ():
        fused = emit(low.b, xa.name, xb.name, op, xa.st, xb.st, ost)
        if fused is not None:
            return fused
    const = -m[0] * (xa.st.offset + a["zp_a"]) - m[1] * (xb.st.offset + a["zp_b"])
    terms = [Term(xa.name, np.array(m[0]), low.xmax(xa)), Term(xb.name, np.array(m[1]), low.xmax(xb))]
    return low.req(op, terms, const, ost, ())


SPEC = OpSpec(
    module=__name__,
    kinds=(Kind("add", reference, lower_ort, "input", native=("RequantU8", "RequantI32")),),
    rules=(Rule(frozenset({"Add"}), "pending", compile_add),),
)
