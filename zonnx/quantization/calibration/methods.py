"""Range selection: pure functions from a tensor's ``TensorStats`` (never raw data) to a float range.

Every function returns ``(rmin, rmax)``. With ``symmetric=True`` the range is ``(-t, t)``; methods that
are asymmetric by nature (MinMax, the moving averages, Entropy, Nstd) take ``t = max(|rmin|, |rmax|)``.
Ranges are not widened to include 0: the quantization scheme does that when it computes scale and zero
point. ``qmin``/``qmax`` are the integer limits of the quantized type (e.g. -128/127 or 0/255); only the
methods that model the quantization error (MSE, and the power-of-two ones in ``pof2``) use them.

Method names (``METHODS``) and the statistics each needs (``requirements``):
``minmax``, ``movingaverage``, ``mean`` (Compass), ``nonoverflow``: extrema only;
``nstd``: moments; ``entropy``, ``percentile``, ``mse``, ``kld``, ``minmse``: the histogram;
``distribution`` (ORT's ``CalibrationMethod.Distribution``): moments and the histogram.

Distribution (ORT): the range is the histogram's symmetric span ``(-t, t)``, ``t = max |x|``; for
float8 types the scale comes instead from the spread of the data, ``scale = std / std_f8`` where
``std_f8`` is the standard deviation of every finite value of the float8 type (``distribution_std``
gives ``std``: of ``x`` for scenario "same", of ``sign(x) |x|^(1/3)`` for "p3").
"""

from __future__ import annotations

__all__ = [
    "METHODS",
    "method_name",
    "requirements",
    "minmax",
    "moving_average",
    "compass_mean",
    "nstd",
    "percentile",
    "entropy",
    "mse",
    "kld",
    "tune_candidates",
    "compute_range",
    "distribution",
    "distribution_std",
]

import logging
import math
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

import numpy as np

from zonnx.errors import OptionError, did_you_mean
from zonnx.quantization.calibration import kl
from zonnx.quantization.calibration.readers import CalibrationError
from zonnx.quantization.calibration.stats import TensorStats

logger = logging.getLogger(__name__)

Range = tuple[float, float]

#: method name -> statistics it needs ("extrema" is always collected).
METHODS: dict[str, frozenset[str]] = {
    "minmax": frozenset({"extrema"}),
    "movingaverage": frozenset({"extrema"}),
    "mean": frozenset({"extrema"}),
    "nonoverflow": frozenset({"extrema"}),
    "nstd": frozenset({"extrema", "moments"}),
    "entropy": frozenset({"extrema", "histogram"}),
    "percentile": frozenset({"extrema", "histogram"}),
    "mse": frozenset({"extrema", "histogram"}),
    "kld": frozenset({"extrema", "histogram"}),
    "minmse": frozenset({"extrema", "histogram"}),
    "distribution": frozenset({"extrema", "moments", "histogram"}),
}


def method_name(method: str | Enum) -> str:
    """Normalize a method given as a name or as an ORT/vai_q_onnx/zonnx enum member to a ``METHODS`` key."""
    from zonnx.quantization.enums import METHOD_NAMES

    if isinstance(method, Enum):
        for name, member in METHOD_NAMES.items():
            if member is method:
                method = name
                break
        else:
            raise OptionError(f"calibration method {method} is not supported by the zonnx calibrator.")
    key = str(method).lower().replace("_", "").replace("-", "")
    if key not in METHODS:
        raise OptionError(
            f"unknown calibration method {method!r}.{did_you_mean(key, METHODS)} Known: {', '.join(METHODS)}."
        )
    return key


def requirements(methods: Iterable[str | Enum]) -> frozenset[str]:
    """The union of statistics the given methods need: subset of {"extrema", "moments", "histogram"}."""
    need: set[str] = {"extrema"}
    for m in methods:
        need |= METHODS[method_name(m)]
    return frozenset(need)


