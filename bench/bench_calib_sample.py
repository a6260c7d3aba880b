"""What sampled histograms cost in accuracy: PP-OCRv4 rec (pretrained, rapidocr wheel) quantized with
histogram calibration counting zonnx's default strided sample (``CalibHistogramSample`` 16384 values per
tensor and batch) against counting every value (``CalibHistogramSample=None``), same data, same call.

Per-channel u8s8 QDQ; Percentile 99.99 and MSE (both read the histogram); character accuracy on rendered
lines not used for calibration, with the quantize call's wall time. The peer is the full histogram.
"""

from __future__ import annotations

__all__ = ["bench_calib_sample"]

import tempfile
import time
from pathlib import Path

import onnxruntime as ort
from onnxruntime.quantization import CalibrationMethod, QuantType

import zonnx
from bench.runner import HIGHER, LOWER, BenchContext, Measurement
from zonnx import zoo
from zonnx.quantization.calibration.collector import DEFAULT_HIST_SAMPLE
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.enums import ZonnxCalibrationMethod
from zonnx.zoo.text_images import char_accuracy, ctc_greedy_decode, rec_samples

CALIB = 48
SEED = 11
METHODS = {
    "Percentile 99.99": (CalibrationMethod.Percentile, {"CalibPercentile": 99.99}),
    "MSE": (ZonnxCalibrationMethod.MSE, {}),
}


def _accuracy(path: Path, lines: list) -> float:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    preds = [p for _, feed in lines for p in ctc_greedy_decode(sess.run(None, feed)[0])]
    return char_accuracy(preds, [text for text, _ in lines])


def bench_calib_sample(ctx: BenchContext) -> list[Measurement]:
    """Char accuracy and quantize time, sampled histogram (ours) vs full histogram (peer), per method."""
    n_test = 40 if ctx.quick else 200
    methods = dict(list(METHODS.items())[:1]) if ctx.quick else METHODS
    ctx.describe(
        ["ppocr_rec"],
        {"calibration lines": CALIB, "test lines": n_test},
        {"lines": SEED},
        f"per-channel u8s8 QDQ; sampled = {DEFAULT_HIST_SAMPLE} values per tensor and batch",
    )
    src = zoo.get("ppocr_rec")
    samples = rec_samples(CALIB + n_test, seed=SEED)
    calib, test = [f for _, f in samples[:CALIB]], samples[CALIB:]
    float_acc = _accuracy(src, test)
    out = []
    with tempfile.TemporaryDirectory(prefix="zonnx-calib-sample-") as d:
        for label, (method, extra) in methods.items():
            acc, secs = {}, {}
            for setting, sample in (("sampled", DEFAULT_HIST_SAMPLE), ("full", None)):
                path = Path(d) / f"{setting}.onnx"
                start = time.perf_counter()
                zonnx.quantize_static(
                    src,
                    path,
                    ListReader(calib),
                    per_channel=True,
                    activation_type=QuantType.QUInt8,
                    calibrate_method=method,
                    extra_options={**extra, "CalibHistogramSample": sample},
                )
                secs[setting] = time.perf_counter() - start
                acc[setting] = _accuracy(path, test)
            note = f"float {float_acc:.4f} on the same {n_test} lines"
            out.append(
                Measurement(
                    f"PP-OCRv4 rec {label}: char accuracy, sampled vs full histogram",
                    acc["sampled"],
                    "acc",
                    HIGHER,
                    peer="full histogram",
                    peer_value=acc["full"],
                    note=note,
                )
            )
            out.append(
                Measurement(
                    f"PP-OCRv4 rec {label}: quantize time, sampled vs full histogram",
                    secs["sampled"],
                    "s",
                    LOWER,
                    peer="full histogram",
                    peer_value=secs["full"],
                )
            )
    return out
