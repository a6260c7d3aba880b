"""Streaming statistics: the grid histogram equals a one-shot histogram, counts are never lost."""

from __future__ import annotations

import math

import numpy as np
import pytest

from zonnx.quantization.calibration.stats import GridHistogram, TensorStats


def _batches(rng: np.random.Generator) -> list[np.ndarray]:
    # the spread grows batch after batch (forcing re-binning), a shifted batch and an outlier one
    return [
        rng.normal(0.0, 0.01, 3000),
        rng.normal(0.5, 1.0, 5000),
        rng.laplace(-2.0, 3.0, 4000),
        np.array([-250.0, 17.0, 480.5]),
        rng.normal(0.0, 1.0, 7000),
    ]


def _one_shot(h: GridHistogram, data: np.ndarray) -> np.ndarray:
    return np.histogram(data, bins=h.edges())[0]


@pytest.mark.parametrize("bins", [2048, 64])
def test_rebinned_histogram_equals_one_shot(bins: int) -> None:
    rng = np.random.default_rng(0)
    h = GridHistogram(bins)
    seen = []
    for b in _batches(rng):
        h.add(b)
        seen.append(b)
        data = np.concatenate(seen)
        assert h.total == data.size
        ref = _one_shot(h, data)
        assert ref.sum() == data.size  # the grid covers every value
        # only values within float rounding of an edge may land one bin over
        assert np.abs(ref - h.counts).sum() <= 2
    assert h.edges()[0] <= data.min() and h.edges()[-1] >= data.max()
    # the data span covers at least half the bins after growth
    assert (data.max() - data.min()) / h.width >= bins / 2 - 2


def test_zero_is_an_edge_and_width_doubles() -> None:
    h = GridHistogram(16)
    h.add(np.linspace(0.1, 1.3, 50))
    w0 = h.width
    h.add(np.array([-7.0]))
    k = math.log2(h.width / w0)
    assert k == round(k) and k >= 1
    assert np.isclose(h.edges() / h.width, np.round(h.edges() / h.width)).all()  # grid anchored at zero
    assert h.total == 51


def test_constant_then_wider_and_float32_path() -> None:
    h = GridHistogram(256)
    h.add(np.zeros(100, dtype=np.float32))
    assert h.total == 100
    x = np.random.default_rng(1).normal(3.0, 2.0, 20000).astype(np.float32)
    h.add(x)
    assert h.total == 20100
    ref = np.histogram(np.concatenate([np.zeros(100), x.astype(np.float64)]), bins=h.edges())[0]
    assert np.abs(ref - h.counts).sum() <= 20  # float32 index arithmetic: a few edge values move one bin


def test_abs_symmetric_and_relu_views_are_exact() -> None:
    x = np.random.default_rng(2).normal(0.7, 1.5, 40000)
    h = GridHistogram(512)
    for part in np.array_split(x, 4):
        h.add(part)
    a, w = h.abs_histogram()
    assert a.sum() == x.size
    assert np.abs(np.histogram(np.abs(x), bins=np.arange(a.size + 1) * w)[0] - a).sum() <= 2
    s, edges = h.symmetric()
    assert s.size % 2 == 0 and np.isclose(edges[s.size // 2], 0.0) and np.isclose(-edges[0], edges[-1])
    assert np.abs(np.histogram(x, bins=edges)[0] - s).sum() <= 2
    r = h.relu()
    assert np.abs(np.histogram(np.maximum(x, 0), bins=r.edges())[0] - r.counts).sum() <= 2
    assert r.counts[0] == (x < r.width).sum()


def test_far_from_zero_layout_stays_small() -> None:
    h = GridHistogram(128)
    h.add(np.random.default_rng(3).uniform(1000.0, 1001.0, 5000))
    a, w = h.abs_histogram()
    s, _ = h.symmetric()
    assert a.size <= 128 and s.size <= 256 and a.sum() == s.sum() == 5000
    assert a.size * w >= 1001.0


def test_tensor_stats_against_direct_computation() -> None:
    rng = np.random.default_rng(4)
    batches = [rng.normal(i, 1 + i, 1000 + 100 * i).astype(np.float32) for i in range(6)]
    st = TensorStats("t", averaging_constant=0.01, momentum=0.9)
    for b in batches:
        st.update(b)
    data = np.concatenate(batches).astype(np.float64)
    assert st.count == data.size and st.batches == 6
    assert st.min == data.min() and st.max == data.max()
    assert np.isclose(st.mean, data.mean(), rtol=1e-9) and np.isclose(st.std, data.std(), rtol=1e-9)
    mins = [float(b.min()) for b in batches]
    maxs = [float(b.max()) for b in batches]
    ema, cm = mins[0], mins[0]
    for v in mins[1:]:
        ema = ema + 0.01 * (v - ema)
        cm = 0.9 * cm + 0.1 * v
    assert np.isclose(st.ema_min, ema) and np.isclose(st.mean_min, cm)
    assert np.isclose(st.batch_max_sum / st.batches, np.mean(maxs))
    assert st.hist.total == data.size


def test_non_finite_batches_are_skipped() -> None:
    st = TensorStats("t")
    st.update(np.array([1.0, 2.0]))
    st.update(np.array([np.nan, 3.0]))
    st.update(np.array([-np.inf, 3.0]))
    assert (st.batches, st.skipped_batches, st.count, st.max) == (1, 2, 2, 2.0)