def _check(stats: TensorStats, what: str = "extrema") -> None:
    if stats.batches == 0:
        extra = f" ({stats.skipped_batches} batches held NaN/Inf)" if stats.skipped_batches else ""
        raise CalibrationError(f"tensor {stats.name!r}: no finite values were collected{extra}.")
    if what == "histogram" and (stats.hist is None or stats.hist.counts is None):
        raise CalibrationError(
            f"tensor {stats.name!r}: no histogram was collected; calibrate again with a histogram method "
            "(entropy, percentile, mse, kld, minmse) in methods_needed."
        )
    if what == "moments" and not stats.has_moments:
        raise CalibrationError(
            f"tensor {stats.name!r}: mean/std were not collected; calibrate again with 'nstd' in methods_needed."
        )


def _sym(lo: float, hi: float, symmetric: bool) -> Range:
    if symmetric:
        t = max(abs(lo), abs(hi))
        return -t, t
    return float(lo), float(hi)


def minmax(stats: TensorStats, *, symmetric: bool = False, **_: Any) -> Range:
    """Global min and max over every batch (ORT ``MinMax``, vai_q_onnx ``NonOverflow``'s range)."""
    _check(stats)
    return _sym(stats.min, stats.max, symmetric)


def moving_average(stats: TensorStats, *, symmetric: bool = False, ema: bool = False, **_: Any) -> Range:
    """Moving-average min/max as ORT computes it.

    Default: the mean of the per-batch min and max, which is what ORT's ``quantize_static`` returns
    with ``CalibMovingAverage=True`` (all batches reach one ``collect_data`` call, whose
    ``compute_data`` takes ``nanmean``). ``ema=True``: the exponential average
    ``old + c * (new - old)`` (``averaging_constant`` c = 0.01 by default, first batch initializes),
    which is ORT's ``merge_range`` across separate ``collect_data`` calls.
    """
    _check(stats)
    if ema:
        return _sym(stats.ema_min, stats.ema_max, symmetric)
    return _sym(stats.batch_min_sum / stats.batches, stats.batch_max_sum / stats.batches, symmetric)


def compass_mean(stats: TensorStats, *, symmetric: bool = False, **_: Any) -> Range:
    """Compass ``mean``: ``min = m * prev + (1 - m) * batch_min`` (same for max), m = momentum (0.9)."""
    _check(stats)
    return _sym(stats.mean_min, stats.mean_max, symmetric)


def nstd(
    stats: TensorStats, *, symmetric: bool = False, n: float = 1.0, clip: bool = True, **_: Any
) -> Range:
    """Compass ``[N]std``: ``mean -/+ N * std`` (N default 1 as in Compass), clipped to the observed
    extrema unless ``clip=False`` (a range wider than the data only wastes levels)."""
    _check(stats, "moments")
    lo, hi = stats.mean - n * stats.std, stats.mean + n * stats.std
    if clip:
        lo, hi = max(lo, stats.min), min(hi, stats.max)
    return _sym(lo, hi, symmetric)


def _quantile(counts: np.ndarray, edges: np.ndarray, q: float) -> float:
    """Value below which a fraction ``q`` of the histogram lies (linear inside the crossing bin)."""
    cum = np.cumsum(counts, dtype=np.float64)
    target = q * cum[-1]
    k = int(np.searchsorted(cum, target, side="left"))
    k = min(k, counts.size - 1)
    below = cum[k - 1] if k else 0.0
    frac = (target - below) / counts[k] if counts[k] else 1.0
    return float(edges[k] + min(max(frac, 0.0), 1.0) * (edges[k + 1] - edges[k]))


