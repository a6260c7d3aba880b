"""Readers and feed validation: every bad feed names the sample and the input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnxruntime.quantization import CalibrationDataReader

from tests.helpers import parse
from zonnx.quantization.calibration.readers import CalibrationError, ListReader, NpzReader, validated

MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 3, H, W] image, int64[1, 4] ids) => (float[1, 3, H, W] y) {
    y = Relu(image)
}
"""


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return parse(MODEL)


def _feed(w: int = 8, **over) -> dict[str, np.ndarray]:
    feed = {"image": np.ones((1, 3, 4, w), np.float32), "ids": np.zeros((1, 4), np.int64)}
    feed.update(over)
    return feed


class OrtStyle(CalibrationDataReader):
    def __init__(self, feeds):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


def test_ort_reader_list_and_variable_shapes(model) -> None:
    feeds = [_feed(8), _feed(13), _feed(5)]
    got = list(validated(OrtStyle(feeds), model))
    assert [f["image"].shape[3] for f in got] == [8, 13, 5]
    assert len(list(validated(ListReader(feeds), model))) == 3
    assert len(list(validated(feeds, model))) == 3  # a plain list of dicts works too


@pytest.mark.parametrize(
    "feed, pattern",
    [
        (
            {"imagee": np.ones((1, 3, 4, 8), np.float32)},
            r"sample 1: input 'imagee' is not an input.*Did you mean 'image'",
        ),
        (
            _feed(image=np.ones((1, 3, 4, 8), np.float64)),
            r"sample 1, input 'image': dtype float64 .* expects float32",
        ),
        (_feed(image=np.ones((3, 4, 8), np.float32)), r"sample 1, input 'image': .*rank 3 .*rank 4"),
        (_feed(image=np.ones((1, 1, 4, 8), np.float32)), r"sample 1, input 'image': .*axis 1 \(1 != 3\)"),
        (_feed(ids=np.zeros((1, 4), np.int32)), r"sample 1, input 'ids': dtype int32"),
    ],
)
def test_bad_feeds_name_sample_and_input(model, feed, pattern) -> None:
    with pytest.raises(CalibrationError, match=pattern):
        list(validated(ListReader([_feed(), feed]), model))


def test_missing_input_nan_inf_and_empty(model) -> None:
    with pytest.raises(CalibrationError, match="sample 0: no value for model input 'ids'"):
        list(validated([{"image": np.ones((1, 3, 4, 8), np.float32)}], model))
    bad = np.ones((1, 3, 4, 8), np.float32)
    bad[0, 2, 1, 5] = np.nan
    with pytest.raises(
        CalibrationError, match=r"sample 2, input 'image': holds NaN \(first at index \(0, 2, 1, 5\)\)"
    ):
        list(validated([_feed(), _feed(), _feed(image=bad)], model))
    bad[0, 2, 1, 5] = -np.inf
    with pytest.raises(CalibrationError, match="holds Inf"):
        list(validated([_feed(image=bad)], model))
    with pytest.raises(CalibrationError, match="produced no samples"):
        list(validated(ListReader([]), model))
    with pytest.raises(CalibrationError, match="returned list"):
        list(validated([[1, 2]], model))
    with pytest.raises(CalibrationError, match="no get_next"):
        list(validated(42, model))


def test_npz_reader_forms(tmp_path, model) -> None:
    rng = np.random.default_rng(0)
    images = rng.normal(size=(5, 3, 4, 8)).astype(np.float32)
    ids = np.arange(20, dtype=np.int64).reshape(5, 4)
    # stacked, one more axis than the model input: sample i = a[i]
    np.savez(tmp_path / "stacked.npz", image=images[:, None], ids=ids[:, None])
    got = list(validated(NpzReader(tmp_path / "stacked.npz"), model))
    assert len(got) == 5 and np.array_equal(got[3]["image"], images[3:4]) and got[3]["ids"].shape == (1, 4)
    # stacked along the model's batch axis: sample i = a[i:i+1]
    np.savez(tmp_path / "batch.npz", image=images, ids=ids)
    got = list(validated(NpzReader(tmp_path / "batch.npz"), model))
    assert len(got) == 5 and np.array_equal(got[4]["image"], images[4:5])
    # one sample per file, widths differ (TPU-MLIR --dataset)
    d = tmp_path / "samples"
    d.mkdir()
    for i, w in enumerate([8, 11, 6]):
        np.savez(d / f"{i}.npz", image=np.ones((1, 3, 4, w), np.float32), ids=ids[i : i + 1])
    got = list(validated(NpzReader(d), model))
    assert [f["image"].shape[3] for f in got] == [8, 11, 6]
    with pytest.raises(CalibrationError, match="does not exist"):
        NpzReader(tmp_path / "nope.npz")


def test_npy_reader_single_input(tmp_path) -> None:
    m = parse(
        '<ir_version: 8, opset_import: ["" : 13]>\ng (float[1, 2] x) => (float[1, 2] y) { y = Relu(x) }'
    )
    np.save(tmp_path / "x.npy", np.arange(12, dtype=np.float32).reshape(6, 2))
    r = NpzReader(tmp_path / "x.npy", limit=4)
    got = list(validated(r, m))
    assert len(got) == 4 and np.array_equal(got[1]["x"], [[2.0, 3.0]])


def test_npy_for_a_multi_input_model_is_refused(tmp_path, model) -> None:
    np.save(tmp_path / "x.npy", np.ones((2, 1, 3, 4, 8), np.float32))
    with pytest.raises(CalibrationError, match="an .npy file holds one input but the model has 2"):
        list(validated(NpzReader(tmp_path / "x.npy"), model))
