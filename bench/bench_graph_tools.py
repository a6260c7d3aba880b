"""Wall time of ``zonnx inspect`` and ``zonnx optimize`` on every zoo model, each against a peer doing
comparable work in the same run: inspect vs ``onnx.load`` + ``onnx.shape_inference.infer_shapes``
(what inspect builds on), optimize (pre_quant, fixed point) vs onnxslim on the same model."""

from __future__ import annotations

__all__ = ["bench_graph_tools"]

import onnx
import onnxslim

from bench.runner import LOWER, BenchContext, Measurement
from zonnx import zoo
from zonnx.inspection import inspect_model
from zonnx.ir.io import load_proto
from zonnx.optimization import OptimizeOptions, optimize_with_report

QUICK = ["digits_cnn", "ppocr_cls"]


def bench_graph_tools(ctx: BenchContext) -> list[Measurement]:
    """Seconds per call for inspect and optimize on each zoo model (lower is better; no target)."""
    out = []
    ctx.describe(QUICK if ctx.quick else zoo.names(), {}, {}, "graph tools: no input data")
    for name in QUICK if ctx.quick else zoo.names():
        path = zoo.get(name)
        t_inspect, t_infer = ctx.time_pair(
            lambda p=path: inspect_model(p),
            lambda p=path: onnx.shape_inference.infer_shapes(onnx.load(p), data_prop=True),
        )
        out.append(
            Measurement(
                f"{name}: inspect",
                t_inspect.median,
                "s",
                LOWER,
                peer="onnx load+infer_shapes",
                peer_value=t_infer.median,
            )
        )
        proto = load_proto(path)
        opts = OptimizeOptions()
        t_opt, t_slim = ctx.time_pair(
            lambda m=proto, o=opts: optimize_with_report(m, o),
            lambda m=proto: onnxslim.slim(onnx.ModelProto.FromString(m.SerializeToString())),
        )
        result = optimize_with_report(proto, opts)
        out.append(
            Measurement(
                f"{name}: optimize (pre_quant)",
                t_opt.median,
                "s",
                LOWER,
                peer="onnxslim",
                peer_value=t_slim.median,
                note=f"nodes {result.report.nodes_before} -> {result.report.nodes_after}",
            )
        )
    return out