def percentile(stats: TensorStats, *, symmetric: bool = True, percentile: float = 99.999, **_: Any) -> Range:
    """Percentile of the histogram (ORT's default 99.999; symmetric by default as in ORT).

    Symmetric: ``t`` = the ``percentile`` of ``|x|``, range ``(-t, t)``. Otherwise ``(100 - p) / 2``
    percent is cut from each end of the signed histogram. Within a bin the value is interpolated
    linearly (ORT returns the bin's lower edge), so the result is within one bin of ``np.percentile`` on
    the raw data; it never exceeds the observed extrema.
    """
    if not 0.0 <= percentile <= 100.0:
        raise OptionError(f"percentile must be in [0, 100], got {percentile}.")
    _check(stats, "histogram")
    h = stats.hist
    if symmetric:
        counts, width = h.abs_histogram()
        edges = np.arange(counts.size + 1, dtype=np.float64) * width
        t = min(_quantile(counts, edges, percentile / 100.0), stats.abs_max)
        return -t, t
    cut = (100.0 - percentile) / 200.0
    lo = max(_quantile(h.counts, h.edges(), cut), stats.min)
    hi = min(_quantile(h.counts, h.edges(), 1.0 - cut), stats.max)
    return lo, hi


def _ort_layout(
    counts: np.ndarray, edges: np.ndarray, t: float, num_bins: int
) -> tuple[np.ndarray, np.ndarray]:
    """The histogram re-binned to ORT's entropy layout: ``num_bins`` equal bins over ``[-t, t]`` (counts
    split linearly inside a source bin; the cumulative counts are rounded, so the total is kept)."""
    new_edges = np.linspace(-t, t, num_bins + 1)
    cum = np.concatenate([[0.0], np.cumsum(counts, dtype=np.float64)])
    at = np.rint(np.interp(new_edges, edges, cum)).astype(np.int64)
    at[0], at[-1] = 0, int(cum[-1])
    return np.diff(at), new_edges


def entropy(
    stats: TensorStats,
    *,
    symmetric: bool = False,
    num_quantized_bins: int = 128,
    num_bins: int | None = None,
    **_: Any,
) -> Range:
    """ORT's Entropy (KL divergence) on the histogram laid out symmetrically, clipped to [min, max].

    ``num_bins``: ORT's histogram, that many bins over ``[-t, t]`` (``t = max |x|``; ORT's default for
    Entropy is 128, which with 128 quantized bins leaves a single candidate, the full range, so the
    result is ``[min, max]``); the collected histogram is re-binned to it. ``None`` searches the
    collected bins as they are. The search runs over every candidate, vectorized
    (``kl.ort_entropy_threshold``).
    """
    _check(stats, "histogram")
    counts, edges = stats.hist.symmetric()
    if num_bins is not None and stats.abs_max > 0:
        counts, edges = _ort_layout(counts, edges, stats.abs_max, max(int(num_bins), num_quantized_bins))
    if counts.size < num_quantized_bins:  # few, wide bins (constant data): pad with empty bins
        pad = (num_quantized_bins - counts.size) // 2 + 1
        w = edges[1] - edges[0]
        counts = np.pad(counts, pad)
        edges = np.concatenate(
            [edges[0] - w * np.arange(pad, 0, -1), edges, edges[-1] + w * np.arange(1, pad + 1)]
        )
    lo, hi = kl.ort_entropy_threshold(counts, edges, stats.min, stats.max, num_quantized_bins)
    return _sym(lo, hi, symmetric)


def distribution(stats: TensorStats, **_: Any) -> Range:
    """ORT's Distribution range for integer types: the symmetric span ``(-t, t)`` of its histogram,
    ``t = max |x|`` (always symmetric; float8 types use ``distribution_std`` instead)."""
    _check(stats)
    t = stats.abs_max
    return -t, t


#: ORT's histogram size for Distribution (its ``num_bins`` default).
ORT_DISTRIBUTION_BINS = 2048
#: ORT's Distribution scenarios: "same" (the data spreads like float8 values), "p3" (like a cube).
SCENARIOS = ("same", "p3")


