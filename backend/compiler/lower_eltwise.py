"""Integer lowering of elementwise Mul / Add / Sub / Div with constants, and MatMul of two activations.

Notation as in ``zonnx.backend.compiler.lower``: ``real = S (q - Z)``, ``R(v, s)`` is
``rshift_round(v, s, round_mode)``, every result is clamped to ``[lo, hi]`` (the output range narrowed
by a fused Relu / Clip). Multipliers come from ``params.multipliers`` (exact powers of two on
shift-only targets such as the DPU; ``M / 2^s ~= ratio`` with the target's multiplier width otherwise).

- ``mul`` (Mul of two activations, or of an activation and a *quantized* constant ``b``; the DPU's
  eltwise "prod", TPU-MLIR's Mul with multiplier and rshift)::

      q_y = clamp(R((q_a - Z_a)(q_b - Z_b) M, s) + Z_y),      M / 2^s ~= S_a S_b / S_y

  a constant ``b`` is stored centred, ``b - Z_b``, in its ONNX broadcast shape (param ``b``).
- ``lincomb`` (Sub of two activations; Add or Sub of an activation and a constant; Mul or Div by a
  float scalar constant ``c``, TPU-MLIR's MulConst)::

      q_y = clamp(R(sum_i M_i (q_i - Z_i) + M_c k, s) + Z_y)

  with one common shift ``s`` and signed multipliers: Add/Sub ``M_i / 2^s ~= +-S_i / S_y``; a quantized
  constant is the term ``k = q_c - Z_c`` with ``M_c / 2^s ~= +-S_c / S_y``; a float constant ``C`` is
  ``k = round_half_even(C 2^s / S_y)``, ``M_c = 1``; Mul by ``c``: ``M / 2^s ~= S_x c / S_y``; Div by
  ``c``: ``M / 2^s ~= S_x / (c S_y)``.
- ``matmul2`` (MatMul of two activations, attention's ``Q K^T`` and ``P V``)::

      q_y = clamp(R(sum_k (q_a - Z_a)(q_b - Z_b) M, s) + Z_y),  M / 2^s ~= S_a S_b / S_y

- ``prelu`` (PRelu with a constant slope ``a``, per tensor or per channel): a lookup table per slope
  entry ``k`` over every input code, exact like ``lut``::

      x = S_x (q - Z_x)  (float32);  table[k, q - qmin] = Q_y(x >= 0 ? x : a_k x)  (float32 product)
      q_y = table[index, q - qmin]   with ``index`` = arange(K) in the slope's broadcast shape

Rounding: ``mul`` and ``lincomb`` use ``quant.activation_round_mode`` (the eltwise family, like Add);
``matmul2`` uses ``quant.requant.round_mode`` (like Conv/MatMul). Public API: ``PENDING_OPS``, ``claims``,
``lower_pending`` (called by ``lower.py`` through ``lower_extra``).
"""

from __future__ import annotations

__all__ = ["claims", "lower_pending", "PENDING_OPS"]

import logging
from typing import Any

import numpy as np

from . import params as om

logger = logging.getLogger(__name__)

#: ONNX ops this module makes pending (waiting for their output quantizer) besides lower.py's own.
PENDING_OPS = frozenset({"Mul", "Sub", "Div", "PRelu"})


def _kinds() -> tuple[type, type, type]:
    from .lower import CompileError, _Codes, _Const

    return _Codes, _Const, CompileError


def claims(p: Any) -> bool:
    """Whether this module lowers the pending op ``p`` (lower.py keeps Add of two activations, MatMul
    with a constant weight and everything else)."""
    codes, const, _ = _kinds()
    op = p.node.op_type
    if op in PENDING_OPS:
        return True
    if op == "Add":
        return any(isinstance(v, const) for v in p.ins)
    if op == "MatMul":
        return len(p.ins) > 1 and isinstance(p.ins[1], codes)
    return False


