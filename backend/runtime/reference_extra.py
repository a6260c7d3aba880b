"""Reference formulas (numpy, int64) of the op kinds of ``lower_eltwise`` and ``lower_codes``.

``R(v, s) = rshift_round(v, s, round_mode)``; results clamp to ``[lo, hi]``; broadcasting is numpy's
(= ONNX's multidirectional broadcasting):

- ``mul``: ``q_y = clamp(R((q_a - zp_a)(q_b - zp_b) M, s) + zp_out)``; ``q_b - zp_b`` is the param ``b``
  when the op has one input
- ``lincomb``: ``q_y = clamp(R(sum_i M_i (q_i - zps_i) + M_c const, s) + zp_out)``; ``M_c`` (the last
  multiplier) and ``const`` only when the op has the param ``const``
- ``matmul2``: ``q_y = clamp(R(((q_a - zp_a) @ (q_b - zp_b)) M, s) + zp_out)`` (numpy matmul, exact int64)
- ``slice``, ``gather``, ``pad``: ONNX Slice / Gather / Pad index rules on codes (``lower_codes``)
- ``prelu``: ``q_y = table[index, q_x - qmin_in]`` (``index`` broadcasts like the slope)

Public API: ``KINDS``, ``execute``.
"""

from __future__ import annotations

__all__ = ["KINDS", "execute", "slice_indices"]

import logging
from collections.abc import Callable

import numpy as np

from zonnx.backend.compiler.program import Op
from zonnx.backend.compiler.requant import requantize_op, rshift_round

logger = logging.getLogger(__name__)


def _mul(args: list[np.ndarray], op: Op) -> np.ndarray:
    a = op.attrs
    b = args[1] - a["zp_b"] if len(args) > 1 else op.params["b"].astype(np.int64)
    return requantize_op((args[0] - a["zp_a"]) * b, op)


def _lincomb(args: list[np.ndarray], op: Op) -> np.ndarray:
    a, m = op.attrs, [int(v) for v in op.params["multiplier"]]
    acc = sum(mi * (x - z) for mi, x, z in zip(m, args, a["zps"], strict=False))
    if "const" in op.params:
        acc = acc + m[len(args)] * op.params["const"].astype(np.int64)
    y = rshift_round(np.asarray(acc, np.int64), int(op.params["shift"][0]), a["round_mode"]) + a["zp_out"]
    return np.clip(y, a["lo"], a["hi"])


def _matmul2(args: list[np.ndarray], op: Op) -> np.ndarray:
    a = op.attrs
    return requantize_op(np.matmul(args[0] - a["zp_a"], args[1] - a["zp_b"]), op)


def slice_indices(dim: int, start: int, end: int, step: int) -> np.ndarray:
    """The indices ONNX Slice takes along an axis of size ``dim``."""
    if step == 0:
        raise ValueError("slice step 0")
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return np.arange(start, end, step, dtype=np.int64)


def _slice(x: np.ndarray, op: Op) -> np.ndarray:
    a = op.attrs
    axes = a["axes"] if a["axes"] is not None else list(range(len(a["starts"])))
    steps = a["steps"] if a["steps"] is not None else [1] * len(axes)
    for axis, s, e, st in zip(axes, a["starts"], a["ends"], steps, strict=True):
        ax = axis % x.ndim
        x = np.take(x, slice_indices(x.shape[ax], s, e, st), axis=ax)
    return x


def _gather(x: np.ndarray, op: Op) -> np.ndarray:
    axis = op.attrs["axis"] % x.ndim
    idx = np.asarray(op.attrs["indices"], np.int64)
    return np.take(x, np.where(idx < 0, idx + x.shape[axis], idx), axis=axis)


def _pad(x: np.ndarray, op: Op) -> np.ndarray:
    a = op.attrs
    axes = [v % x.ndim for v in a["axes"]] if a["axes"] is not None else list(range(x.ndim))
    n = len(axes)
    width = [(0, 0)] * x.ndim
    for i, ax in enumerate(axes):
        width[ax] = (a["pads"][i], a["pads"][i + n])
    if a["mode"] == "constant":
        return np.pad(x, width, mode="constant", constant_values=a["value"])
    return np.pad(x, width, mode=a["mode"])


def _prelu(x: np.ndarray, op: Op) -> np.ndarray:
    index = np.broadcast_to(op.params["index"].astype(np.int64), x.shape)
    return op.params["table"].astype(np.int64)[index, x - op.attrs["qmin_in"]]


_FNS: dict[str, Callable[[list[np.ndarray], Op], np.ndarray]] = {
    "mul": _mul,
    "lincomb": _lincomb,
    "matmul2": _matmul2,
    "slice": lambda args, op: _slice(args[0], op),
    "gather": lambda args, op: _gather(args[0], op),
    "pad": lambda args, op: _pad(args[0], op),
    "prelu": lambda args, op: _prelu(args[0], op),
}
#: The op kinds this module executes.
KINDS = frozenset(_FNS)


def execute(op: Op, args: list[np.ndarray]) -> np.ndarray:
    """One op of a kind in ``KINDS`` on int64 inputs; its int64 output."""
    return np.asarray(_FNS[op.kind](args, op), dtype=np.int64)
