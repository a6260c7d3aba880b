"""Accuracy of quantized models on real tasks: zonnx's quantizer against ORT's, same arguments, same data.

- digits CNN: test top-1 of float, zonnx int8 per-channel QDQ and power-of-two per-tensor FixNeuron,
  and ORT's quantizer with the same QDQ arguments (targets: drop <= 0.3 and <= 1 point).
- PP-OCRv4 recognition: character accuracy on rendered text lines (DejaVu fonts) of float, zonnx
  and ORT (target: zonnx ahead of ORT). ORT's quantizer cannot take the shipped model (opset 12,
  weights in Constant nodes), so it gets the same model after zonnx's preparation (opset 13, weights
  as initializers): the preparation a user would have to do by hand.
"""

from __future__ import annotations

__all__ = ["bench_quant_accuracy"]

import logging
import tempfile
from pathlib import Path

from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType
from onnxruntime.quantization import quantize_static as ort_quantize_static

import zonnx
from bench.runner import HIGHER, LOWER, BenchContext, Measurement
from zonnx import zoo
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.enums import PowerOfTwoMethod, VitisQuantFormat, ZonnxCalibrationMethod
from zonnx.verify import ort_session
from zonnx.zoo.digits import digits_data, evaluate_top1
from zonnx.zoo.text_images import char_accuracy, ctc_greedy_decode, rec_samples

logger = logging.getLogger(__name__)


def _rec_accuracy(path: Path, lines: list) -> float:
    sess = ort_session(path)  # exact on every CPU (no fused u8 x s8 kernels, which saturate without VNNI)
    preds = [p for _, feed in lines for p in ctc_greedy_decode(sess.run(None, feed)[0])]
    return char_accuracy(preds, [text for text, _ in lines])


