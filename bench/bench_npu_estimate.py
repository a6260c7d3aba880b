"""Estimated NPU time of the zoo CNNs on every target: what ``zonnx profile`` reports, from one command.

Each model is quantized with its target's recipe (``target_quantize_kwargs``, 4 calibration samples),
compiled for the target at batch 1 and profiled with the target file's hardware numbers
(``zonnx.backend.profile.profile_model``). These are estimates from a cost model whose inputs are partly
marked "assumed" in the target files, not measurements: they do not depend on the host, and are listed
so that a change to the compiler or the cost model shows up as a changed figure.
"""

from __future__ import annotations

__all__ = ["bench_npu_estimate"]

import tempfile
from pathlib import Path

import zonnx
from bench.runner import LOWER, BenchContext, Measurement
from zonnx import zoo
from zonnx.backend.profile import profile_model
from zonnx.build_npu import target_quantize_kwargs
from zonnx.quantization.calibration.readers import ListReader

MODELS = ("resnet18-random", "mobilenetv2-random")
TARGETS = ("dpu-b4096", "zhouyi-x2", "bm1684x")
N_CALIB = 4


def _estimate(model: str, target: str, work: Path) -> list[Measurement]:
    """Quantize ``model`` for ``target``, profile it and return the totals as figures."""
    quantized = work / f"{model}_{target}.onnx"
    zonnx.quantize_static(
        zoo.get(model),
        quantized,
        ListReader(zoo.sample_inputs(model, N_CALIB, seed=1)),
        **target_quantize_kwargs(target),
    )
    report = profile_model(quantized, target)
    t = report.totals
    clock = report.engine.clock_mhz
    label = f"{model} {target} ({clock:g} MHz)"
    return [
        Measurement(f"{label}: estimated NPU cycles", float(t["cycles"]), "cycles", LOWER),
        Measurement(f"{label}: estimated NPU time at clock", float(t["ms"]), "ms", LOWER),
        Measurement(f"{label}: estimated DDR read", t["ddr_read"] / 1e6, "MB", LOWER),
        Measurement(f"{label}: estimated DDR written", t["ddr_write"] / 1e6, "MB", LOWER),
        Measurement(
            f"{label}: layers tiled (of {t['npu_layers']})", float(t["tiled_layers"]), "layers", LOWER
        ),
    ]


def bench_npu_estimate(ctx: BenchContext) -> list[Measurement]:
    """Estimated cycles, time and DDR traffic per model and target (no timing; host-independent)."""
    ctx.describe(
        list(MODELS),
        {"calibration": N_CALIB, "targets": len(TARGETS)},
        {"calibration": 1},
        "estimates from the target files' cost model (zonnx profile), batch 1, not measurements",
    )
    out: list[Measurement] = []
    with tempfile.TemporaryDirectory(prefix="zonnx-bench-estimate-") as tmp:
        for model in MODELS[:1] if ctx.quick else MODELS:
            for target in TARGETS:
                out += _estimate(model, target, Path(tmp))
    return out
