"""Accuracy recovery under dpu-b4096 power-of-two per-tensor quantization, step by step.

Models: zoo ``digits_cnn`` (trained here on scikit-learn's 8x8 digits; Conv-BN-ReLU pairs, a residual
Add, a Concat) and zoo ``mobilenetv2_digits`` (the issue's MobileNetV2, width 1.0, trained here on the same
digits upscaled to 32x32). Steps, each on top of the previous one (FixNeuron, ``PowerOfTwoMethod.MinMSE``, Target dpu-b4096):
plain; + cross-layer equalization (``CLE_STEPS`` steps; exact in float); + sequential bias correction;
+ AdaRound fast finetune (run before bias correction inside ``quantize_static``; steps per layer
bounded). Both models: calibration images are the ``calib`` split (training images), figures use the
held-out ``test`` split.

Figures per step: top-1 on the 450 digits test images (peer: the float model's), the SQNR of the logits
against the original float model and against the float model the step quantizes (after CLE), and the mean
SQNR of the Conv/Gemm outputs against that float model. MobileNetV2 adds a side row that is not a step:
ReLU6 replaced by ReLU (``ReplaceClip6Relu``) and then CLE, which equalizes through the former ReLU6s
(``cle.py`` refuses Clip(0, 6): scaling through a finite bound changes the function) but changes the
float model; "vs original float" shows that cost.
"""

from __future__ import annotations

__all__ = ["bench_recovery"]

import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx

import zonnx
from bench.runner import HIGHER, BenchContext, Measurement
from zonnx import zoo
from zonnx.build_npu import target_quantize_kwargs
from zonnx.ir.io import to_ir, to_proto
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.recovery.cle import equalize
from zonnx.quantization.recovery.relu6 import replace_clip6_relu
from zonnx.verify import ort_session
from zonnx.zoo.digits import digits_data, evaluate_top1
from zonnx.zoo.mobilenet_digits import mobilenet_digits_data

logger = logging.getLogger(__name__)

CLE_STEPS = 4
#: AdaRound steps per layer (Vitis's default is 1000): digits_cnn, and the 53 layers of MobileNetV2.
DIGITS_ITERATIONS = 200
MOBILENET_ITERATIONS = 200


def _run(model: onnx.ModelProto, names: list[str], feeds: Sequence[Mapping[str, np.ndarray]]) -> list[list]:
    proto = onnx.ModelProto.FromString(model.SerializeToString())
    have = {o.name for o in proto.graph.output}
    proto.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    sess = ort_session(proto)  # exact on every CPU (no fused u8 x s8 kernels, which saturate without VNNI)
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


DIGITS = "digits_cnn"
MOBILENET = "mobilenetv2_digits"


def _prepared(model: str, cle: bool | str) -> onnx.ModelProto:
    """The optimized (BatchNorm folded) float model, equalized when ``cle``; ``cle="relu"`` first replaces
    ReLU6 by ReLU (``ReplaceClip6Relu``, which changes the float model) so CLE can pass through it."""
    work = to_ir(zonnx.optimize(zoo.get(model)))
    if cle == "relu":
        replace_clip6_relu(work)
    if cle:
        equalize(work, steps=CLE_STEPS, power_of_two=True)  # dpu-b4096's weight grids
    return to_proto(work)


def _steps(iterations: int) -> list[tuple[str, bool | str, dict]]:
    """(name, CLE, extra_options) of each step; AdaRound's steps per layer bounded to stay in minutes."""
    fast_finetune = {"OptimAlgorithm": "adaround", "NumIterations": iterations, "FixedSeed": 0}
    # the dpu-b4096 recipe turns bias correction and CLE on; the steps set both, to show each step alone
    # (CLE is applied here to the float reference, so the quantizer's own stays off)
    own = {"IncludeCLE": False}
    return [
        ("plain MinMSE", False, {**own, "BiasCorrection": False}),
        ("+ CLE", True, {**own, "BiasCorrection": False}),
        ("+ bias correction", True, {**own, "BiasCorrection": True}),
        (
            "+ AdaRound",
            True,
            {**own, "BiasCorrection": True, "IncludeFastFT": True, "FastFinetune": fast_finetune},
        ),
    ]


