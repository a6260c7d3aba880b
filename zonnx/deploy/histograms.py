"""Activation histograms of the worst layers with the clipping range the quantizer chose, for report.html.

Worst layers: the quantized activations with the lowest SQNR in ``quantize_static``'s layer report.
Histogram: the calibration grid histogram of the tensor (``TensorStats.hist``) from the saved
statistics when the calibration method kept one, else from one extra collection over the calibration
samples for those tensors only. For the chart the occupied bins are merged in runs of ``k`` (the least
that leaves at most ``MAX_BARS`` bars); counts are exact sums. Clipping range: what the chosen
parameters can represent, ``[(qmin - zp) * scale, (qmax - zp) * scale]`` (per-tensor activations).
"""

from __future__ import annotations

__all__ = ["MAX_BARS", "clip_range", "bars", "worst_histograms"]

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from zonnx.quantization.calibration.stats import GridHistogram, TensorStats
from zonnx.quantization.plan import QuantPlan
from zonnx.quantization.schemes import QuantParams

logger = logging.getLogger(__name__)

#: Most bars drawn per histogram.
MAX_BARS = 120


def clip_range(params: QuantParams) -> tuple[float, float] | None:
    """``[(qmin - zp) s, (qmax - zp) s]`` of per-tensor parameters; None for per-channel ones."""
    if params.per_channel or np.asarray(params.scale).size != 1:
        return None
    s, zp = (
        float(np.asarray(params.scale).reshape(-1)[0]),
        float(np.asarray(params.zero_point).reshape(-1)[0]),
    )
    return (params.qmin - zp) * s, (params.qmax - zp) * s


def bars(hist: GridHistogram) -> tuple[list[float], float, list[int]]:
    """(left edges, bar width, counts) of the occupied bins merged in runs of the least ``k`` fitting."""
    assert hist.counts is not None
    nz = np.nonzero(hist.counts)[0]
    if nz.size == 0:
        return [], hist.width, []
    lo, hi = int(nz[0]), int(nz[-1]) + 1
    k = max(1, math.ceil((hi - lo) / MAX_BARS))
    counts = hist.counts[lo:hi]
    pad = (-counts.size) % k
    merged = np.concatenate([counts, np.zeros(pad, dtype=counts.dtype)]).reshape(-1, k).sum(axis=1)
    width = hist.width * k
    left = (hist.offset + lo + np.arange(merged.size) * k) * hist.width
    return [float(x) for x in left], float(width), [int(c) for c in merged]


def worst_histograms(
    layers: Sequence[Mapping[str, Any]],
    plan: QuantPlan,
    prepared: onnx.ModelProto,
    samples: Sequence[dict[str, np.ndarray]],
    stats_path: Path | None,
    count: int,
) -> list[dict[str, Any]]:
    """One record per worst layer (lowest SQNR first): tensor, op, SQNR, bars, clip range, data range."""
    from zonnx.quantization.calibration.collector import collect
    from zonnx.quantization.calibration.readers import ListReader
    from zonnx.quantization.calibration.stats_file import load_stats

    def sqnr(row: Mapping[str, Any]) -> float:
        v = row.get("sqnr_db")
        return math.inf if v in (None, "inf") else -math.inf if v == "-inf" else float(v)

    chosen = []
    for row in sorted(layers, key=sqnr):
        tp = plan.tensors.get(row["tensor"])
        clip = clip_range(tp.params) if tp is not None and tp.params is not None else None
        if clip is not None and row["tensor"] not in {r["tensor"] for r, _ in chosen}:
            chosen.append((row, clip))
        if len(chosen) == count:
            break
    if not chosen:
        return []
    names = [r["tensor"] for r, _ in chosen]
    stats: dict[str, TensorStats] = {}
    if stats_path is not None and stats_path.is_file():
        stats = {n: s for n, s in load_stats(stats_path).items() if n in names and s.hist is not None}
    missing = [n for n in names if n not in stats]
    if missing and samples:
        logger.info(
            "histograms: collecting %d worst-layer histograms over %d samples", len(missing), len(samples)
        )
        stats.update(collect(prepared, missing, ListReader(list(samples)), methods_needed=["percentile"]))
    out = []
    for row, clip in chosen:
        st = stats.get(row["tensor"])
        if st is None or st.hist is None or st.hist.counts is None:
            continue
        left, width, counts = bars(st.hist)
        out.append({"tensor": row["tensor"], "op_type": row.get("op_type", ""), "sqnr_db": sqnr(row),
                    "left": left, "width": width, "counts": counts, "clip": list(clip),
                    "data": [st.min, st.max]})  # fmt: skip
    return out
