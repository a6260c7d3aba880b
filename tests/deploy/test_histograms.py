"""Worst-layer histograms for report.html: exact bar counts and the clipping range of the chosen scale."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from zonnx import zoo
from zonnx.deploy.histograms import MAX_BARS, bars, clip_range, worst_histograms
from zonnx.quantization.api import quantize_static
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.calibration.stats import GridHistogram


def test_bars_keep_every_count_within_the_bar_limit() -> None:
    rng = np.random.default_rng(0)
    h = GridHistogram(2048)
    for scale in (1.0, 3.0, 0.5):  # the grid grows once
        h.add(rng.normal(0.5, scale, 5000).astype(np.float32))
    left, width, counts = bars(h)
    assert sum(counts) == h.total == 15000
    assert len(counts) <= MAX_BARS and len(left) == len(counts)
    assert counts[0] > 0 and counts[-1] > 0  # trimmed to the occupied bins
    np.testing.assert_allclose(np.diff(left), width)


def test_worst_histograms_of_a_quantized_zoo_model(tmp_path: Path) -> None:
    feeds = zoo.sample_inputs("digits_cnn", 8)
    out = tmp_path / "int8.onnx"
    result = quantize_static(zoo.get("digits_cnn"), out, ListReader(feeds), activation_type="int8",
                             extra_options={"ActivationSymmetric": True})  # fmt: skip
    layers = json.loads(Path(f"{out}.report.json").read_text())["layers"]
    found = worst_histograms(layers, result.plan, result.prepared, feeds, None, 3)
    assert len(found) == 3
    sqnr = [h["sqnr_db"] for h in found]
    assert sqnr == sorted(sqnr) and sqnr[0] == min(
        float(r["sqnr_db"]) for r in layers if r["tensor"] in result.plan.tensors
    )
    for h in found:
        params = result.plan.tensors[h["tensor"]].params
        lo, hi = clip_range(params)
        s = float(params.scale)
        assert (params.qmin, params.qmax) == (-127, 127)  # symmetric int8: ORT's restricted range
        assert h["clip"] == [lo, hi] and lo == -127 * s and hi == 127 * s
        # min/max calibration: the range is the data's largest magnitude
        assert abs(max(-h["data"][0], h["data"][1]) - hi) <= 1e-6 * hi
        assert sum(h["counts"]) > 0 and h["left"][0] <= h["data"][0] < h["left"][0] + h["width"]
