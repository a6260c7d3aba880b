"""Range methods against direct computations on the raw data, and KL searches against ORT and a plain loop."""

from __future__ import annotations

import numpy as np
import pytest
from onnxruntime.quantization import CalibrationMethod
from onnxruntime.quantization.calibrate import HistogramCollector
from onnxruntime.quantization.quant_utils import smooth_distribution

from zonnx.errors import OptionError
from zonnx.quantization.calibration import kl, methods, pof2
from zonnx.quantization.calibration.readers import CalibrationError
from zonnx.quantization.calibration.stats import TensorStats
from zonnx.quantization.enums import PowerOfTwoMethod, ZonnxCalibrationMethod

DISTS = {
    "gauss": lambda r: r.normal(0.2, 1.0, 60000),
    "laplace": lambda r: r.laplace(0.0, 0.5, 60000),
    "relu": lambda r: np.maximum(r.normal(0.0, 1.0, 60000), 0.0),
    "bimodal": lambda r: np.concatenate([r.normal(-3.0, 0.3, 20000), r.normal(2.0, 1.0, 40000)]),
}


def _stats(x: np.ndarray, bins: int = 2048, batches: int = 4) -> TensorStats:
    st = TensorStats("t")
    for part in np.array_split(x, batches):
        st.update(part, bins=bins)
    return st


@pytest.fixture(scope="module", params=list(DISTS))
def data(request: pytest.FixtureRequest) -> tuple[np.ndarray, TensorStats]:
    x = DISTS[request.param](np.random.default_rng(7))
    return x, _stats(x)


def test_minmax_and_averages_are_exact(data) -> None:
    x, st = data
    assert methods.minmax(st) == (x.min(), x.max())
    t = np.abs(x).max()
    assert methods.minmax(st, symmetric=True) == (-t, t)
    parts = np.array_split(x, 4)
    lo, hi = methods.moving_average(st)
    assert np.isclose(lo, np.mean([p.min() for p in parts])) and np.isclose(
        hi, np.mean([p.max() for p in parts])
    )
    lo, hi = methods.compass_mean(st)
    ref = parts[0].max()
    for p in parts[1:]:
        ref = 0.9 * ref + 0.1 * p.max()
    assert np.isclose(hi, ref)


def test_nstd(data) -> None:
    x, st = data
    lo, hi = methods.nstd(st, n=2.0, clip=False)
    assert np.isclose(lo, x.mean() - 2 * x.std()) and np.isclose(hi, x.mean() + 2 * x.std())
    lo, hi = methods.nstd(st, n=100.0)
    assert (lo, hi) == (x.min(), x.max())


@pytest.mark.parametrize("p", [99.0, 99.99])
def test_percentile_within_one_bin_of_numpy(data, p: float) -> None:
    x, st = data
    _, w = st.hist.abs_histogram()
    lo, hi = methods.percentile(st, percentile=p)
    assert lo == -hi and abs(hi - np.percentile(np.abs(x), p)) <= w
    lo, hi = methods.percentile(st, percentile=p, symmetric=False)
    cut = (100 - p) / 2
    assert abs(lo - np.percentile(x, cut)) <= st.hist.width
    assert abs(hi - np.percentile(x, 100 - cut)) <= st.hist.width


def test_entropy_matches_ort_on_the_same_histogram(data) -> None:
    x, _ = data
    st = _stats(x, bins=512)
    counts, edges = st.hist.symmetric()
    ort_lo, ort_hi = HistogramCollector("entropy", False, 512, 128, 99.9, "same").get_entropy_threshold(
        (counts, edges.astype(np.float32), np.float32(st.min), np.float32(st.max)), 128
    )
    lo, hi = methods.entropy(st)
    assert np.isclose(lo, float(ort_lo), rtol=1e-6) and np.isclose(hi, float(ort_hi), rtol=1e-6)


