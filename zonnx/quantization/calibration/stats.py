"""Per-tensor streaming statistics: extrema, moving averages, moments and a re-binnable grid histogram.

Everything here is updated batch by batch in O(1) memory (the histogram has a fixed number of bins), so
calibration never keeps an activation after its batch.

The histogram lives on a grid anchored at zero: bin ``i`` holds the values in
``[(offset + i) * width, (offset + i + 1) * width)``. When a batch falls outside, the width doubles
``k`` times (the least ``k`` that fits) and every run of ``2**k`` old bins merges into one new bin.
Because ``floor(floor(x / w) / 2**k) == floor(x / (w * 2**k))`` the merged counts are exactly what a
histogram of all values seen, computed at once on the final grid, would hold (values lying within float
rounding of an edge may land one bin over). Counts are never lost.

Range: the grid covers ``[min, max]`` of the data, not a symmetric ``[-a, a]``: a ReLU output gets all
the bins. Since 0 is always an edge, the histogram of ``|x|`` and the symmetric ``[-a, a]`` layout ORT's
entropy search expects are exact re-indexings, not re-binnings. Resolution: the first batch spreads its
span over ``nbins - 2`` bins; after growth the data span covers at least ``nbins / 2`` bins.
"""

from __future__ import annotations

__all__ = ["DEFAULT_BINS", "GridHistogram", "TensorStats"]

import dataclasses
import logging
import math

import numpy as np

logger = logging.getLogger(__name__)

#: Default number of histogram bins (TPU-MLIR and Compass use 2048; so does ORT's Percentile).
DEFAULT_BINS = 2048
#: Shifts beyond this give -1 / 0 for every index the grid can hold (|index| < 2**53).
_MAX_SHIFT = 62


def _floor_index(v: float, width: float) -> int:
    return math.floor(v / width)


