"""report.html and the closing summary for the command-line form of ``zonnx build`` (no config file).

The command-line build's ``report.json`` stages (quantize, compile, npu) are turned into the same
``ReportData`` the config build shows: accuracy float / int8 / NPU (digits: test top-1 against labels;
other models: cosine of each model's outputs against float), the int8 layer report, the partition and
the estimated NPU cost of the compiled model.
"""

from __future__ import annotations

__all__ = ["report_from_stages", "cli_summary"]

import logging
from pathlib import Path
from typing import Any

from zonnx.deploy.report_html import ReportData, read_json

logger = logging.getLogger(__name__)


def _accuracy(npu: dict[str, Any]) -> dict[str, Any] | None:
    if "npu_top1" in npu:
        scores = {"float": npu["float_top1"], "int8": npu["quantized_top1"], "npu": npu["npu_top1"]}
        return {"metric": "top-1 (labels)", "samples": npu.get("samples", 450), "scores": scores}
    if "npu_cosine" in npu:
        scores = {"float": 1.0, "int8": npu["quantized_cosine"], "npu": npu["npu_cosine"]}
        return {"metric": "cosine to float", "samples": npu["samples"], "scores": scores}
    return None


def report_from_stages(stages: dict[str, dict[str, Any]], title: str, options: str) -> ReportData:
    """The page's data from the command-line build's stages (compiled model read back for its partition)."""
    from zonnx.backend.compile_api import CompiledModel
    from zonnx.backend.partition.report import to_dict
    from zonnx.backend.profile import profile_model
    from zonnx.ir.io import load_proto

    data = ReportData(title=title, config=options)
    quant, comp = stages.get("quantize"), stages.get("compile")
    if quant:
        layers = read_json(Path(f"{quant['output']}.report.json"))
        data.layers = (layers or {}).get("layers", [])
    if comp:
        compiled = Path(comp["compiled"])
        data.partition = to_dict(CompiledModel.from_proto(load_proto(compiled)).partition)
        data.profile = profile_model(compiled).to_dict()
    data.accuracy = _accuracy(stages.get("npu", {}))
    data.summary = [tuple(line.split(": ", 1)) for line in cli_summary(data, None)]  # type: ignore[misc]
    return data


def cli_summary(data: ReportData, html: Path | None) -> list[str]:
    """Accuracy float / int8 / NPU, share of MACs on the NPU, estimated NPU latency, report path."""
    lines = []
    if data.accuracy:
        s = data.accuracy["scores"]
        lines.append(f"accuracy: {data.accuracy['metric']}, float {s['float']:.4f} / int8 {s['int8']:.4f} / "
                     f"NPU {s['npu']:.4f} ({data.accuracy['samples']} samples)")  # fmt: skip
    if data.partition:
        s = data.partition["summary"]
        lines.append(f"NPU MACs: {100 * s['mac_share']:.1f}% of the model's known MACs on the NPU "
                     f"({s['npu_ops']} of {s['total_ops']} ops, {s['subgraphs']} subgraph(s))")  # fmt: skip
    if data.profile:
        t = data.profile["totals"]
        clock = data.profile["hardware"].get("clock_mhz")
        lines.append(f"estimated NPU latency: {t['ms']:.4f} ms ({t['cycles']} cycles at {clock} MHz)")
    if html is not None:
        lines.append(f"report: {html}")
    return lines
