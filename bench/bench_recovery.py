"""Accuracy recovery on the trained digits CNN under dpu-b4096 power-of-two per-tensor quantization.

Model: zoo ``digits_cnn`` (trained here on scikit-learn's 8x8 digits; Conv-BN-ReLU pairs, a residual
Add, a Concat). Steps, each on top of the previous one (FixNeuron, ``PowerOfTwoMethod.MinMSE``, Target
dpu-b4096): plain; + cross-layer equalization (``CLE_STEPS`` steps; exact in float); + sequential bias
correction; + AdaRound fast finetune (run before bias correction inside ``quantize_static``).
Calibration images are the digits ``calib`` split (training images); the figures use the held-out
``test`` split.

Figures per step: top-1 on the 450 test images (peer: the float model's), the SQNR of the logits against
the original float model and against the float model the step quantizes (after CLE), and the mean SQNR
of the Conv/Gemm outputs against that float model.
"""

from __future__ import annotations

__all__ = ["bench_recovery"]

import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

import zonnx
from bench.runner import HIGHER, BenchContext, Measurement
from zonnx import zoo
from zonnx.build_npu import target_quantize_kwargs
from zonnx.ir.io import to_ir, to_proto
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.recovery.cle import equalize
from zonnx.zoo.digits import digits_data, evaluate_top1

logger = logging.getLogger(__name__)

CLE_STEPS = 4


def _run(model: onnx.ModelProto, names: list[str], feeds: Sequence[Mapping[str, np.ndarray]]) -> list[list]:
    proto = onnx.ModelProto.FromString(model.SerializeToString())
    have = {o.name for o in proto.graph.output}
    proto.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return [sess.run(names, dict(f)) for f in feeds]


def _sqnr(ref: list[np.ndarray], test: list[np.ndarray]) -> float:
    signal = sum(float(np.square(a.astype(np.float64)).sum()) for a in ref)
    noise = sum(float(np.square(a.astype(np.float64) - b).sum()) for a, b in zip(ref, test, strict=True))
    return 10 * np.log10(signal / noise)


def _figures(
    original: onnx.ModelProto, reference: onnx.ModelProto, quant: onnx.ModelProto, held: list
) -> tuple[float, float, float]:
    out = original.graph.output[0].name
    float_out = {n.name: n.output[0] for n in reference.graph.node}
    nodes = [n for n in quant.graph.node if n.op_type in ("Conv", "Gemm") and n.name in float_out]
    q = _run(quant, [out] + [n.output[0] for n in nodes], held)
    f = _run(reference, [out] + [float_out[n.name] for n in nodes], held)
    o = _run(original, [out], held)
    logits = _sqnr([x[0] for x in o], [x[0] for x in q])
    own = _sqnr([x[0] for x in f], [x[0] for x in q])
    layers = float(np.mean([_sqnr([x[i] for x in f], [x[i] for x in q]) for i in range(1, len(nodes) + 1)]))
    return logits, own, layers


MODEL = "digits_cnn"


def _prepared(cle: bool) -> onnx.ModelProto:
    work = to_ir(zonnx.optimize(zoo.get(MODEL)))
    if cle:
        equalize(work, steps=CLE_STEPS)
    return to_proto(work)


# name, CLE, extra_options
#: AdaRound settings of the last step (Vitis's defaults but 200 steps per layer, to stay in minutes).
_FAST_FINETUNE = {"OptimAlgorithm": "adaround", "NumIterations": 200, "FixedSeed": 0}
#: The dpu-b4096 recipe turns bias correction on; the first steps turn it off to show each step alone.
_STEPS: list[tuple[str, bool, dict]] = [
    ("plain MinMSE", False, {"BiasCorrection": False}),
    ("+ CLE", True, {"BiasCorrection": False}),
    ("+ bias correction", True, {"BiasCorrection": True}),
    (
        "+ AdaRound",
        True,
        {"BiasCorrection": True, "IncludeFastFT": True, "FastFinetune": _FAST_FINETUNE},
    ),
]


def bench_recovery(ctx: BenchContext) -> list[Measurement]:
    n_calib, n_held = (16, 64) if ctx.quick else (64, 450)
    ctx.describe(
        [MODEL],
        {"calibration (train split)": n_calib, "held out (test split)": n_held},
        {"digits split": 0},
        "top-1 and SQNR of a trained network on held-out images",
    )
    x_cal, _ = digits_data("calib")
    x_te, y_te = digits_data("test")
    calib = [{"input": x_cal[i : i + 1]} for i in range(n_calib)]
    held = [{"input": x_te[i : i + 64]} for i in range(0, n_held, 64)]
    x_te, y_te = x_te[:n_held], y_te[:n_held]
    original = onnx.load(str(zoo.get(MODEL)))
    float_top1 = evaluate_top1(original, x_te, y_te)
    out: list[Measurement] = []
    prepared: dict[bool, onnx.ModelProto] = {}
    quantize: Callable[..., object] = zonnx.quantize_static
    for name, cle, extra in _STEPS:
        reference = prepared.setdefault(cle, _prepared(cle))
        kwargs = target_quantize_kwargs("dpu-b4096")
        kwargs["extra_options"].update(extra)
        result = quantize(reference, None, ListReader(calib), **kwargs)
        logits, own, layers = _figures(original, reference, result.model, held)
        notes = "; ".join(r.summary() for r in result.recovery.values() if hasattr(r, "summary"))
        top1 = evaluate_top1(result.model, x_te, y_te)
        out += [
            Measurement(f"{name}: top-1", top1, "acc", HIGHER, "float", float_top1, note=notes[:160]),
            Measurement(f"{name}: logits SQNR vs original float", logits, "dB", HIGHER),
            Measurement(f"{name}: logits SQNR vs its float", own, "dB", HIGHER),
            Measurement(f"{name}: mean Conv/Gemm output SQNR", layers, "dB", HIGHER),
        ]
    return out
