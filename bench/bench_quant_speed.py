"""Speed of zonnx's quantized ResNet-18 (QDQ int8 per-channel) in plain ORT against the float model, and
against ORT's own quantizer's output of the same model (same arguments, same calibration data).

The three sessions are timed in the same rounds (zonnx, float, ORT-quantized, zonnx, ...), so both ratios
share one zonnx figure and follow from the printed numbers."""

from __future__ import annotations

__all__ = ["bench_quant_speed"]

import tempfile
from pathlib import Path

import onnxruntime as ort
from onnxruntime.quantization import QuantFormat, QuantType
from onnxruntime.quantization import quantize_static as ort_quantize_static

import zonnx
from bench.bench_zoo_ort import session
from bench.runner import HIGHER, BenchContext, Measurement
from zonnx import zoo
from zonnx.quantization.calibration.readers import ListReader


def bench_quant_speed(ctx: BenchContext) -> list[Measurement]:
    """Images/s of the int8 ResNet-18 vs float (target 2.5x) and vs ORT's quantized model (target ~1x)."""
    n = 4 if ctx.quick else 16
    n_calib = 8 if ctx.quick else 32
    ctx.describe(
        ["resnet18-random"],
        {"timed images per sweep (batch 1)": n, "calibration": n_calib},
        {"timed images": 0, "calibration": 1},
        "per-channel u8s8 QDQ, ORT_ENABLE_ALL",
    )
    src = zoo.get("resnet18-random")
    feeds = zoo.sample_inputs("resnet18-random", n)
    calib = zoo.sample_inputs("resnet18-random", n_calib, seed=1)
    args = dict(per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    with tempfile.TemporaryDirectory(prefix="zonnx-bench-") as d:
        tmp = Path(d)
        zonnx.quantize_static(src, tmp / "zonnx.onnx", ListReader(calib), **args)
        prepped = tmp / "prepped.onnx"
        zonnx.save_model(zonnx.optimize(src, opset=13), prepped)
        ort_quantize_static(str(prepped), str(tmp / "ort.onnx"), ListReader(calib), QuantFormat.QDQ, **args)
        level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sessions = {
            k: session(p, level)
            for k, p in [("float", prepped), ("zonnx", tmp / "zonnx.onnx"), ("ort", tmp / "ort.onnx")]
        }

    def sweep(name: str):
        return lambda: [sessions[name].run(None, f) for f in feeds]

    t = ctx.time_interleaved({k: sweep(k) for k in ("zonnx", "float", "ort")})
    t_zonnx, t_float, t_ort = t["zonnx"], t["float"], t["ort"]
    return [
        Measurement(
            "resnet18-random int8 QDQ (zonnx) vs float",
            n / t_zonnx.median,
            "img/s",
            HIGHER,
            peer="ORT float",
            peer_value=n / t_float.median,
            target=2.5,
        ),
        Measurement(
            "resnet18-random int8 QDQ (zonnx) vs ORT's quantizer",
            n / t_zonnx.median,
            "img/s",
            HIGHER,
            peer="ORT-quantized",
            peer_value=n / t_ort.median,
            target=0.95,
        ),
    ]
