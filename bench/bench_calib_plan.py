"""Calibration wall time with zonnx's own plan (the tensors quantize_static actually calibrates) on
ResNet-18, 32 samples, against one float inference sweep over the same samples, both with and
without the sweep's session creation (calibration always creates its own augmented session).

Per method the calibration, the sweep with its session and the sweep alone are timed in the same rounds,
so the ratios follow from the printed numbers. Histograms (Percentile) count zonnx's default strided sample
(``CalibHistogramSample`` 16384 values per tensor and batch)."""

from __future__ import annotations

__all__ = ["bench_calib_plan"]

import onnxruntime as ort

from bench.runner import LOWER, BenchContext, Measurement
from zonnx import zoo
from zonnx.ir.io import to_ir, to_proto
from zonnx.quantization.annotate import annotate
from zonnx.quantization.annotate_config import annotate_config
from zonnx.quantization.api import build_config
from zonnx.quantization.calibration.collector import collect
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.prepare import prepare_for_quantization


def bench_calib_plan(ctx: BenchContext) -> list[Measurement]:
    """Ratios calibration / float sweep for MinMax (target 1.3) and Percentile (target 1.6)."""
    n = 8 if ctx.quick else 32
    ctx.describe(
        ["resnet18-random"], {"calibration": n}, {"calibration": 1}, "float sweep on the same samples"
    )
    feeds = zoo.sample_inputs("resnet18-random", n, seed=1)
    cfg = build_config()
    model = to_ir(zoo.get("resnet18-random"))
    prepare_for_quantization(model, cfg)
    plan = annotate(model, annotate_config(model, cfg))
    proto = to_proto(model)
    names = [t for t in plan.activations() if plan.tensors[t].fixed_range is None]
    data = proto.SerializeToString()

    def sweep_with_session() -> None:
        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        for f in feeds:
            sess.run(None, f)

    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    out = []
    for method, target in (("minmax", 1.3), ("percentile", 1.6)):
        t = ctx.time_interleaved(
            {
                "calib": lambda m=method: collect(proto, names, ListReader(feeds), methods_needed=[m]),
                "run_only": lambda: [sess.run(None, f) for f in feeds],
                "with_session": sweep_with_session,
            }
        )
        calib, run_only, with_session = (t[k].median for k in ("calib", "run_only", "with_session"))
        note = f"{len(names)} tensors, {n} samples; vs run-only sweep {calib / run_only:.2f}x"
        out.append(
            Measurement(
                f"resnet18-random calibration {method} vs float sweep incl. session",
                calib,
                "s",
                LOWER,
                peer="float sweep",
                peer_value=with_session,
                target=target,
                note=note,
            )
        )
        out.append(
            Measurement(
                f"resnet18-random calibration {method} vs float sweep, run only",
                calib,
                "s",
                LOWER,
                peer="float sweep (runs)",
                peer_value=run_only,
                target=target,
            )
        )
    return out
