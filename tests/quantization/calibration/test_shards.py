"""Sharded calibration merges bit for bit into the one-process statistics, ranges and scales."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from zonnx import zoo
from zonnx.errors import OptionError
from zonnx.quantization.api import quantize_static
from zonnx.quantization.calibration.collector import collect
from zonnx.quantization.calibration.methods import compute_range
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.calibration.shards import collect_sharded
from zonnx.quantization.calibration.stats import TensorStats
from zonnx.quantization.observe import float_activations

METHODS = ("percentile", "nstd", "entropy")


def assert_same_stats(a: dict[str, TensorStats], b: dict[str, TensorStats]) -> None:
    """Every field of every tensor equal (NaN equal to NaN), histograms equal bin for bin."""
    assert list(a) == list(b)
    for name, x in a.items():
        y = b[name]
        for f in dataclasses.fields(TensorStats):
            if f.name == "hist":
                continue
            u, v = getattr(x, f.name), getattr(y, f.name)
            assert u == v or (isinstance(u, float) and math.isnan(u) and math.isnan(v)), (name, f.name, u, v)
        assert (x.hist is None) == (y.hist is None), name
        if x.hist is not None:
            assert (x.hist.width, x.hist.offset) == (y.hist.width, y.hist.offset), name
            np.testing.assert_array_equal(x.hist.counts, y.hist.counts, err_msg=name)


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.fixture(scope="module")
def digits() -> tuple[onnx.ModelProto, list[str], list[dict]]:
    model = onnx.shape_inference.infer_shapes(onnx.load(zoo.get("digits_cnn")))
    return model, float_activations(model), zoo.sample_inputs("digits_cnn", 10)


@pytest.mark.parametrize("shards", [2, 3, 12])
def test_shards_merge_bit_for_bit(digits, shards: int) -> None:
    model, names, feeds = digits
    # a small histogram sample so the per-batch sampling steps matter (every tensor is sampled)
    kw = {"methods_needed": METHODS, "hist_sample": 256}
    one = collect(model, names, ListReader(feeds), **kw)
    seen: list[int] = []
    merged = collect_sharded(model, names, ListReader(feeds), shards=shards, progress=seen.append, **kw)
    assert seen == list(range(10))
    assert_same_stats(one, merged)
    assert one[names[-1]].batches == 10 and one[names[-1]].hist.total > 0
    for name in names:
        for method in METHODS:
            assert compute_range(one[name], method, qmin=-128, qmax=127) == compute_range(
                merged[name], method, qmin=-128, qmax=127
            )


def test_quantize_static_with_calib_shards_writes_the_same_scales(digits) -> None:
    _, _, feeds = digits
    path = zoo.get("digits_cnn")
    extra = {"CalibHistogramSample": 1024}
    one = quantize_static(path, None, ListReader(feeds), calibrate_method="Percentile", extra_options=extra)
    sharded = quantize_static(
        path,
        None,
        ListReader(feeds),
        calibrate_method="Percentile",
        extra_options={**extra, "CalibShards": 3},
    )
    a, b = initializers(one.model), initializers(sharded.model)
    scales = [n for n in a if n.endswith("_scale")]
    assert len(scales) > 5 and a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_calib_shards_below_one_is_refused() -> None:
    with pytest.raises(OptionError, match=r"CalibShards'\] = 0: give at least 1 shard"):
        quantize_static(zoo.get("digits_cnn"), None, None, extra_options={"CalibShards": 0})


def test_inputs_of_different_widths_shard_exactly() -> None:
    """PP-OCRv4 rec on lines of different widths: a shard's first batch samples with the steps of the
    batch before it, as the one-process run does, so even the histogram samples agree."""
    model = onnx.load(str(zoo.get("ppocr_rec")))
    feeds = zoo.sample_inputs("ppocr_rec", 4)
    assert len({f["x"].shape[3] for f in feeds}) > 2
    names = [o for n in model.graph.node if n.op_type in ("Conv", "Add", "MatMul") for o in n.output][:60]
    kw = {"methods_needed": ("percentile",), "hist_sample": 1024}
    assert_same_stats(
        collect(model, names, feeds, **kw), collect_sharded(model, names, feeds, shards=3, **kw)
    )
