"""``mul``: Mul of two activations, or of an activation and a *quantized* constant.

The DPU's eltwise "prod", TPU-MLIR's Mul with multiplier and rshift. Integer formula (``R`` is
``rshift_round`` with ``quant.activation_round_mode``, the eltwise family like Add)::

    q_y = clamp(R((q_a - Z_a)(q_b - Z_b) M, s) + Z_y, lo, hi),      M / 2^s ~= S_a S_b / S_y

A constant ``b`` is stored centred, ``b - Z_b``, in its ONNX broadcast shape (param ``b``); with one
input the reference reads it from there. A Mul by a float scalar is a ``lincomb``.

ORT lowering: ``Cast`` to int32 (int64 beyond 8 bits), ``Sub`` the stored zero points, ``Mul``; the
product is one exact term of the requantization. A scalar constant ``b`` folds into the multiplier
instead: the single term ``(M b) stored_a`` with constant ``-(M b)(Z_a + off_a)``.
"""

from __future__ import annotations

__all__ = ["SPEC", "claims", "compile_mul", "reference", "lower_ort"]

import logging
from typing import Any

import numpy as np
from onnx import TensorProto

from zonnx.backend.compiler.params import QParams, multipliers, narrow_ints
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.requant import requantize_op
from zonnx.backend.compiler.values import Codes, CompileError, Const
from zonnx.backend.runtime.ort_kernels import Storage, Term
from zonnx.backend.runtime.ort_values import Val, centred_max, for_layout

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)


def claims(p: Any) -> bool:
    """Every operand is codes or a quantized constant (else ``lincomb`` takes the Mul)."""
    return all(
        isinstance(v, Codes) or (isinstance(v, Const) and v.qp is not None) for v in p.ins if v is not None
    )


def compile_mul(low: Any, p: Any, out: str, qp: QParams, sources: list[str], base: dict) -> None:
    """Emit the ``mul`` of a pending Mul (module docstring)."""
    node = p.node
    a, b = p.ins[0], p.ins[1]
    if not isinstance(a, Codes):
        a, b = b, a  # Mul(constant, x)
    if not isinstance(a, Codes):
        raise CompileError(f"node {node.name!r}: Mul of two constants should have been folded.")
    sa, za = a.qp.per_tensor(f"node {node.name!r} input")
    sb, zb = b.qp.per_tensor(f"node {node.name!r} input")
    sy, _ = qp.per_tensor(f"node {node.name!r} output")
    m, s = multipliers(np.array([sa * sb / sy * p.mul]), low.target, node.name, eltwise=True)
    attrs = dict(base, zp_a=za, zp_b=zb, round_mode=low.target.quant.activation_round_mode)
    params = {"multiplier": m.astype(np.int64), "shift": s.astype(np.int64)}
    ins = [a.tensor]
    if isinstance(b, Codes):
        ins.append(b.tensor)
    else:
        params["b"] = narrow_ints(np.asarray(b.value, np.int64) - zb)
        attrs["zp_b"] = 0
    low.emit("mul", node.name, ins, [out], attrs, params, sources)


def reference(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``clamp(R((q_a - zp_a)(q_b - zp_b) M, s) + zp_out)``; ``q_b - zp_b`` is ``b`` with one input."""
    a = op.attrs
    b = args[1] - a["zp_b"] if len(args) > 1 else op.params["b"].astype(np.int64)
    return requantize_op((args[0] - a["zp_a"]) * b, op)


def _centre(low: Any, v: Val, zp: int, wide: int, np_wide: type) -> str:
    x = low.b.op("Cast", [v.name], to=wide)
    return low.b.op("Sub", [x, low.b.const(v.st.offset + zp, np_wide, "zp")])


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """``(q_a - Z_a)(q_b - Z_b)`` requantized (module docstring)."""
    a, m = op.attrs, int(op.params["multiplier"][0])
    xa = args[0]
    if len(args) == 1 and op.params["b"].size == 1:
        mb = m * int(op.params["b"].reshape(-1)[0])
        const = -mb * (xa.st.offset + a["zp_a"])
        return low.req(op, [Term(xa.name, np.array(mb), low.xmax(xa))], const, ost, ())
    narrow = all(v.st.dtype == np.uint8 for v in args)
    wide, np_wide = (TensorProto.INT32, np.int32) if narrow else (TensorProto.INT64, np.int64)
    ca = _centre(low, xa, a["zp_a"], wide, np_wide)
    if len(args) > 1:
        cb = _centre(low, args[1], a["zp_b"], wide, np_wide)
        bmax = centred_max(args[1].info, a["zp_b"])
    else:
        b = op.params["b"].astype(np.int64)
        cb = low.b.const(for_layout(b, xa.nhwc), np_wide, "b")
        bmax = int(np.abs(b).max(initial=0))
    prod = low.b.op("Mul", [ca, cb])
    xmax = centred_max(xa.info, a["zp_a"]) * bmax
    return low.req(op, [Term(prod, np.array(m), xmax)], 0, ost, ())


SPEC = OpSpec(
    module=__name__,
    kinds=(Kind("mul", reference, lower_ort, "input", native=("RequantU8", "RequantI32")),),
    rules=(Rule(frozenset({"Mul"}), "pending", compile_mul, claims),),
)