def lower_pending(low: Any, p: Any, out: str, qp: om.QParams, sources: list[str], base: dict) -> None:
    """Emit the program op of pending node ``p`` whose output quantizer writes ``out`` on grid ``qp``."""
    codes, const, err = _kinds()
    node, op = p.node, p.node.op_type
    ins = [v for v in p.ins if v is not None]
    if op == "MatMul":
        _matmul2(low, p, out, qp, sources, base)
    elif op == "PRelu":
        _prelu(low, p, out, qp, sources)
    elif op == "Mul" and all(
        isinstance(v, codes) or (isinstance(v, const) and v.qp is not None) for v in ins
    ):
        _mul(low, p, out, qp, sources, base)
    elif op in ("Add", "Sub", "Mul", "Div"):
        _lincomb(low, p, out, qp, sources, base)
    else:  # pragma: no cover - claims() and this dispatch agree
        raise err(f"node {node.name!r}: {op} cannot be lowered.")


def _mul(low: Any, p: Any, out: str, qp: om.QParams, sources: list[str], base: dict) -> None:
    codes, _, err = _kinds()
    node = p.node
    a, b = p.ins[0], p.ins[1]
    if not isinstance(a, codes):
        a, b = b, a  # Mul(constant, x)
    if not isinstance(a, codes):
        raise err(f"node {node.name!r}: Mul of two constants should have been folded.")
    sa, za = a.qp.per_tensor(f"node {node.name!r} input")
    sb, zb = b.qp.per_tensor(f"node {node.name!r} input")
    sy, _ = qp.per_tensor(f"node {node.name!r} output")
    m, s = om.multipliers(np.array([sa * sb / sy * p.mul]), low.target, node.name, eltwise=True)
    attrs = dict(base, zp_a=za, zp_b=zb, round_mode=low.target.quant.activation_round_mode)
    params = {"multiplier": m.astype(np.int64), "shift": s.astype(np.int64)}
    ins = [a.tensor]
    if isinstance(b, codes):
        ins.append(b.tensor)
    else:
        params["b"] = _small(np.asarray(b.value, np.int64) - zb)
        attrs["zp_b"] = 0
    low.emit("mul", node.name, ins, [out], attrs, params, sources)


