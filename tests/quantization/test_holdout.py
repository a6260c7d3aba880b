"""The per-layer report on held-out samples: the last ReportSamples feeds never reach calibration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import QuantType

import zonnx
from zonnx import zoo
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.holdout import HoldOutReader
from zonnx.zoo.digits import digits_data


def _feeds(n: int) -> list[dict[str, np.ndarray]]:
    x, _ = digits_data("calib")
    return [{"input": x[i : i + 1]} for i in range(n)]


def _drain(reader: HoldOutReader) -> list[float]:
    return [float(f["input"].sum()) for f in iter(reader.get_next, None)]


def test_last_n_held_out_when_enough_samples() -> None:
    feeds = _feeds(40)
    reader = HoldOutReader(ListReader(feeds), 4)
    assert _drain(reader) == [float(f["input"].sum()) for f in feeds[:36]]
    assert [float(f["input"].sum()) for f in reader.held] == [float(f["input"].sum()) for f in feeds[36:]]
    assert reader.describe(4) == "held out: the last 4 of 40 samples, not used for calibration"


def test_too_few_samples_all_calibrate_and_report_says_in_sample() -> None:
    feeds = _feeds(20)
    reader = HoldOutReader(ListReader(feeds), 4)
    assert len(_drain(reader)) == 20 and reader.held == []
    assert reader.describe(4) == (
        "in-sample: 4 of the 20 calibration samples (holding 4 out needs at least 32 samples)"
    )


def _scales(path: Path) -> dict[str, np.ndarray]:
    return {
        t.name: onnx.numpy_helper.to_array(t)
        for t in onnx.load(path).graph.initializer
        if t.name.endswith("_scale")
    }


def test_quantize_static_reports_on_held_out_samples(tmp_path: Path) -> None:
    # the last 4 samples are 3x brighter: calibrating on them would widen the input range
    src, feeds = zoo.get("digits_cnn"), _feeds(36) + [{"input": 3 * f["input"]} for f in _feeds(4)]
    args = dict(activation_type=QuantType.QUInt8, per_channel=True)
    held = zonnx.quantize_static(
        src, tmp_path / "held.onnx", ListReader(feeds), extra_options={"ReportHoldOut": True}, **args
    )
    zonnx.quantize_static(src, tmp_path / "first36.onnx", ListReader(feeds[:36]), **args)
    all40 = zonnx.quantize_static(src, tmp_path / "all40.onnx", ListReader(feeds), **args)
    # calibration saw exactly the first 36 samples: the same scales as calibrating on those alone
    ours, ref, every = (
        _scales(tmp_path / "held.onnx"),
        _scales(tmp_path / "first36.onnx"),
        _scales(tmp_path / "all40.onnx"),
    )
    assert ours.keys() == ref.keys() and all(np.array_equal(ours[k], ref[k]) for k in ours)
    assert not np.array_equal(ours["input_scale"], every["input_scale"])
    assert held.report.samples == 4 and held.report.data.startswith("held out: the last 4 of 40")
    assert all40.report.data == "in-sample: 4 of the 40 calibration samples (ReportHoldOut off)"
    assert '"data": "held out' in (tmp_path / "held.onnx.report.json").read_text()
