"""Power-of-two position search (vai_q_onnx): NonOverflow and MinMSE for activations, "diffs" for weights.

A position ``pos`` means scale ``2**-pos``: ``q = clip(round(x * 2**pos), qmin, qmax)``.

- NonOverflow: vai_q_onnx's ``get_pos_overflow``, generalized from 8 bits to ``(qmin, qmax)``:
  ``scale = max(min / (qmin - 0.5), max / (qmax + 0.5))``, ``pos = floor(log2(1 / scale))`` clamped to
  [-128, 127]; an all-zero tensor gets 127. The 0.5 is a rounding guard: ``max`` may exceed
  ``qmax * 2**-pos`` by less than half a step, which still rounds to ``qmax``. So ``max|x| = 1.0`` gives
  pos 6 and ``0.99`` gives pos 7.
- MinMSE (activations): the start is vai_q_onnx's ``pos = rint(-log2(s))`` with ``s = 2 * max|x| /
  (qmax - qmin)``; then ``pos .. pos + 4`` are tried and the one with the least squared error wins.
  Unlike vai_q_onnx, which scores the candidates on the *first calibration batch only*
  (``data_arr[0]``), the error here is the expected squared error over *all* batches, computed from the
  histogram: each bin's values are taken as uniform over the bin, and the integral of the rounding
  sawtooth and of the clipping parabola over the bin is exact.
- Weights ("diffs"): the NonOverflow pos, then ``pos .. pos + 4`` scored by the exact sum of squared
  errors of ``clip(round(w / s) * s)`` on the full tensor (numpy's round, half to even, as vai_q_onnx).
"""

from __future__ import annotations

__all__ = [
    "POS_MIN",
    "POS_MAX",
    "pos_overflow",
    "nonoverflow_pos",
    "minmse_pos",
    "weight_diffs_pos",
    "expected_sq_error",
    "pos_to_range",
]

import logging
import math

import numpy as np

from zonnx.quantization.calibration.stats import GridHistogram, TensorStats

logger = logging.getLogger(__name__)

POS_MIN, POS_MAX = -128, 127


def _clamp(pos: int) -> int:
    return max(POS_MIN, min(POS_MAX, int(pos)))


def pos_overflow(lo: float, hi: float, qmin: int = -128, qmax: int = 127) -> int:
    """The largest pos at which ``[lo, hi]`` does not saturate (vai_q_onnx ``get_pos_overflow``)."""
    scale = max(float(lo) / (qmin - 0.5), float(hi) / (qmax + 0.5))
    if not scale > 0 or not math.isfinite(scale):
        return POS_MAX
    return _clamp(math.floor(math.log2(1.0 / scale)))


def nonoverflow_pos(stats: TensorStats, qmin: int = -128, qmax: int = 127) -> int:
    """NonOverflow for an activation: ``pos_overflow`` of its global min and max."""
    return pos_overflow(stats.min, stats.max, qmin, qmax)


def pos_to_range(pos: int, qmin: int = -128, qmax: int = 127) -> tuple[float, float]:
    """The float range a position represents: ``(qmin * 2**-pos, qmax * 2**-pos)``."""
    s = 2.0 ** (-pos)
    return qmin * s, qmax * s


def _saw(x: np.ndarray, low: float, s: float) -> np.ndarray:
    """Integral from ``low`` to x of the squared rounding error, for x >= low (levels at low + s/2 + k s)."""
    y = (x - low) / s
    n = np.floor(y)
    f = y - n
    return s**3 * (n / 12.0 + ((f - 0.5) ** 3 + 0.125) / 3.0)


def expected_sq_error(hist: GridHistogram, pos: int, qmin: int = -128, qmax: int = 127) -> float:
    """Expected total squared error of quantizing the histogram's values at ``pos`` (uniform within bins)."""
    assert hist.counts is not None
    s = 2.0 ** (-pos)
    keep = hist.counts > 0
    n = hist.counts[keep].astype(np.float64)
    e = hist.edges()
    a, b = e[:-1][keep], e[1:][keep]
    lo_level, hi_level = qmin * s, qmax * s
    low, up = lo_level - 0.5 * s, hi_level + 0.5 * s
    total = np.zeros_like(n)
    # below the lowest level's rounding interval: clipped to qmin * s
    a1, b1 = a, np.minimum(b, low)
    m = b1 > a1
    total[m] += ((b1[m] - lo_level) ** 3 - (a1[m] - lo_level) ** 3) / 3.0
    # inside: the rounding sawtooth
    a2, b2 = np.maximum(a, low), np.minimum(b, up)
    m = b2 > a2
    total[m] += _saw(b2[m], low, s) - _saw(a2[m], low, s)
    # above: clipped to qmax * s
    a3, b3 = np.maximum(a, up), b
    m = b3 > a3
    total[m] += ((b3[m] - hi_level) ** 3 - (a3[m] - hi_level) ** 3) / 3.0
    return float((total / (b - a) * n).sum())


def minmse_pos(stats: TensorStats, qmin: int = -128, qmax: int = 127, pos_range: int = 5, **_: object) -> int:
    """MinMSE for an activation, scored on the histogram of all batches (see module doc)."""
    amax = stats.abs_max
    if amax == 0 or stats.hist is None or stats.hist.counts is None:
        return POS_MAX if amax == 0 else nonoverflow_pos(stats, qmin, qmax)
    start = _clamp(round(-math.log2(2.0 * amax / (qmax - qmin))))
    cands = [p for p in range(start, start + pos_range) if p <= POS_MAX]
    errs = [expected_sq_error(stats.hist, p, qmin, qmax) for p in cands]
    return cands[int(np.argmin(errs))]


def weight_diffs_pos(w: np.ndarray, qmin: int = -128, qmax: int = 127, pos_range: int = 5) -> int:
    """vai_q_onnx's weight method: NonOverflow pos, then the least-SSE pos among ``pos .. pos + 4``."""
    x = np.asarray(w, dtype=np.float64)
    if x.size == 0 or not np.any(x):
        return POS_MAX
    start = pos_overflow(float(x.min()), float(x.max()), qmin, qmax)
    best, best_err = start, math.inf
    for p in range(start, min(start + pos_range, POS_MAX + 1)):
        s = 2.0 ** (-p)
        q = np.clip(np.round(x / s), qmin, qmax) * s
        err = float(np.square(q - x).sum())
        if err < best_err:
            best, best_err = p, err
    return best