class GridHistogram:
    """Counts of values on a zero-anchored uniform grid that grows by merging bin pairs (see module doc).

    Options: ``nbins`` (default 2048, must be >= 4). ``counts`` is None until the first value arrives.
    """

    def __init__(self, nbins: int = DEFAULT_BINS) -> None:
        if nbins < 4:
            raise ValueError(f"histogram needs at least 4 bins, got {nbins}")
        self.nbins = int(nbins)
        self.counts: np.ndarray | None = None
        self.width = 0.0
        self.offset = 0

    # -- views -------------------------------------------------------------------------------------
    @property
    def total(self) -> int:
        return 0 if self.counts is None else int(self.counts.sum())

    def edges(self) -> np.ndarray:
        """The ``nbins + 1`` bin edges (float64)."""
        return (self.offset + np.arange(self.nbins + 1, dtype=np.float64)) * self.width

    def centers(self) -> np.ndarray:
        return (self.offset + np.arange(self.nbins, dtype=np.float64) + 0.5) * self.width

    def _zero_layout(self) -> tuple[np.ndarray, float]:
        """Counts on the bins ``[-K w', K w')`` around zero holding every count, ``K <= nbins``.

        ``w' = width * 2**s`` with the least ``s`` that fits: data far from zero (all in [1000, 1001],
        say) is merged into fewer, wider bins, exactly, since the grid is anchored at zero.
        """
        assert self.counts is not None
        idx = self.offset + np.arange(self.nbins, dtype=np.int64)
        nz = self.counts > 0
        lo, hi = (int(idx[nz][0]), int(idx[nz][-1])) if nz.any() else (0, 0)
        s = 0
        while max(-(lo >> s), (hi >> s) + 1) > self.nbins:
            s += 1
        k = max(-(lo >> s), (hi >> s) + 1, 1)
        out = np.zeros(2 * k, dtype=np.int64)
        np.add.at(out, (idx[nz] >> s) + k, self.counts[nz])
        return out, self.width * 2.0**s

    def abs_histogram(self) -> tuple[np.ndarray, float]:
        """Histogram of ``|x|`` with ``K <= nbins`` bins: bin ``j`` holds ``[j w', (j + 1) w')``.

        Exact: the signed bin ``-j - 1`` holds ``-|x|`` for ``|x|`` in ``(j w', (j + 1) w']`` and folds
        onto bin ``j`` (a value exactly on a negative edge moves one bin, as any value on an edge can).
        """
        sym, w = self._zero_layout()
        k = sym.size // 2
        return sym[k:] + sym[:k][::-1], w

    def symmetric(self) -> tuple[np.ndarray, np.ndarray]:
        """The counts on ``[-K w', K w']`` (``2K`` bins, zero in the middle, ``K <= nbins``) and edges.

        This is the layout of ORT's ``HistogramCollector.collect_value`` histograms.
        """
        sym, w = self._zero_layout()
        k = sym.size // 2
        return sym, np.arange(-k, k + 1, dtype=np.float64) * w

    def relu(self) -> GridHistogram:
        """The histogram of ``max(x, 0)``: negative bins fold into the bin ``[0, width)`` (exact)."""
        assert self.counts is not None
        h = GridHistogram(self.nbins)
        h.width, h.offset = self.width, max(self.offset, 0)
        h.counts = np.zeros(self.nbins, dtype=np.int64)
        idx = self.offset + np.arange(self.nbins) - h.offset
        keep = idx >= 0
        h.counts[idx[keep]] = self.counts[keep]
        h.counts[0] += self.counts[~keep].sum()
        return h

    def copy(self) -> GridHistogram:
        h = GridHistogram(self.nbins)
        h.counts = None if self.counts is None else self.counts.copy()
        h.width, h.offset = self.width, self.offset
        return h

    # -- updates -----------------------------------------------------------------------------------
    def add(self, values: np.ndarray, lo: float | None = None, hi: float | None = None) -> None:
        """Count ``values`` (finite); ``lo``/``hi`` are their min/max when the caller knows them already.

        ``lo``/``hi`` may be the extrema of a larger tensor that ``values`` was sampled from: the grid
        then covers that tensor's range.
        """
        flat = np.asarray(values).reshape(-1)
        if flat.size == 0:
            return
        if flat.dtype.kind != "f" or flat.dtype.itemsize < 4:
            flat = flat.astype(np.float32)
        if lo is None or hi is None:
            lo, hi = float(flat.min()), float(flat.max())
        lo, hi = float(lo), float(hi)
        if self.counts is None:
            self._start(lo, hi)
        a_lo, a_hi = _floor_index(lo, self.width), _floor_index(hi, self.width)
        if a_lo < self.offset or a_hi >= self.offset + self.nbins:
            self._grow(a_lo, a_hi)
        self.counts += self._bincount(flat)

    def _start(self, lo: float, hi: float) -> None:
        span = hi - lo
        if span > 0 and math.isfinite(span):
            width = span / (self.nbins - 2)
        else:  # a constant batch: any width holds it; later batches grow the grid as needed
            width = max(abs(lo), 1.0) * 2.0**-20
        self.width = width
        self.offset = _floor_index(lo, width)
        self.counts = np.zeros(self.nbins, dtype=np.int64)
        if _floor_index(hi, width) >= self.offset + self.nbins:  # float rounding on a huge span
            self.offset = _floor_index(hi, width) - self.nbins + 1

    def _occupied(self) -> tuple[int, int] | None:
        nz = np.nonzero(self.counts)[0]
        if nz.size == 0:
            return None
        return self.offset + int(nz[0]), self.offset + int(nz[-1])

    def _grow(self, a_lo: int, a_hi: int) -> None:
        """Double the width the least number of times so absolute bins ``a_lo..a_hi`` and the counts fit."""
        occ = self._occupied()
        lo, hi = (a_lo, a_hi) if occ is None else (min(a_lo, occ[0]), max(a_hi, occ[1]))
        k = 0
        while (hi >> min(k, _MAX_SHIFT)) - (lo >> min(k, _MAX_SHIFT)) >= self.nbins:
            k += 1
        self._grow_by(k, lo, hi)

    def _grow_by(self, k: int, lo: int, hi: int) -> None:
        """Width *= 2**k; old bins merge in runs of 2**k; the new grid starts at ``lo >> k``."""
        assert self.counts is not None
        s = min(k, _MAX_SHIFT)
        new_offset = lo >> s
        if (hi >> s) - new_offset >= self.nbins:  # keep as many top bins as fit (only when merging)
            new_offset = (hi >> s) - self.nbins + 1
        old_abs = self.offset + np.arange(self.nbins, dtype=np.int64)
        new_rel = (old_abs >> s) - new_offset
        nz = self.counts != 0
        new = np.zeros(self.nbins, dtype=np.int64)
        if nz.any():
            np.add.at(new, np.clip(new_rel[nz], 0, self.nbins - 1), self.counts[nz])
        self.counts, self.offset, self.width = new, int(new_offset), self.width * 2.0**k

    def _bincount(self, flat: np.ndarray) -> np.ndarray:
        """Counts of ``flat`` on the current grid, values within rounding of the ends clipped inside."""
        base = self.offset * self.width
        if flat.dtype == np.float64:
            t = (flat - base) * (1.0 / self.width)
        else:
            base32 = np.float32(base)
            if float(base32) > base:
                base32 = np.nextafter(base32, np.float32(-np.inf))
            t = np.subtract(flat, base32, dtype=np.float32)
            np.multiply(t, np.float32(1.0 / self.width), out=t)
        idx = t.astype(np.intp)  # truncation == floor here: t >= 0 up to rounding, and (-1, 0) -> 0
        del t
        if idx.size and idx.min() < 0:
            np.maximum(idx, 0, out=idx)
        c = np.bincount(idx, minlength=self.nbins)
        if c.size > self.nbins:
            c[self.nbins - 1] += c[self.nbins :].sum()
            c = c[: self.nbins]
        return c


