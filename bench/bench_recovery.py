"""Accuracy recovery on the zoo MobileNetV2 under dpu-b4096 power-of-two per-tensor quantization.

Steps, each on top of the previous one (FixNeuron, ``PowerOfTwoMethod.MinMSE``, Target dpu-b4096):
plain; ReplaceClip6Relu (ReLU6 -> ReLU, which CLE needs; it changes the float model); + cross-layer
equalization (``CLE_STEPS`` steps); + sequential bias correction; + AdaRound fast finetune (run before
bias correction inside ``quantize_static``). Calibration and held-out images are disjoint.

Figures per step: the SQNR of the logits against the original float model and against the float model
the step quantizes (after ReLU6 -> ReLU and CLE, which is exact), and the mean SQNR of the Conv/Gemm
outputs against that float model. No peer: the rows compare with each other. Note: this random-weight
network is chaotic (input noise at 60 dB SQNR leaves about 17 dB at the logits), so the logits' SQNR
saturates near 10 dB and the layer mean is the figure that moves.
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
from zonnx.quantization.recovery.relu6 import replace_clip6_relu

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


def _prepared(relu6: bool, cle: bool) -> onnx.ModelProto:
    work = to_ir(zonnx.optimize(zoo.get("mobilenetv2-random")))
    if relu6:
        replace_clip6_relu(work)
    if cle:
        equalize(work, steps=CLE_STEPS)
    return to_proto(work)


# name, ReplaceClip6Relu, CLE, extra_options
#: AdaRound settings of the last step (Vitis's defaults but 200 steps per layer, to stay in minutes).
_FAST_FINETUNE = {"OptimAlgorithm": "adaround", "NumIterations": 200, "FixedSeed": 0}
#: The dpu-b4096 recipe turns bias correction on; the first steps turn it off to show each step alone.
_STEPS: list[tuple[str, bool, bool, dict]] = [
    ("plain MinMSE", False, False, {"BiasCorrection": False}),
    ("ReLU6 -> ReLU", True, False, {"BiasCorrection": False}),
    ("+ CLE", True, True, {"BiasCorrection": False}),
    ("+ bias correction", True, True, {"BiasCorrection": True}),
    (
        "+ AdaRound",
        True,
        True,
        {"BiasCorrection": True, "IncludeFastFT": True, "FastFinetune": _FAST_FINETUNE},
    ),
]


def bench_recovery(ctx: BenchContext) -> list[Measurement]:
    n = 4 if ctx.quick else 8
    ctx.describe(
        ["mobilenetv2-random"], {"calibration": n, "held out": n}, {"images": 0}, "SQNR, not accuracy"
    )
    feeds = zoo.sample_inputs("mobilenetv2-random", 2 * n)
    calib, held = feeds[:n], feeds[n:]
    original = onnx.load(str(zoo.get("mobilenetv2-random")))
    out: list[Measurement] = []
    prepared: dict[tuple[bool, bool], onnx.ModelProto] = {}
    quantize: Callable[..., object] = zonnx.quantize_static
    for name, relu6, cle, extra in _STEPS:
        reference = prepared.setdefault((relu6, cle), _prepared(relu6, cle))
        kwargs = target_quantize_kwargs("dpu-b4096")
        kwargs["extra_options"].update(extra)
        result = quantize(reference, None, ListReader(calib), **kwargs)
        logits, own, layers = _figures(original, reference, result.model, held)
        notes = "; ".join(r.summary() for r in result.recovery.values() if hasattr(r, "summary"))
        out += [
            Measurement(f"{name}: logits SQNR vs original float", logits, "dB", HIGHER),
            Measurement(f"{name}: logits SQNR vs its float", own, "dB", HIGHER),
            Measurement(f"{name}: mean Conv/Gemm output SQNR", layers, "dB", HIGHER, note=notes[:160]),
        ]
    return out