def _naive_kld(a: np.ndarray, nq: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """TensorRT's loop written out plainly (P with outliers, Q spread over non-empty bins, smoothed)."""
    cands, out = [], []
    for i in range(nq, a.size + 1, stride):
        p = a[:i].astype(np.float64).copy()
        p[i - 1] += a[i:].sum()
        m = i // nq
        q = np.zeros(i)
        for j in range(nq):
            lo, hi = j * m, ((j + 1) * m if j < nq - 1 else i)
            chunk = a[lo:hi]
            nz = chunk > 0
            if nz.any():
                q[lo:hi][nz] = chunk.sum() / nz.sum()
        ps, qs = smooth_distribution(p), smooth_distribution(q)
        ps, qs = ps / ps.sum(), qs / qs.sum()
        cands.append(i)
        out.append(float(np.sum(ps * np.log(ps / qs))))
    return np.array(cands), np.array(out)


@pytest.mark.parametrize("stride", [1, 128])
def test_kld_divergences_match_the_plain_loop(data, stride: int) -> None:
    x, _ = data
    a, _ = _stats(x, bins=1024).hist.abs_histogram()
    cand, div = kl.kld_divergences(a, 128, stride)
    ref_cand, ref = _naive_kld(a, 128, stride)
    assert np.array_equal(cand, ref_cand)
    assert np.allclose(div, ref, rtol=2e-4, atol=1e-6)
    assert int(cand[np.argmin(div)]) == int(ref_cand[np.argmin(ref)])


def test_kld_threshold_formula_and_top_n(data) -> None:
    x, st = data
    a, w = st.hist.abs_histogram()
    cand, div = kl.kld_divergences(a)
    lo, hi = methods.kld(st)
    assert lo == -hi and np.isclose(hi, min((cand[np.argmin(div)] + 0.5) * w, st.abs_max))
    assert methods.kld(st, top_n=50)[1] >= hi
    assert methods.kld(st, tune=lambda s, t: t * 0.5)[1] == pytest.approx(hi * 0.5)
    assert methods.tune_candidates(hi, st.abs_max).size == 10


def _mse(x: np.ndarray, lo: float, hi: float) -> float:
    """Mean squared error of int8 fake quantization of x with range (lo, hi)."""
    s = (hi - lo) / 255
    zp = np.round(-128 - lo / s)
    return float(np.mean(((np.clip(np.round(x / s) + zp, -128, 127) - zp) * s - x) ** 2))


def test_mse_is_near_the_brute_force_optimum(data) -> None:
    x, st = data
    t_grid = np.linspace(np.abs(x).max() / 400, np.abs(x).max(), 400)
    best_sym = min(_mse(x, -t, t) for t in t_grid)
    lo, hi = methods.mse(st, symmetric=True)
    assert _mse(x, lo, hi) <= 1.05 * best_sym
    lo, hi = methods.mse(st)
    assert lo <= 0 <= hi
    grid = [
        (a, b)
        for a in np.linspace(min(x.min(), 0), 0, 60)
        for b in np.linspace(0, max(x.max(), 0), 60)
        if b > a
    ]
    best = min(_mse(x, a, b) for a, b in grid)
    assert _mse(x, lo, hi) <= 1.05 * best


def test_power_of_two_positions(data) -> None:
    x, st = data
    assert pof2.pos_overflow(-1.0, 1.0) == 6 and pof2.pos_overflow(-0.99, 0.99) == 7
    assert pof2.pos_overflow(0.0, 0.0) == 127 and pof2.weight_diffs_pos(np.zeros(5)) == 127
    pos = pof2.nonoverflow_pos(st)
    s = 2.0**-pos
    assert x.max() <= (127 + 0.5) * s and x.min() >= (-128 - 0.5) * s  # does not saturate
    assert x.max() > (127 + 0.5) * s / 2 or x.min() < (-128 - 0.5) * s / 2  # and pos + 1 would

    def sse(p: int) -> float:
        s = 2.0**-p
        return float(np.sum((np.clip(np.round(x / s), -128, 127) * s - x) ** 2))

    # the expected error from the histogram tracks the error on the raw data
    for p in range(pos, pos + 5):
        assert pof2.expected_sq_error(st.hist, p) == pytest.approx(sse(p), rel=0.02)
    chosen = pof2.minmse_pos(st)
    assert sse(chosen) <= 1.01 * min(sse(p) for p in range(chosen - 4, chosen + 5))
    assert methods.compute_range(st, PowerOfTwoMethod.MinMSE) == pof2.pos_to_range(chosen)


def test_weight_diffs_pos_is_the_least_sse_candidate() -> None:
    w = np.random.default_rng(5).normal(0.0, 0.05, (256, 64, 3, 3)).astype(np.float32)
    w[0, 0, 0, 0] = 0.5  # one outlier makes the non-overflow position coarse; clipping it costs less
    p0 = pof2.pos_overflow(float(w.min()), float(w.max()))
    pos = pof2.weight_diffs_pos(w)

    def sse(p: int) -> float:
        s = 2.0**-p
        return float(np.sum((np.clip(np.round(w / s), -128, 127) * s - w.astype(np.float64)) ** 2))

    assert p0 <= pos <= p0 + 4 and pos > p0
    assert sse(pos) == min(sse(p) for p in range(p0, p0 + 5))


def test_names_enums_and_requirements() -> None:
    assert methods.method_name(CalibrationMethod.Entropy) == "entropy"
    assert methods.method_name(PowerOfTwoMethod.NonOverflow) == "nonoverflow"
    assert methods.method_name(ZonnxCalibrationMethod.NStd) == "nstd"
    assert methods.method_name("Moving_Average") == "movingaverage"
    assert methods.requirements(["minmax"]) == {"extrema"}
    assert methods.requirements(["entropy", "nstd"]) == {"extrema", "histogram", "moments"}
    with pytest.raises(OptionError, match="Did you mean 'percentile'"):
        methods.method_name("percentil")


def test_missing_statistics_raise_calibration_errors() -> None:
    st = TensorStats("conv_out")
    with pytest.raises(CalibrationError, match="conv_out.*no finite values"):
        methods.minmax(st)
    st.update(np.arange(10.0), histogram=False, moments=False)
    with pytest.raises(CalibrationError, match="no histogram was collected"):
        methods.compute_range(st, "percentile")
    with pytest.raises(CalibrationError, match="mean/std were not collected"):
        methods.compute_range(st, "nstd")
    assert methods.compute_range(st, "minmax") == (0.0, 9.0)