@dataclasses.dataclass
class TensorStats:
    """Statistics of one tensor over all calibration batches, updated in O(1) memory.

    Fields: ``count`` values seen; ``batches`` batches used (``skipped_batches`` had NaN/Inf and were
    left out); ``min``/``max`` global extrema; ``batch_min_sum``/``batch_max_sum`` sums of per-batch
    extrema (their mean is what ORT's ``quantize_static`` returns for ``CalibMovingAverage``);
    ``ema_min``/``ema_max`` ORT's moving average ``old + c * (new - old)`` with
    ``averaging_constant`` c (default 0.01, the first batch initializes); ``mean_min``/``mean_max``
    Compass' ``mean`` strategy ``m * old + (1 - m) * new`` with ``momentum`` m (default 0.9);
    ``mean``/``m2`` running mean and sum of squared deviations over ``moment_count`` values (Chan's
    parallel merge in float64), or ``moment_count == 0`` when not collected; ``hist`` the grid
    histogram, or None when not collected.
    """

    name: str
    averaging_constant: float = 0.01
    momentum: float = 0.9
    count: int = 0
    batches: int = 0
    skipped_batches: int = 0
    min: float = math.inf
    max: float = -math.inf
    batch_min_sum: float = 0.0
    batch_max_sum: float = 0.0
    ema_min: float = math.nan
    ema_max: float = math.nan
    mean_min: float = math.nan
    mean_max: float = math.nan
    moment_count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    hist: GridHistogram | None = None

    @property
    def abs_max(self) -> float:
        return max(abs(self.min), abs(self.max)) if self.batches else 0.0

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.moment_count) if self.moment_count else 0.0

    @property
    def has_moments(self) -> bool:
        return self.moment_count > 0

    def update_extrema(self, lo: float, hi: float, n: int) -> bool:
        """Take one batch's min/max over ``n`` values; False (and the batch is skipped) if not finite."""
        if n <= 0:
            return False
        lo, hi = float(lo), float(hi)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            self.skipped_batches += 1
            if self.skipped_batches == 1:
                logger.warning("tensor %r: a batch holds NaN or Inf; such batches are left out", self.name)
            return False
        c, m = self.averaging_constant, self.momentum
        if self.batches == 0:
            self.ema_min, self.ema_max = lo, hi
            self.mean_min, self.mean_max = lo, hi
        else:
            self.ema_min += c * (lo - self.ema_min)
            self.ema_max += c * (hi - self.ema_max)
            self.mean_min = m * self.mean_min + (1 - m) * lo
            self.mean_max = m * self.mean_max + (1 - m) * hi
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        self.batch_min_sum += lo
        self.batch_max_sum += hi
        self.batches += 1
        self.count += int(n)
        return True

    def update_moments(self, n: int, total: float, total_sq: float) -> None:
        """Merge one batch given its value count, sum and sum of squares (Chan et al.)."""
        if n <= 0:
            return
        mb = float(total) / n
        m2b = max(float(total_sq) - n * mb * mb, 0.0)
        na = self.moment_count
        nt = na + n
        delta = mb - self.mean
        self.mean += delta * n / nt
        self.m2 += m2b + delta * delta * na * n / nt
        self.moment_count = nt

    def update(
        self, x: np.ndarray, *, moments: bool = True, histogram: bool = True, bins: int = DEFAULT_BINS
    ) -> None:
        """Update every statistic from one batch's raw values (the direct, in-process path)."""
        flat = np.asarray(x).reshape(-1)
        if flat.size == 0:
            return
        if flat.dtype.kind != "f":
            flat = flat.astype(np.float64)
        lo, hi = float(flat.min()), float(flat.max())
        if not self.update_extrema(lo, hi, flat.size):
            return
        if moments:
            f64 = flat.astype(np.float64)
            self.update_moments(flat.size, f64.sum(), np.dot(f64, f64))
        if histogram:
            if self.hist is None:
                self.hist = GridHistogram(bins)
            self.hist.add(flat, lo, hi)