def _model_steps(
    model: str,
    calib: list,
    held: list,
    iterations: int,
    top1: Callable[[onnx.ModelProto], float] | None,
    side: Sequence[tuple[str, bool | str, dict]] = (),
) -> list[Measurement]:
    original = onnx.load(str(zoo.get(model)))
    float_top1 = top1(original) if top1 is not None else None
    out: list[Measurement] = []
    prepared: dict[bool | str, onnx.ModelProto] = {}
    tag = "" if model == DIGITS else f"{model} "
    for name, cle, extra in [*_steps(iterations), *side]:
        reference = prepared.setdefault(cle, _prepared(model, cle))
        kwargs = target_quantize_kwargs("dpu-b4096")
        kwargs["extra_options"].update(extra)
        if "FastFinetune" in extra:
            kwargs["extra_options"]["FastFinetune"] = dict(extra["FastFinetune"], DataSize=len(calib))
        result = zonnx.quantize_static(reference, None, ListReader(calib), **kwargs)
        logits, own, layers = _figures(original, reference, result.model, held)
        notes = "; ".join(r.summary() for r in result.recovery.values() if hasattr(r, "summary"))
        if top1 is not None:
            out.append(
                Measurement(
                    f"{tag}{name}: top-1",
                    top1(result.model),
                    "acc",
                    HIGHER,
                    "float",
                    float_top1,
                    note=notes[:160],
                )
            )
        out += [
            Measurement(
                f"{tag}{name}: logits SQNR vs original float", logits, "dB", HIGHER, note=notes[:160]
            ),
            Measurement(f"{tag}{name}: logits SQNR vs its float", own, "dB", HIGHER),
            Measurement(f"{tag}{name}: mean Conv/Gemm output SQNR", layers, "dB", HIGHER),
        ]
    return out


def _split(data: tuple[np.ndarray, np.ndarray], n_calib: int, n_held: int) -> tuple[list, list, Callable]:
    """(calibration feeds of one image from ``data``'s calib split, held-out test batches of 64, top-1 on them)."""
    (x_cal, _), (x_te, y_te) = data
    x_te, y_te = x_te[:n_held], y_te[:n_held]
    calib = [{"input": x_cal[i : i + 1]} for i in range(n_calib)]
    held = [{"input": x_te[i : i + 64]} for i in range(0, n_held, 64)]
    return calib, held, lambda m: evaluate_top1(m, x_te, y_te)


def bench_recovery(ctx: BenchContext) -> list[Measurement]:
    n_calib, n_held = (16, 64) if ctx.quick else (64, 450)
    iterations = 20 if ctx.quick else MOBILENET_ITERATIONS
    ctx.describe(  # one setup line: the header prints the last one only
        [DIGITS, MOBILENET],
        {"calibration (train split)": n_calib, "held out (test split)": n_held},
        {"digits split": 0},
        f"top-1 and SQNR of trained networks on held-out images; AdaRound {DIGITS_ITERATIONS} steps per layer "
        f"(digits_cnn), {iterations} (mobilenetv2_digits)",
    )
    calib, held, top1 = _split((digits_data("calib"), digits_data("test")), n_calib, n_held)
    out = _model_steps(DIGITS, calib, held, DIGITS_ITERATIONS, top1)
    m_data = (mobilenet_digits_data("calib"), mobilenet_digits_data("test"))
    m_calib, m_held, m_top1 = _split(m_data, n_calib, n_held)
    # not a step: what CLE through ReLU6 would give if ReLU6 became ReLU (vai_q_onnx's ReplaceClip6Relu)
    side = [("side: ReplaceClip6Relu + CLE", "relu", {"IncludeCLE": False, "BiasCorrection": False})]
    return out + _model_steps(MOBILENET, m_calib, m_held, iterations, m_top1, side)
