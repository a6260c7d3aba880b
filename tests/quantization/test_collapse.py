"""No silent collapse: a quantized model whose outputs fall apart says so, naming where and what to try."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import zonnx
from tests.helpers import run_cli
from zonnx import zoo
from zonnx.errors import OptionError
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.sample_keeper import SampleKeeper
from zonnx.zoo.text_images import rec_inputs


@pytest.fixture(scope="module")
def rec_calib() -> list[dict[str, np.ndarray]]:
    return rec_inputs(6, seed=5)


def test_a_collapsed_ppocr_rec_warns_with_the_first_divergent_layers(rec_calib, caplog) -> None:
    src = zoo.get("ppocr_rec")
    with caplog.at_level(logging.WARNING):
        result = zonnx.quantize_static(src, None, ListReader(rec_calib))  # ORT's defaults: int8 per tensor
    assert result.report is not None and result.report.outputs[0].cosine < 0.99
    assert len(result.warnings) == 1
    warning = result.warnings[0]
    assert "below 0.99" in warning and "similarity first falls at" in warning
    assert "QuantPlacement='kernels'" in warning and "zonnx compare" in warning
    assert warning in caplog.text


def test_kernels_placement_on_the_same_model_keeps_it_quiet(rec_calib) -> None:
    src = zoo.get("ppocr_rec")
    result = zonnx.quantize_static(
        src, None, ListReader(rec_calib), per_channel=True, extra_options={"QuantPlacement": "kernels"}
    )
    assert result.report.outputs[0].cosine >= 0.99
    assert result.warnings == []


def test_report_samples_are_spread_over_the_calibration_set() -> None:
    src = zoo.get("digits_cnn")
    feeds = zoo.sample_inputs("digits_cnn", 40, seed=0)
    result = zonnx.quantize_static(src, None, ListReader(feeds), extra_options={"ReportSamples": 6})
    assert result.report.samples == 6
    none = zonnx.quantize_static(src, None, ListReader(feeds), extra_options={"ReportSamples": 0})
    assert none.report is None and none.warnings == []


def test_the_report_keeps_feeds_from_the_whole_set() -> None:
    feeds = [{"x": np.full((1,), i, np.float32)} for i in range(200)]
    keeper = SampleKeeper(ListReader(feeds), 8)
    while keeper.get_next() is not None:
        pass
    kept = sorted(int(f["x"][0]) for f in keeper.kept)
    assert len(kept) == 8 and kept[-1] >= 100, kept


@pytest.mark.parametrize(
    ("key", "value"), [("ReportSamples", -1), ("ReportSamples", 10_000), ("WarnBelowCosine", 2)]
)
def test_bad_report_options_are_refused(key: str, value: float) -> None:
    with pytest.raises(OptionError, match=key):
        zonnx.quantize_static(zoo.get("digits_cnn"), None, ListReader([]), extra_options={key: value})


def test_the_cli_quantizes_kernels_per_channel_by_default(tmp_path) -> None:
    feeds = zoo.sample_inputs("digits_cnn", 8, seed=0)
    np.savez(tmp_path / "calib.npz", **{"input": np.concatenate([f["input"] for f in feeds])})
    proc = run_cli(
        "quantize",
        str(zoo.get("digits_cnn")),
        str(tmp_path / "q.onnx"),
        "--calib",
        str(tmp_path / "calib.npz"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "kernels" in proc.stdout and "per channel" in proc.stdout
    proc = run_cli(
        "quantize",
        str(zoo.get("digits_cnn")),
        str(tmp_path / "q2.onnx"),
        "--calib",
        str(tmp_path / "calib.npz"),
        "--placement",
        "ort",
        "--per-tensor",
    )
    assert proc.returncode == 0, proc.stderr
    assert "ort" in proc.stdout and "per channel" not in proc.stdout