def _lincomb(low: Any, p: Any, out: str, qp: om.QParams, sources: list[str], base: dict) -> None:
    codes, const, err = _kinds()
    node, op = p.node, p.node.op_type
    sy, _ = qp.per_tensor(f"node {node.name!r} output")
    terms: list[tuple[Any, float]] = []  # (codes, signed ratio S_i / S_y)
    konst: tuple[np.ndarray, float] | None = None  # (centred codes, signed ratio) of a quantized constant
    real: np.ndarray | None = None  # a float constant term (real value, signed)
    factor = p.mul
    ins = list(p.ins[:2])
    if op in ("Mul", "Div"):  # one activation times / over a scalar constant
        k = 1 if op == "Div" or not isinstance(ins[1], codes) else 0
        c = _scalar_value(ins[k], node, err)
        if c == 0.0 and op == "Div":
            raise err(f"node {node.name!r}: division by zero.")
        factor *= c if op == "Mul" else 1.0 / c
        ins = [ins[1 - k]]
    for i, v in enumerate(ins):
        sign = -1.0 if op == "Sub" and i == 1 else 1.0
        if isinstance(v, codes):
            s_i, _ = v.qp.per_tensor(f"node {node.name!r} input {i}")
            terms.append((v, sign * s_i / sy))
        elif isinstance(v, const) and v.qp is not None:
            s_c, z_c = v.qp.per_tensor(f"node {node.name!r} constant input {i}")
            konst = (np.asarray(v.value, np.int64) - z_c, sign * s_c / sy)
        elif isinstance(v, const):
            real = sign * np.asarray(v.value, np.float64)
        else:
            raise err(f"node {node.name!r} ({op}): input {i} is not a quantized tensor.")
    if not terms:
        raise err(f"node {node.name!r}: {op} of constants should have been folded.")
    ratios = [r * factor for _, r in terms] + ([konst[1] * factor] if konst is not None else [])
    mags, s = om.multipliers(np.abs(np.array(ratios)), low.target, node.name, eltwise=True, common_shift=True)
    m = [int(v) * (1 if r >= 0 else -1) for v, r in zip(mags, ratios, strict=True)]
    params: dict[str, np.ndarray] = {"shift": s.astype(np.int64)}
    if konst is not None:
        params["const"] = _small(konst[0])
    elif real is not None:
        k = np.rint(real * factor * float(2.0 ** int(s[0])) / sy)
        if np.any(np.abs(k) >= 2.0**52):
            raise err(
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


def _scalar_value(v: Any, node: Any, err: type) -> float:
    """The real value of a scalar constant operand (dequantized when it is quantized)."""
    _, const, _ = _kinds()
    if not isinstance(v, const) or np.size(v.value) != 1:
        raise err(
            f"node {node.name!r} ({node.op_type}): the NPU multiplies or divides by a scalar constant only."
        )
    if v.qp is None:
        return float(np.asarray(v.value, np.float64).reshape(-1)[0])
    s, z = v.qp.per_tensor(f"node {node.name!r} constant")
    return float(s * (int(np.asarray(v.value).reshape(-1)[0]) - z))


def _matmul2(low: Any, p: Any, out: str, qp: om.QParams, sources: list[str], base: dict) -> None:
    codes, _, err = _kinds()
    node = p.node
    a, b = p.ins[0], p.ins[1]
    if not isinstance(a, codes) or not isinstance(b, codes):
        raise err(f"node {node.name!r}: MatMul needs two quantized activations here.")
    sa, za = a.qp.per_tensor(f"node {node.name!r} input 0")
    sb, zb = b.qp.per_tensor(f"node {node.name!r} input 1")
    sy, _ = qp.per_tensor(f"node {node.name!r} output")
    m, s = om.multipliers(np.array([sa * sb / sy * p.mul]), low.target, node.name)
    attrs = dict(base, zp_a=za, zp_b=zb, round_mode=low.target.quant.requant.round_mode)
    params = {"multiplier": m.astype(np.int64), "shift": s.astype(np.int64)}
    low.emit("matmul2", node.name, [a.tensor, b.tensor], [out], attrs, params, sources)


def _prelu(low: Any, p: Any, out: str, qp: om.QParams, sources: list[str]) -> None:
    codes, const, err = _kinds()
    node = p.node
    x, a = p.ins[0], p.ins[1]
    if not isinstance(x, codes) or not isinstance(a, const):
        raise err(f"node {node.name!r}: PRelu needs a quantized input and a constant slope.")
    if a.qp is None:
        slope = np.asarray(a.value, np.float32)
    else:
        sa, za = a.qp.per_tensor(f"node {node.name!r} slope")
        slope = np.float32(sa) * (np.asarray(a.value, np.int64) - za).astype(np.float32)
    sx, zx = x.qp.per_tensor(f"node {node.name!r} input")
    if x.qp.qmax - x.qp.qmin > 1 << 16:
        raise err(f"node {node.name!r}: PRelu tables need inputs of at most 16 bits.")
    q = np.arange(x.qp.qmin, x.qp.qmax + 1, dtype=np.int64)
    xf = np.float32(sx) * (q - zx).astype(np.float32)  # the float32 DequantizeLinear value
    flat = slope.reshape(-1, 1)
    y = np.where(xf[None, :] >= 0, xf[None, :], flat * xf[None, :]).astype(np.float64) * p.mul
    for _, lo, hi in p.acts:
        y = np.clip(y, lo, hi)
    table = om.quantize_float(y.astype(np.float32), qp).astype(np.dtype(qp.dtype))
    rank = len(low.shapes.get(node.input[0]) or ()) or slope.ndim
    index = np.arange(slope.size, dtype=np.int64).reshape((1,) * max(rank - slope.ndim, 0) + slope.shape)
    attrs = {"qmin_in": int(x.qp.qmin)}
    low.emit("prelu", node.name, [x.tensor], [out], attrs, {"table": table, "index": _small(index)}, sources)


def _small(a: np.ndarray) -> np.ndarray:
    """An integer array in the narrowest of int16 / int32 / int64 that holds it."""
    a = np.asarray(a, np.int64)
    for dt in (np.int16, np.int32):
        if a.size == 0 or (a.min() >= np.iinfo(dt).min and a.max() <= np.iinfo(dt).max):
            return a.astype(dt)
    return a
