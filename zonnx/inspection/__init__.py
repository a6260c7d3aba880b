"""Model inspection: I/O, op histogram, parameters, MACs, quantization format and unknown shapes."""

from __future__ import annotations

__all__ = [
    "ModelSummary",
    "TensorInfo",
    "Parameters",
    "DtypeParams",
    "UnknownShape",
    "Macs",
    "OpMacs",
    "UnknownMacs",
    "FixedDim",
    "Quantization",
    "inspect_model",
    "render",
    "render_summary",
    "summary_to_dict",
    "to_json",
]

from zonnx.inspection.macs import FixedDim, Macs, OpMacs, UnknownMacs
from zonnx.inspection.quant import Quantization
from zonnx.inspection.render import render, render_summary, to_json
from zonnx.inspection.summary import (
    DtypeParams,
    ModelSummary,
    Parameters,
    TensorInfo,
    UnknownShape,
    inspect_model,
    summary_to_dict,
)
