"""Fast finetune on ResNet-18 for the DPU: wall time and held-out output SQNR, AdaRound and AdaQuant.

Model: the zoo ResNet-18 (random weights, 1x3x224x224), quantized for ``dpu-b4096`` (power-of-two
per-tensor FixNeuron, MinMSE, refined for the target) with the keyword arguments of
``zonnx.build_npu.target_quantize_kwargs``. The peer is the same quantization without fast finetune,
measured in the same run: its held-out SQNR (logits against the float model, ``CALIB`` calibration images
and ``HELD_OUT`` other images) is the figure fast finetune must beat (ratio >= 1). The time is fast
finetune's own wall time (captures and tuning of all 21 layers, ``FastFinetuneResult.seconds``) against a
5-minute target, with torch and ORT on one thread (``Threads`` 1).

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


def bench_fast_finetune(ctx: BenchContext) -> list[Measurement]:
    src = zoo.get("resnet18-random")
    n_calib = QUICK_CALIB if ctx.quick else CALIB
    ctx.describe(
        ["resnet18-random"],
        {"calibration": n_calib, "held out": HELD_OUT},
        {"calibration": 0, "held out": 1000},
        "SQNR against float on an untrained network, not accuracy",
    )
    calib = zoo.sample_inputs("resnet18-random", n_calib)
    held_out = zoo.sample_inputs("resnet18-random", HELD_OUT, seed=1000)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    float_sess = ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
    float_outputs = [float_sess.run(None, f)[0].astype(np.float64) for f in held_out]
    kwargs = target_quantize_kwargs(TARGET)
    extra = dict(kwargs.pop("extra_options"))
    base = zonnx.quantize_static(src, None, ListReader(calib), **kwargs, extra_options=extra)
    before = held_out_sqnr(base.model, float_outputs, held_out)
    out: list[Measurement] = []
    for algorithm, settings in SETTINGS.items():
        ft = dict(settings, NumIterations=QUICK_ITERATIONS) if ctx.quick else dict(settings)
        result = zonnx.quantize_static(
            src,
            None,
            ListReader(calib),
            **kwargs,
            extra_options={**extra, "IncludeFastFT": True, "FastFinetune": ft},
        )
        outcome = result.recovery["fast_finetune"]
        after = held_out_sqnr(result.model, float_outputs, held_out)
        logger.info("%s", outcome.summary())
        note = (
            f"{outcome.tuned} layers, {ft['NumIterations']} steps each, {n_calib} calibration / {HELD_OUT} held-out "
            f"images; SQNR {before:.2f} -> {after:.2f} dB"
        )
        out.append(
            Measurement(
                f"ResNet-18 {TARGET} {algorithm}: held-out SQNR",
                after,
                "dB",
                HIGHER,
                peer="PTQ without fast finetune",
                peer_value=before,
                target=1.0,
                note=note,
            )
        )
        out.append(
            Measurement(
                f"ResNet-18 {TARGET} {algorithm}: fast finetune wall time",
                outcome.seconds,
                "s",
                LOWER,
                target=SECONDS_TARGET,
                note=f"{outcome.capture_seconds:.1f} s of it capturing layer data",
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
