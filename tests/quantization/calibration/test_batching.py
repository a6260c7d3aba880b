"""Batched calibration runs give the statistics, ranges and quantized model of one-sample runs, bit for bit."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest

from tests.quantization.calibration.test_shards import assert_same_stats
from zonnx import zoo
from zonnx.errors import OptionError
from zonnx.ir.io import to_proto
from zonnx.quantization.api import quantize_static
from zonnx.quantization.calibration.collector import collect
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.observe import float_activations

# histograms (with small sampling steps, so the per-sample strides matter) and moving averages
KW = {"methods_needed": ("percentile", "entropy", "movingaverage"), "hist_sample": 1024}
LOG = "zonnx.quantization.calibration.batching"


def _mixing_model() -> onnx.ModelProto:
    """Each sample's output depends on the whole batch (a mean over axis 0): shapes allow batching,
    values do not."""
    return onnx.parser.parse_model(
        """<ir_version: 8, opset_import: ["" : 13]>
        g (float[N, 16] x) => (float[N, 16] y) {
            m = ReduceMean <axes = [0], keepdims = 1> (x)
            a = Add (x, m)
            y = Relu (a)
        }"""
    )


def _feeds(n: int, rows: int = 1, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((rows, 16)).astype(np.float32)} for _ in range(n)]


def test_resnet18_batched_stats_equal_single_runs(caplog) -> None:
    model = to_proto(zoo.get("resnet18-random"))
    model = onnx.shape_inference.infer_shapes(model)
    names = float_activations(model)
    feeds = zoo.sample_inputs("resnet18-random", 6, seed=1)
    one = collect(model, names, ListReader(feeds), **KW)
    seen: list[int] = []
    with caplog.at_level(logging.INFO, logger=LOG):
        batched = collect(model, names, ListReader(feeds), batch=4, progress=seen.append, **KW)
    assert "batches of 4 samples" in caplog.text
    assert "one sample at a time" not in caplog.text
    assert seen == list(range(6))
    assert_same_stats(one, batched)
    assert one[names[-1]].batches == 6


def test_moments_run_one_sample_at_a_time(caplog) -> None:
    feeds = _feeds(5)
    kw = {"methods_needed": ("nstd",)}
    one = collect(_mixing_model(), ["x", "a"], ListReader(feeds), **kw)
    with caplog.at_level(logging.INFO, logger=LOG):
        batched = collect(_mixing_model(), ["x", "a"], ListReader(feeds), batch=4, **kw)
    assert "moments (sums) depend on ORT's summation order" in caplog.text
    assert_same_stats(one, batched)


@pytest.mark.parametrize("method", ["MinMax", "Percentile"])
def test_quantize_static_batched_model_is_byte_identical(tmp_path, caplog, method: str) -> None:
    src = zoo.get("digits_cnn")
    feeds = zoo.sample_inputs("digits_cnn", 12, seed=2)
    outs = {}
    for batch in (1, 8):
        path = tmp_path / f"q{batch}.onnx"
        with caplog.at_level(logging.INFO, logger=LOG):
            quantize_static(
                src, path, ListReader(feeds), calibrate_method=method, extra_options={"CalibBatch": batch}
            )
        outs[batch] = path.read_bytes()
    assert "batches of 8 samples" in caplog.text
    assert outs[1] == outs[8]


def test_batch_mixing_values_falls_back_with_same_stats(caplog) -> None:
    model = _mixing_model()
    feeds = _feeds(7)
    names = ["x", "a", "y"]  # not m: its shape [1, 16] alone would stop batching
    one = collect(model, names, ListReader(feeds), **KW)
    with caplog.at_level(logging.INFO, logger=LOG):
        batched = collect(model, names, ListReader(feeds), batch=4, **KW)
    assert "gives other values than single runs" in caplog.text
    assert_same_stats(one, batched)


def test_fixed_batch_and_multi_row_samples_keep_single_run_stats(caplog) -> None:
    # samples of 3 rows on a symbolic batch go through the plain model, interleaved with 1-row samples
    model = onnx.parser.parse_model(
        """<ir_version: 8, opset_import: ["" : 13]>
        g (float[N, 16] x) => (float[N, 16] y) {
            s = Sigmoid (x)
            y = Mul (x, s)
        }"""
    )
    feeds = _feeds(3) + _feeds(2, rows=3, seed=1) + _feeds(3, seed=2)
    one = collect(model, ["x", "s", "y"], ListReader(feeds), **KW)
    with caplog.at_level(logging.INFO, logger=LOG):
        batched = collect(model, ["x", "s", "y"], ListReader(feeds), batch=8, **KW)
    assert "has a batch above 1" in caplog.text
    assert_same_stats(one, batched)
    fixed = onnx.parser.parse_model(
        """<ir_version: 8, opset_import: ["" : 13]>
        g (float[2, 16] x) => (float[2, 16] y) { y = Relu (x) }"""
    )
    with caplog.at_level(logging.INFO, logger=LOG):
        collect(fixed, ["x", "y"], ListReader(_feeds(2, rows=2)), batch=8, **KW)
    assert "fixed batch above 1" in caplog.text


def test_reshape_to_leading_one_is_rewritten(caplog) -> None:
    """A Reshape to a constant [1, ...] shape gets [0, ...], so the graph still batches."""
    model = onnx.parser.parse_model(
        """<ir_version: 8, opset_import: ["" : 13]>
        g (float[1, 4, 4] x) => (float[1, 16] y) <int64[2] shape = {1, 16}> {
            r = Reshape (x, shape)
            y = Relu (r)
        }"""
    )
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((1, 4, 4)).astype(np.float32)} for _ in range(5)]
    one = collect(model, ["x", "r", "y"], ListReader(feeds), **KW)
    with caplog.at_level(logging.INFO, logger=LOG):
        batched = collect(model, ["x", "r", "y"], ListReader(feeds), batch=4, **KW)
    assert "batches of 4 samples" in caplog.text
    assert_same_stats(one, batched)


def test_calib_batch_below_one_is_refused(tmp_path) -> None:
    with pytest.raises(OptionError, match=r"CalibBatch'\] = 0"):
        quantize_static(
            zoo.get("digits_cnn"), tmp_path / "q.onnx", ListReader(_feeds(1)), extra_options={"CalibBatch": 0}
        )
