"""``lincomb``: a linear combination of activations and a constant, one common shift.

Sub of two activations; Add or Sub of an activation and a constant; Mul or Div by a float scalar
constant ``c`` (TPU-MLIR's MulConst). Integer formula (``R`` is ``rshift_round`` with
``quant.activation_round_mode``)::

    q_y = clamp(R(sum_i M_i (q_i - Z_i) + M_c k, s) + Z_y, lo, hi)

with one common shift ``s`` and signed multipliers: Add/Sub ``M_i / 2^s ~= +-S_i / S_y``; a quantized
constant is the term ``k = q_c - Z_c`` with ``M_c / 2^s ~= +-S_c / S_y``; a float constant ``C`` is
``k = round_half_even(C 2^s / S_y)``, ``M_c = 1``; Mul by ``c``: ``M / 2^s ~= S_x c / S_y``; Div by
``c``: ``M / 2^s ~= S_x / (c S_y)``. ``M_c`` is the last multiplier, present with the param ``const``.

ORT lowering: the terms ``M_i stored_i`` and the constant ``-sum M_i (Z_i + off_i)`` (plus ``M_c k`` for
a scalar constant; a constant array is one more term, an int32 initializer) requantized once.
"""

from __future__ import annotations

__all__ = ["SPEC", "claims", "compile_lincomb", "reference", "lower_ort"]

import logging
from typing import Any

import numpy as np

from zonnx.backend.compiler.params import QParams, multipliers, narrow_ints
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.requant import rshift_round
from zonnx.backend.compiler.values import Codes, CompileError, Const
from zonnx.backend.runtime.ort_kernels import Storage, Term
from zonnx.backend.runtime.ort_values import Val, for_layout

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)

_I32 = float(1 << 31)


def claims(p: Any) -> bool:
    """An Add with a constant operand (an Add of two activations is an ``add``)."""
    return any(isinstance(v, Const) for v in p.ins)


def _scalar_value(v: Any, node: Any) -> float:
    """The real value of a scalar constant operand (dequantized when it is quantized)."""
    if not isinstance(v, Const) or np.size(v.value) != 1:
        raise CompileError(
            f"node {node.name!r} ({node.op_type}): the NPU multiplies or divides by a scalar constant only."
        )
    if v.qp is None:
        return float(np.asarray(v.value, np.float64).reshape(-1)[0])
    s, z = v.qp.per_tensor(f"node {node.name!r} constant")
    return float(s * (int(np.asarray(v.value).reshape(-1)[0]) - z))


def compile_lincomb(low: Any, p: Any, out: str, qp: QParams, sources: list[str], base: dict) -> None:
    """Emit the ``lincomb`` of a pending Add / Sub / Mul / Div (module docstring)."""
    node, op = p.node, p.node.op_type
    sy, _ = qp.per_tensor(f"node {node.name!r} output")
    terms: list[tuple[Any, float]] = []  # (codes, signed ratio S_i / S_y)
    konst: tuple[np.ndarray, float] | None = None  # (centred codes, signed ratio) of a quantized constant
    real: np.ndarray | None = None  # a float constant term (real value, signed)
    factor = p.mul
    ins = list(p.ins[:2])
    if op in ("Mul", "Div"):  # one activation times / over a scalar constant
        k = 1 if op == "Div" or not isinstance(ins[1], Codes) else 0
        c = _scalar_value(ins[k], node)
        if c == 0.0 and op == "Div":
            raise CompileError(f"node {node.name!r}: division by zero.")
        factor *= c if op == "Mul" else 1.0 / c
        ins = [ins[1 - k]]
    for i, v in enumerate(ins):
        sign = -1.0 if op == "Sub" and i == 1 else 1.0
        if isinstance(v, Codes):
            s_i, _ = v.qp.per_tensor(f"node {node.name!r} input {i}")
            terms.append((v, sign * s_i / sy))
        elif isinstance(v, Const) and v.qp is not None:
            s_c, z_c = v.qp.per_tensor(f"node {node.name!r} constant input {i}")
            konst = (np.asarray(v.value, np.int64) - z_c, sign * s_c / sy)
        elif isinstance(v, Const):
            real = sign * np.asarray(v.value, np.float64)
        else:
            raise CompileError(f"node {node.name!r} ({op}): input {i} is not a quantized tensor.")
    if not terms:
        raise CompileError(f"node {node.name!r}: {op} of constants should have been folded.")
    ratios = [r * factor for _, r in terms] + ([konst[1] * factor] if konst is not None else [])
    mags, s = multipliers(np.abs(np.array(ratios)), low.target, node.name, eltwise=True, common_shift=True)
    m = [int(v) * (1 if r >= 0 else -1) for v, r in zip(mags, ratios, strict=True)]
    params: dict[str, np.ndarray] = {"shift": s.astype(np.int64)}
    if konst is not None:
        params["const"] = narrow_ints(konst[0])
    elif real is not None:
        k = np.rint(real * factor * float(2.0 ** int(s[0])) / sy)
        if np.any(np.abs(k) >= 2.0**52):
            raise CompileError(
                f"node {node.name!r}: the constant {real.reshape(-1)[:3]} is too large for the output grid."
            )
        params["const"] = k.astype(np.int64)
        m.append(1)
    params["multiplier"] = np.array(m, np.int64)
    attrs = dict(
        base,
        zps=[int(v.qp.per_tensor("")[1]) for v, _ in terms],
        round_mode=low.target.quant.activation_round_mode,
    )
    low.emit("lincomb", node.name, [v.tensor for v, _ in terms], [out], attrs, params, sources)


def reference(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``clamp(R(sum_i M_i (q_i - zps_i) + M_c const, s) + zp_out)``."""
    a, m = op.attrs, [int(v) for v in op.params["multiplier"]]
    acc = sum(mi * (x - z) for mi, x, z in zip(m, args, a["zps"], strict=False))
    if "const" in op.params:
        acc = acc + m[len(args)] * op.params["const"].astype(np.int64)
    y = rshift_round(np.asarray(acc, np.int64), int(op.params["shift"][0]), a["round_mode"]) + a["zp_out"]
    return np.clip(y, a["lo"], a["hi"])


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """``sum M_i (q_i - Z_i) + M_c k`` requantized (module docstring)."""
    a, m = op.attrs, [int(v) for v in op.params["multiplier"]]
    terms = [Term(v.name, np.array(mi), low.xmax(v)) for v, mi in zip(args, m, strict=False)]
    const = -sum(mi * (v.st.offset + z) for v, mi, z in zip(args, m, a["zps"], strict=False))
    if "const" in op.params:
        k, mc = op.params["const"].astype(np.int64), m[len(args)]
        if k.size == 1:
            const += mc * int(k.reshape(-1)[0])
        else:
            kmax = int(np.abs(k).max(initial=0))
            dtype = np.int32 if kmax < _I32 else np.int64
            name = low.b.const(for_layout(k, args[0].nhwc), dtype, "k")
            terms.append(Term(name, np.array(mc), kmax))
    return low.req(op, terms, const, ost, ())


SPEC = OpSpec(
    module=__name__,
    kinds=(Kind("lincomb", reference, lower_ort, "input", native=("RequantU8", "RequantI32")),),
    rules=(
        Rule(frozenset({"Add"}), "pending", compile_lincomb, claims),
        Rule(frozenset({"Sub", "Mul", "Div"}), "pending", compile_lincomb),  # Mul: after ``mul`` declines
    ),
    const_inputs={"Div": (1,)},
)