def _digits(tmp: Path, quick: bool) -> list[Measurement]:
    src = zoo.get("digits_cnn")
    x, y = digits_data("test")
    calib_x, _ = digits_data("calib")
    calib = [{"input": calib_x[i : i + 1]} for i in range(32 if quick else 128)]
    float_acc = evaluate_top1(src, x, y)
    out = []
    qdq = dict(per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    zonnx.quantize_static(src, tmp / "d_zonnx.onnx", ListReader(calib), **qdq)
    prepped = tmp / "d_prepped.onnx"
    zonnx.save_model(zonnx.optimize(src, opset=13), prepped)
    ort_quantize_static(str(prepped), str(tmp / "d_ort.onnx"), ListReader(calib), QuantFormat.QDQ, **qdq)
    ours, peer = evaluate_top1(tmp / "d_zonnx.onnx", x, y), evaluate_top1(tmp / "d_ort.onnx", x, y)
    out.append(
        Measurement(
            "digits int8 per-channel: top-1 drop (points)",
            100 * (float_acc - ours),
            "pt",
            LOWER,
            target=0.3,
            note=f"float {float_acc:.4f}, zonnx {ours:.4f}, ORT {peer:.4f}",
        )
    )
    zonnx.quantize_static(
        src,
        tmp / "d_pof2.onnx",
        ListReader(calib),
        quant_format=VitisQuantFormat.FixNeuron,
        calibrate_method=PowerOfTwoMethod.MinMSE,
    )
    pof2 = evaluate_top1(tmp / "d_pof2.onnx", x, y)
    out.append(
        Measurement(
            "digits power-of-two per-tensor: top-1 drop (points)",
            100 * (float_acc - pof2),
            "pt",
            LOWER,
            target=1.0,
            note=f"float {float_acc:.4f}, FixNeuron MinMSE {pof2:.4f}",
        )
    )
    return out


def _rec(tmp: Path, quick: bool) -> list[Measurement]:
    """zonnx's best configuration against ORT's best, per-channel u8s8 throughout.

    ORT's Percentile/Entropy calibrators fail on lines of different widths ("inhomogeneous shape"),
    so ORT's Percentile gets the calibration lines of the most common width only; its MinMax gets all.
    """
    src = zoo.get("ppocr_rec")
    samples = rec_samples(48 + (40 if quick else 200), seed=11)
    calib = [feed for _, feed in samples[:48]]
    test = samples[48:]
    float_acc = _rec_accuracy(src, test)
    prepped = tmp / "rec_prepped.onnx"
    zonnx.save_model(
        zonnx.optimize(
            src, opset=13, passes=["opset-upgrade", "shape-inference", "constant-folding", "dead-code"]
        ),
        prepped,
    )
    base = dict(per_channel=True, activation_type=QuantType.QUInt8)
    widths = [f["x"].shape for f in calib]
    same_width = [f for f in calib if f["x"].shape == max(set(widths), key=widths.count)]
    ort_results = {}
    for label, method, data, extra in [
        ("MinMax", CalibrationMethod.MinMax, calib, {}),
        (
            f"Percentile 99.99 ({len(same_width)} same-width lines)",
            CalibrationMethod.Percentile,
            same_width,
            {"CalibPercentile": 99.99},
        ),
    ]:
        ort_quantize_static(
            str(prepped),
            str(tmp / "r_ort.onnx"),
            ListReader(data),
            QuantFormat.QDQ,
            calibrate_method=method,
            extra_options=extra,
            **base,
        )
        ort_results[label] = _rec_accuracy(tmp / "r_ort.onnx", test)
    zonnx_results = {}
    for label, method, extra in [
        ("MinMax", CalibrationMethod.MinMax, {}),
        ("Percentile 99.99", CalibrationMethod.Percentile, {"CalibPercentile": 99.99}),
        ("MSE", ZonnxCalibrationMethod.MSE, {}),
    ]:
        zonnx.quantize_static(
            src, tmp / "r_zonnx.onnx", ListReader(calib), calibrate_method=method, extra_options=extra, **base
        )
        zonnx_results[label] = _rec_accuracy(tmp / "r_zonnx.onnx", test)
    ort_best = max(ort_results, key=ort_results.get)
    ours_best = max(zonnx_results, key=zonnx_results.get)
    note = (
        f"float {float_acc:.4f}, {len(test)} lines; zonnx: "
        + ", ".join(f"{k} {v:.4f}" for k, v in zonnx_results.items())
        + "; ORT: "
        + ", ".join(f"{k} {v:.4f}" for k, v in ort_results.items())
    )
    return [
        Measurement(
            "PP-OCRv4 rec same arguments (MinMax per-channel u8s8): char accuracy",
            zonnx_results["MinMax"],
            "acc",
            HIGHER,
            peer="ORT quantizer",
            peer_value=ort_results["MinMax"],
        ),
        Measurement(
            f"PP-OCRv4 rec best: zonnx {ours_best} vs ORT {ort_best}",
            zonnx_results[ours_best],
            "acc",
            HIGHER,
            peer="ORT best",
            peer_value=ort_results[ort_best],
            target=1.0,
            note=note,
        ),
    ]


def bench_quant_accuracy(ctx: BenchContext) -> list[Measurement]:
    """Accuracy drop of zonnx's quantization on digits and PP-OCRv4 rec, with ORT's quantizer as peer."""
    ctx.describe(
        ["digits_cnn", "ppocr_rec"],
        {
            "digits calibration (calib split)": 32 if ctx.quick else 128,
            "digits test (test split)": len(digits_data("test")[1]),
            "rec calibration lines": 48,
            "rec test lines": 40 if ctx.quick else 200,
        },
        {"rec lines": 11},
        "digits: top-1 of a trained network; rec: character accuracy on rendered lines, per-channel u8s8",
    )
    with tempfile.TemporaryDirectory(prefix="zonnx-bench-") as d:
        tmp = Path(d)
        return _digits(tmp, ctx.quick) + _rec(tmp, ctx.quick)