def distribution_std(stats: TensorStats, scenario: str = "same") -> float:
    """The spread ORT's Distribution matches to the float8 grid: the standard deviation of ``x``
    ("same", from the exact moments) or of ``sign(x) |x|^(1/3)`` ("p3", from the bin centers of the
    histogram re-binned to ORT's 2048 bins over ``[-max|x|, max|x|]``, as ORT computes it)."""
    if scenario not in SCENARIOS:
        raise OptionError(f"extra_options['scenario'] = {scenario!r}: use one of {', '.join(SCENARIOS)}.")
    if scenario == "same":
        _check(stats, "moments")
        return float(stats.std)
    _check(stats, "histogram")
    counts, edges = stats.hist.symmetric()
    if stats.abs_max > 0:  # ORT's layout: 2048 bins over [-max|x|, max|x|]
        counts, edges = _ort_layout(counts, edges, stats.abs_max, ORT_DISTRIBUTION_BINS)
    n = counts.astype(np.float64)
    c = (edges[:-1] + edges[1:]) / 2
    v = np.sign(c) * np.abs(c) ** (1.0 / 3.0)
    mean = float((n * v).sum() / n.sum())
    return float(np.sqrt((n * (v - mean) ** 2).sum() / n.sum()))


def _mse_symmetric(stats: TensorStats, qmin: int, qmax: int) -> Range:
    counts, w = stats.hist.abs_histogram()
    n = counts.astype(np.float64)
    c = (np.arange(n.size) + 0.5) * w
    # candidate thresholds: the bin edges j * w, j = 1..size; values above are clipped
    suf_n = np.cumsum(n[::-1])[::-1]
    suf_c = np.cumsum((n * c)[::-1])[::-1]
    suf_c2 = np.cumsum((n * (c * c + w * w / 12.0))[::-1])[::-1]
    t = np.arange(1, n.size + 1) * w
    above = np.append(suf_n[1:], 0.0), np.append(suf_c[1:], 0.0), np.append(suf_c2[1:], 0.0)
    clip_err = above[2] - 2 * t * above[1] + t * t * above[0]
    s = 2 * t / (qmax - qmin)
    err = (suf_n[0] - above[0]) * s * s / 12.0 + clip_err
    best = float(min(t[int(np.argmin(err))], stats.abs_max))
    return -best, best


def _mse_asymmetric(stats: TensorStats, qmin: int, qmax: int, max_candidates: int = 256) -> Range:
    h = stats.hist
    n = h.counts.astype(np.float64)
    w = h.width
    edges = h.edges()
    c = h.centers()
    pre_n, pre_c, pre_c2 = (
        np.concatenate([[0.0], np.cumsum(a)]) for a in (n, n * c, n * (c * c + w * w / 12.0))
    )
    zero = -h.offset  # index of the edge at 0 (may be outside 0..nbins)
    lo_idx = np.arange(0, min(max(zero, 0), h.nbins) + 1)
    hi_idx = np.arange(max(min(zero, h.nbins), 0), h.nbins + 1)
    if lo_idx.size > max_candidates:
        lo_idx = np.unique(np.linspace(0, lo_idx[-1], max_candidates).round().astype(int))
    if hi_idx.size > max_candidates:
        hi_idx = np.unique(np.linspace(hi_idx[0], h.nbins, max_candidates).round().astype(int))
    lo_v = np.minimum(edges[lo_idx], 0.0)[:, None]
    hi_v = np.maximum(edges[hi_idx], 0.0)[None, :]
    a, b = lo_idx[:, None], hi_idx[None, :]
    below = pre_c2[a] - 2 * lo_v * pre_c[a] + lo_v * lo_v * pre_n[a]
    tot = pre_n[-1], pre_c[-1], pre_c2[-1]
    above = (tot[2] - pre_c2[b]) - 2 * hi_v * (tot[1] - pre_c[b]) + hi_v * hi_v * (tot[0] - pre_n[b])
    s = (hi_v - lo_v) / (qmax - qmin)
    err = (pre_n[b] - pre_n[a]) * s * s / 12.0 + below + above
    i, j = np.unravel_index(int(np.argmin(err)), err.shape)
    return max(float(lo_v[i, 0]), min(stats.min, 0.0)), min(float(hi_v[0, j]), max(stats.max, 0.0))


