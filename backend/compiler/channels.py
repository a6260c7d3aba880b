"""Constant output channels of Conv / Gemm / MatMul: folded to a bias-only channel, exactly.

A channel's accumulator is ``acc = sum (q_x - Z_x) w + b_acc`` with ``|sum (q_x - Z_x) w| <= reach =
sum |w| * max |q_x - Z_x|``. Rounding is monotone in ``acc`` (for ``M >= 0``), so when
``R(acc M, s)`` takes the same value ``v`` at both ends ``b_acc +- reach`` it takes it for every input:
the channel is replaced by ``w = 0, b_acc = v, M = 1, s = 0``, which gives ``v`` exactly. Such channels
come from near-zero weights (a per-channel scale around 1e-10): their multipliers need shifts near 62,
which only widen the integer arithmetic of every executor.
"""

from __future__ import annotations

__all__ = ["fold_constant_channels"]

import logging

import numpy as np

from .requant import rshift_round

logger = logging.getLogger(__name__)


def fold_constant_channels(
    w_int: np.ndarray, b_acc: np.ndarray, m: np.ndarray, s: np.ndarray, reach: np.ndarray, mode: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Channels whose requantized value is the same ``v`` for every reachable accumulator become
    ``w = 0, b_acc = v, M = 1, s = 0`` (exact: rounding is monotone, so equal ends mean a constant).

    ``acc`` lies in ``b_acc +- reach``; near-zero weight channels (a tiny weight scale) get shifts near 62
    that only widen the integer arithmetic. ``w_int`` is output-channel-major; returns new arrays.
    """
    ends = [b_acc - reach, b_acc + reach]
    lo, hi = (
        rshift_round(np.array([int(e) * int(v) for e, v in zip(x, m, strict=True)], dtype=object), s, mode)
        for x in ends
    )
    const = np.array([a == b for a, b in zip(lo, hi, strict=True)], dtype=bool)
    if not const.any():
        return w_int, b_acc, m, s
    w_int = np.where(const.reshape((-1,) + (1,) * (w_int.ndim - 1)), 0, w_int)
    b_acc = np.where(const, np.array([int(v) for v in lo], dtype=np.int64), b_acc)
    return w_int, b_acc, np.where(const, 1, m).astype(np.int64), np.where(const, 0, s).astype(np.int64)
