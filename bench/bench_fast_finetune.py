"""Fast finetune for the DPU, AdaRound and AdaQuant: held-out output SQNR on a trained model, wall time on
ResNet-18.

Accuracy: the zoo ``yolo_det`` (trained here; Conv-BN-SiLU backbone, decoupled box / score head),
quantized for ``dpu-b4096`` (power-of-two per-tensor FixNeuron, MinMSE, refined for the target) with the
keyword arguments of ``zonnx.build_npu.target_quantize_kwargs``. The peer is the same quantization
without fast finetune, measured in the same run: its held-out SQNR (detections against the float
model's, ``CALIB`` calibration images and ``HELD_OUT`` other images) is the figure fast finetune must
beat (ratio >= 1).

Speed: the issue's time target is on ResNet-18, so the wall time is fast finetune's own
(``FastFinetuneResult.seconds``: captures and tuning of all 21 layers) on the zoo ``resnet18-random``
(seeded random weights: used for its size only, no accuracy figure from it) against 5 minutes, with
torch and ORT on one thread (``Threads`` 1).

Run ``python -m bench.bench_fast_finetune [--quick]`` or ``python -m bench.runner fast_finetune``.
"""

from __future__ import annotations

__all__ = ["bench_fast_finetune", "held_out_sqnr", "main"]

import argparse
import logging
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import zonnx
from bench.runner import HIGHER, LOWER, BenchContext, Measurement
from zonnx import zoo
from zonnx.build_npu import target_quantize_kwargs
from zonnx.quantization.calibration.readers import ListReader

logger = logging.getLogger(__name__)

TARGET = "dpu-b4096"
ACCURACY_MODEL, SPEED_MODEL = "yolo_det", "resnet18-random"
CALIB, HELD_OUT = 32, 16
#: FastFinetune settings per algorithm (Vitis defaults otherwise); the quick run uses ``QUICK_ITERATIONS``.
SETTINGS: dict[str, dict[str, Any]] = {
    "adaround": {"OptimAlgorithm": "adaround", "NumIterations": 200},
    "adaquant": {"OptimAlgorithm": "adaquant", "NumIterations": 200},
}
QUICK_ITERATIONS, QUICK_CALIB = 10, 8
#: Wall-time target of one fast finetune run, seconds.
SECONDS_TARGET = 300.0


def held_out_sqnr(model: onnx.ModelProto, float_outputs: list[np.ndarray], feeds: list[dict]) -> float:
    """10 log10(sum x^2 / sum (x - q)^2) of the first output over the held-out feeds (graph as written)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    signal = noise = 0.0
    for ref, feed in zip(float_outputs, feeds, strict=True):
        got = sess.run(None, feed)[0].astype(np.float64)
        signal += float(np.sum(ref**2))
        noise += float(np.sum((ref - got) ** 2))
    return float(10 * np.log10(signal / noise))


def _feeds(name: str, n_calib: int) -> tuple[list[dict], list[dict]]:
    return zoo.sample_inputs(name, n_calib), zoo.sample_inputs(name, HELD_OUT, seed=1000)


def _float_outputs(src: object, feeds: list[dict]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
    return [sess.run(None, f)[0].astype(np.float64) for f in feeds]


def bench_fast_finetune(ctx: BenchContext) -> list[Measurement]:
    n_calib = QUICK_CALIB if ctx.quick else CALIB
    ctx.describe(
        [ACCURACY_MODEL, SPEED_MODEL],
        {"calibration": n_calib, "held out": HELD_OUT},
        {"calibration": 0, "held out": 1000},
        f"SQNR on the trained {ACCURACY_MODEL}; {SPEED_MODEL} (random weights) for wall time only",
    )
    src, speed_src = zoo.get(ACCURACY_MODEL), zoo.get(SPEED_MODEL)
    calib, held_out = _feeds(ACCURACY_MODEL, n_calib)
    speed_calib, _ = _feeds(SPEED_MODEL, n_calib)
    float_outputs = _float_outputs(src, held_out)
    kwargs = target_quantize_kwargs(TARGET)
    extra = dict(kwargs.pop("extra_options"))
    base = zonnx.quantize_static(src, None, ListReader(calib), **kwargs, extra_options=extra)
    before = held_out_sqnr(base.model, float_outputs, held_out)
    out: list[Measurement] = []
    for algorithm, settings in SETTINGS.items():
        ft = dict(settings, NumIterations=QUICK_ITERATIONS) if ctx.quick else dict(settings)
        with_ft = {**extra, "IncludeFastFT": True, "FastFinetune": ft}
        result = zonnx.quantize_static(src, None, ListReader(calib), **kwargs, extra_options=with_ft)
        outcome = result.recovery["fast_finetune"]
        after = held_out_sqnr(result.model, float_outputs, held_out)
        logger.info("%s", outcome.summary())
        note = (
            f"{outcome.tuned} layers, {ft['NumIterations']} steps each, {n_calib} calibration / {HELD_OUT} held-out "
            f"images; SQNR {before:.2f} -> {after:.2f} dB"
        )
        out.append(
            Measurement(
                f"{ACCURACY_MODEL} {TARGET} {algorithm}: held-out SQNR",
                after,
                "dB",
                HIGHER,
                peer="PTQ without fast finetune",
                peer_value=before,
                target=1.0,
                note=note,
            )
        )
        timed = zonnx.quantize_static(
            speed_src, None, ListReader(speed_calib), **kwargs, extra_options=with_ft
        )
        speed = timed.recovery["fast_finetune"]
        out.append(
            Measurement(
                f"ResNet-18 (random weights) {TARGET} {algorithm}: fast finetune wall time ({speed.tuned} layers)",
                speed.seconds,
                "s",
                LOWER,
                target=SECONDS_TARGET,
                note=f"{speed.capture_seconds:.1f} s of it capturing layer data",
            )
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 calibration images, 10 steps per layer")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ctx = BenchContext(quick=args.quick)
    results = bench_fast_finetune(ctx)
    from bench.header import host_lines, setup_lines

    print("\n".join([*host_lines(), *setup_lines("fast_finetune", ctx.described[-1])]))
    for m in results:
        ratio = f" (x{m.ratio:.3f} vs {m.peer} {m.peer_value:.2f})" if m.peer_value is not None else ""
        print(f"{m.name}: {m.value:.2f} {m.unit}{ratio}; {m.note}")


if __name__ == "__main__":
    main()