def mse(stats: TensorStats, *, qmin: int = -128, qmax: int = 127, symmetric: bool = False, **_: Any) -> Range:
    """The range minimizing the expected squared quantization error, estimated from the histogram.

    Error of a range: values inside add ``s^2 / 12`` each (rounding error, ``s = (rmax - rmin) /
    (qmax - qmin)``), values outside add their squared distance to the nearest end (clipping; within
    a bin, a uniform spread is assumed). Candidates are the bin edges: every edge of ``|x|`` when
    symmetric; up to 256 x 256 (lower, upper) pairs with ``lower <= 0 <= upper`` otherwise.
    """
    _check(stats, "histogram")
    if symmetric:
        return _mse_symmetric(stats, qmin, qmax)
    return _mse_asymmetric(stats, qmin, qmax)


def tune_candidates(threshold: float, abs_max: float, n: int = 10) -> np.ndarray:
    """TPU-MLIR auto-tune's candidates: ``n`` thresholds evenly spaced from the KLD one to ``abs_max``."""
    return np.linspace(threshold, max(threshold, abs_max), n)


def kld(
    stats: TensorStats,
    *,
    num_quantized_bins: int = 128,
    stride: int = 1,
    top_n: int = 1,
    tune: Callable[[TensorStats, float], float] | None = None,
    **_: Any,
) -> Range:
    """TPU-MLIR's KLD (TensorRT's entropy calibration) on the ``|x|`` histogram; always symmetric.

    ``stride`` 1 tries every cut (TensorRT), 128 is the TPU-MLIR manual's loop; ``top_n`` is Compass'
    ``[N]kld``. ``tune(stats, threshold) -> threshold`` is the hook for TPU-MLIR's auto-tune (which runs
    the model: see ``tune_candidates``); its result is used as is.
    """
    _check(stats, "histogram")
    counts, w = stats.hist.abs_histogram()
    t = kl.kld_threshold(counts, w, stats.abs_max, num_quantized_bins, stride, top_n)
    if tune is not None:
        t = float(tune(stats, t))
    return -t, t


def _pof2_range(stats: TensorStats, method: str, qmin: int, qmax: int, **options: Any) -> Range:
    from zonnx.quantization.calibration import pof2

    pos = (
        pof2.nonoverflow_pos(stats, qmin, qmax)
        if method == "nonoverflow"
        else pof2.minmse_pos(stats, qmin, qmax, **options)
    )
    return pof2.pos_to_range(pos, qmin, qmax)


_DISPATCH: dict[str, Callable[..., Range]] = {
    "minmax": minmax,
    "movingaverage": moving_average,
    "mean": compass_mean,
    "nstd": nstd,
    "percentile": percentile,
    "entropy": entropy,
    "mse": mse,
    "kld": kld,
    "distribution": distribution,
}


def compute_range(
    stats: TensorStats,
    method: str | Enum,
    *,
    qmin: int = -128,
    qmax: int = 127,
    symmetric: bool | None = None,
    **options: Any,
) -> Range:
    """The range of ``method`` (a name or enum) for one tensor; ``options`` go to the method function.

    ``symmetric=None`` keeps the method's own default (True for percentile, as ORT; False otherwise).

    Power-of-two methods (``nonoverflow``, ``minmse``) return ``(qmin * 2**-pos, qmax * 2**-pos)``;
    use ``pof2`` directly for ``pos``.
    """
    name = method_name(method)
    if name in ("nonoverflow", "minmse"):
        _check(stats, "histogram" if name == "minmse" else "extrema")
        return _pof2_range(stats, name, qmin, qmax, **options)
    if symmetric is not None:
        options["symmetric"] = symmetric
    lo, hi = _DISPATCH[name](stats, qmin=qmin, qmax=qmax, **options)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise CalibrationError(f"tensor {stats.name!r}: method {name} gave a non-finite range ({lo}, {hi}).")
    return lo, hi
