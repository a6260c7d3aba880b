"""ORT float throughput of the CNN zoo models with graph optimizations off, against ORT's default (all on)."""

from __future__ import annotations

__all__ = ["MODELS", "QUICK_MODELS", "bench_zoo_ort", "session"]

import logging
import os

import onnxruntime as ort

from bench.runner import HIGHER, BenchContext, Measurement
from zonnx import zoo

logger = logging.getLogger(__name__)

MODELS = ["digits_cnn", "resnet18-random", "mobilenetv2-random"]
QUICK_MODELS = ["digits_cnn", "mobilenetv2-random"]
#: Inputs per timed sweep (batch 1 each); the figure is images per second over the sweep.
SWEEP = 8
QUICK_SWEEP = 2


def session(path: os.PathLike[str], level: ort.GraphOptimizationLevel) -> ort.InferenceSession:
    """A CPU session at optimization ``level`` with $ZONNX_THREADS intra-op threads (0: ORT's choice)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = level
    opts.intra_op_num_threads = int(os.environ.get("ZONNX_THREADS", "0"))
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def bench_zoo_ort(ctx: BenchContext) -> list[Measurement]:
    """Images/s at batch 1 for each CNN zoo model, ORT_DISABLE_ALL (ours: the graph as written) vs
    ORT_ENABLE_ALL (peer). No target: it shows how much ORT's own fusions are worth on each model."""
    out = []
    n = QUICK_SWEEP if ctx.quick else SWEEP
    ctx.describe(QUICK_MODELS if ctx.quick else MODELS, {"images per sweep (batch 1)": n}, {"images": 0})
    for name in QUICK_MODELS if ctx.quick else MODELS:
        path = zoo.get(name)
        feeds = zoo.sample_inputs(name, n)
        off = session(path, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        on = session(path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        t_off, t_on = ctx.time_pair(
            lambda off=off, feeds=feeds: [off.run(None, f) for f in feeds],
            lambda on=on, feeds=feeds: [on.run(None, f) for f in feeds],
        )
        out.append(
            Measurement(
                f"{name} float, ORT opt off",
                n / t_off.median,
                "img/s",
                HIGHER,
                peer="ORT opt on",
                peer_value=n / t_on.median,
            )
        )
    return out
