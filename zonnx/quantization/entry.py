"""ORT's other entry points: ``quantize(model, out, StaticQuantConfig)`` and ``get_qdq_config``.

``get_qdq_config`` is ORT's own function (it only reads the model and builds a ``StaticQuantConfig``);
``quantize`` runs zonnx's ``quantize_static`` with that config's fields, so code written for
``onnxruntime.quantization.quantize`` works unchanged. Dynamic quantization configs are refused.
"""

from __future__ import annotations

__all__ = ["quantize", "get_qdq_config"]

import os
from typing import Any

import onnx
from onnxruntime.quantization import StaticQuantConfig, get_qdq_config

from zonnx.errors import OptionError


def quantize(
    model_input: str | os.PathLike[str] | onnx.ModelProto,
    model_output: str | os.PathLike[str],
    quant_config: Any,
) -> Any:
    """Quantize with an ORT ``StaticQuantConfig`` (e.g. from ``get_qdq_config``); returns zonnx's result."""
    from zonnx.quantization.api import quantize_static

    if not isinstance(quant_config, StaticQuantConfig):
        raise OptionError(
            f"quantize: quant_config is a {type(quant_config).__name__}; zonnx quantizes statically only "
            "(give a StaticQuantConfig, e.g. from get_qdq_config)."
        )
    c = quant_config
    return quantize_static(
        model_input,
        model_output,
        c.calibration_data_reader,
        quant_format=c.quant_format,
        op_types_to_quantize=c.op_types_to_quantize,
        per_channel=c.per_channel,
        reduce_range=c.reduce_range,
        activation_type=c.activation_type,
        weight_type=c.weight_type,
        nodes_to_quantize=c.nodes_to_quantize,
        nodes_to_exclude=c.nodes_to_exclude,
        use_external_data_format=c.use_external_data_format,
        calibrate_method=c.calibrate_method,
        calibration_providers=c.calibration_providers,
        extra_options=c.extra_options,
    )
