"""The whole ``quantize_static`` call on ResNet-18 as a multiple of one float inference sweep, with ORT's
call on the same model and data timed in the same rounds (issue 11, item 18).

Model: the zoo ResNet-18 (1x3x224x224) after ``zonnx.optimize`` (BatchNormalization folded), which
both quantizers take. Calibration: 32 images, QDQ int8, default options otherwise: zonnx's call
includes everything it does by default (prep passes, calibration, writing, the per-layer report and
saving). The float sweep is one run per calibration image in an ORT session created once.
Rounds alternate (float sweep, zonnx call, ORT call) per method; each call is slow, so this bench uses
3 rounds after 1 warm-up whatever ``--repeat`` says, and reports medians.

Targets (issue 11): the zonnx call at most 1.5x a float sweep with MinMax, 2x with a histogram method.

Run ``python -m bench.runner quantize_call [--markdown]``.
"""

from __future__ import annotations

__all__ = ["bench_quantize_call"]

import contextlib
import io
import logging
import tempfile
from pathlib import Path

import onnxruntime as ort
from onnxruntime.quantization import CalibrationMethod
from onnxruntime.quantization import quantize_static as ort_quantize_static

import zonnx
from bench.runner import LOWER, BenchContext, Measurement, time_interleaved
from zonnx import zoo
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.options import ExtraOptions

#: method -> the issue's target (call time / float sweep time)
TARGETS = {"MinMax": 1.5, "Percentile": 2.0}
ROUNDS, WARMUP = 3, 1


def bench_quantize_call(ctx: BenchContext) -> list[Measurement]:
    """Call time / float sweep time for zonnx and ORT, MinMax and Percentile."""
    n_calib = 8 if ctx.quick else 32
    ctx.describe(
        ["resnet18-random"],
        {
            "calibration images": n_calib,
            "zonnx report samples": ExtraOptions().report_samples,
            "zonnx CalibBatch": ExtraOptions().calib_batch,
        },
        {"calibration": 1},
        f"QDQ int8, {ROUNDS} rounds after {WARMUP} warm-up, medians",
    )
    calib = zoo.sample_inputs("resnet18-random", n_calib, seed=1)
    out: list[Measurement] = []
    with tempfile.TemporaryDirectory(prefix="zonnx-bench-") as d:
        tmp = Path(d)
        src = tmp / "resnet18.onnx"
        zonnx.save_model(zonnx.optimize(zoo.get("resnet18-random"), opset=13), src)
        sess = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])

        def sweep() -> None:
            for feed in calib:
                sess.run(None, feed)

        for method in TARGETS:
            cm = getattr(CalibrationMethod, method)

            def ours(cm: CalibrationMethod = cm) -> None:
                zonnx.quantize_static(src, tmp / "zonnx.onnx", ListReader(calib), calibrate_method=cm)

            def theirs(cm: CalibrationMethod = cm) -> None:
                with contextlib.redirect_stdout(io.StringIO()):  # ORT's calibrators print progress
                    ort_quantize_static(
                        str(src), str(tmp / "ort.onnx"), ListReader(calib), calibrate_method=cm
                    )

            level = logging.getLogger("zonnx").level
            logging.getLogger("zonnx").setLevel(logging.ERROR)
            try:
                t = time_interleaved({"float": sweep, "zonnx": ours, "ort": theirs}, ROUNDS, WARMUP)
            finally:
                logging.getLogger("zonnx").setLevel(level)
            f = t["float"].median
            out.append(
                Measurement(
                    f"resnet18-random quantize_static call / float sweep, {method} (zonnx vs ORT's call)",
                    t["zonnx"].median / f,
                    "x sweep",
                    LOWER,
                    peer="ORT's call",
                    peer_value=t["ort"].median / f,
                    note=f"target for zonnx alone: <= {TARGETS[method]}x; float sweep {f:.2f} s",
                )
            )
    return out
