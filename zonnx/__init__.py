"""zonnx: an ONNX-centric NPU deployment toolchain (convert, optimize, quantize, compile, run).

The public names below are imported on first use, so ``import zonnx`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "optimize": "zonnx.optimization:optimize",
    "optimize_with_report": "zonnx.optimization:optimize_with_report",
    "OptimizeOptions": "zonnx.optimization:OptimizeOptions",
    "inspect": "zonnx.inspection:inspect_model",
    "ModelSummary": "zonnx.inspection:ModelSummary",
    "load_model": "zonnx.ir.io:load_model",
    "load_proto": "zonnx.ir.io:load_proto",
    "save_model": "zonnx.ir.io:save_model",
    "ZonnxError": "zonnx.errors:ZonnxError",
    "quantize_static": "zonnx.quantization.api:quantize_static",
    "quantize": "zonnx.quantization.entry:quantize",
    "get_qdq_config": "zonnx.quantization.entry:get_qdq_config",
    "InferenceSession": "zonnx.backend.session:InferenceSession",
    "QuantFormat": "zonnx.quantization.enums:QuantFormat",
    "QuantType": "zonnx.quantization.enums:QuantType",
    "CalibrationMethod": "zonnx.quantization.enums:CalibrationMethod",
    "VitisQuantFormat": "zonnx.quantization.enums:VitisQuantFormat",
    "PowerOfTwoMethod": "zonnx.quantization.enums:PowerOfTwoMethod",
    "CalibrationDataReader": "zonnx.quantization.calibration.readers:CalibrationDataReader",
    # submodules reachable as attributes: zonnx.convert.from_torch(...), zonnx.zoo.get(...)
    "convert": "zonnx.convert",
    "zoo": "zonnx.zoo",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'zonnx' has no attribute {name!r}")
    module, _, attr = _LAZY[name].partition(":")
    value = getattr(importlib.import_module(module), attr) if attr else importlib.import_module(module)
    globals()[name] = value
    return value
