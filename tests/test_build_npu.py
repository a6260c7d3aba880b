"""The targets' quantization recipes (``target_quantize_kwargs``) on the real PP-OCRv4 recognizer.

Character accuracy of the fake-quantized model run by ORT (default optimizations, exact integer form) on
24 held-out rendered lines (float: 1.0).
Measured when the recipes changed: dpu-b4096 (6 calibration lines, the first 6 also drive bias correction,
whose 40 sequential runs dominate the time) 0.0 without bias correction, 0.975 with it; bm1684x (16
calibration lines) 0.949 with min/max thresholds, 0.994 with MSE ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import zonnx
from zonnx import zoo
from zonnx.build_npu import target_quantize_kwargs
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.enums import PowerOfTwoMethod, ZonnxCalibrationMethod
from zonnx.verify import ort_session
from zonnx.zoo.text_images import char_accuracy, ctc_greedy_decode, rec_samples


@pytest.fixture(scope="module")
def lines() -> tuple[list[dict], list[tuple[str, dict]]]:
    samples = rec_samples(16 + 24, seed=11)
    return [f for _, f in samples[:16]], samples[16:]


def _accuracy(path: Path, held_out: list[tuple[str, dict]]) -> float:
    # ORT's default optimizations fuse the QDQ groups into u8 x s8 kernels, which saturate on x86 without
    # VNNI (zonnx.hostcpu; bm1684x on an AVX2 host: 0.969, exact 0.991); ort_session runs the exact integer form
    session = ort_session(path, optimize=True)
    predicted = [p for _, feeds in held_out for p in ctc_greedy_decode(session.run(None, feeds)[0])]
    return char_accuracy(predicted, [t for t, _ in held_out])


def test_recipes_per_target() -> None:
    dpu, bm, zy = (target_quantize_kwargs(t) for t in ("dpu-b4096", "bm1684x", "zhouyi-x2"))
    assert dpu["calibrate_method"] is PowerOfTwoMethod.MinMSE and dpu["extra_options"]["BiasCorrection"]
    assert bm["calibrate_method"] is ZonnxCalibrationMethod.MSE  # symmetric grid: clipped thresholds
    assert "calibrate_method" not in zy  # asymmetric grid: ORT's default, min/max


def test_dpu_recipe_keeps_ppocr_rec_readable(tmp_path: Path, lines) -> None:
    """Per-tensor power-of-two weights and 8-bit biases shift channel means; bias correction removes it."""
    calib, held_out = lines
    out = tmp_path / "dpu.onnx"
    kwargs = target_quantize_kwargs("dpu-b4096")
    kwargs["extra_options"]["ReportSamples"] = 0
    zonnx.quantize_static(zoo.get("ppocr_rec"), out, ListReader(calib[:6]), **kwargs)
    assert _accuracy(out, held_out) >= 0.95


def test_bm1684x_recipe_keeps_ppocr_rec_readable(tmp_path: Path, lines) -> None:
    """A symmetric int8 grid spans the largest |x| seen; MSE thresholds clip the rare outliers."""
    calib, held_out = lines
    out = tmp_path / "bm.onnx"
    zonnx.quantize_static(zoo.get("ppocr_rec"), out, ListReader(calib), **target_quantize_kwargs("bm1684x"))
    assert _accuracy(out, held_out) >= 0.985
