"""Quantizer parameters (code type, scales, zero points) and the ``target.quant`` rules they must meet."""

from __future__ import annotations

__all__ = ["QInfo", "dtype_name", "quant_rule"]

import dataclasses
import logging

import numpy as np
import onnx_ir as ir

from zonnx.backend.targets import Target
from zonnx.custom_ops import ZONNX_DOMAIN
from zonnx.passes.fusion.matching import const_array
from zonnx.quantization.refine.positions import pos_of_scale

logger = logging.getLogger(__name__)


def dtype_name(dtype: ir.DataType | None) -> str:
    return dtype.name.lower() if dtype is not None else "unknown"


@dataclasses.dataclass(frozen=True)
class QInfo:
    """Parameters of one quantizer node: code type, scales, zero points."""

    dtype: str
    bits: int
    scales: np.ndarray
    zero_points: np.ndarray

    @classmethod
    def of(cls, node: ir.Node) -> QInfo | str:
        if node.domain == ZONNX_DOMAIN:
            a = node.attributes
            pos, bits, signed = a.get_int("pos"), a.get_int("bit_width", 8), a.get_int("signed", 1)
            if pos is None:
                return f"{node.op_type} {node.name!r} has no pos attribute"
            return cls(f"{'int' if signed else 'uint'}{bits}", bits, np.array([2.0**-pos]), np.zeros(1))
        scale = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
        if scale is None:
            return f"the scale of {node.op_type} {node.name!r} is not a constant"
        zp_value = node.inputs[2] if len(node.inputs) > 2 else None
        zp = const_array(zp_value) if zp_value is not None else None
        if zp_value is not None and zp is None:
            return f"the zero point of {node.op_type} {node.name!r} is not a constant"
        if node.op_type == "DequantizeLinear" and node.inputs[0] is not None and node.inputs[0].dtype:
            dtype = node.inputs[0].dtype
        elif zp is not None:
            dtype = ir.DataType.from_numpy(zp.dtype)
        else:
            dtype = ir.DataType(node.attributes.get_int("output_dtype", ir.DataType.UINT8))
        zps = np.zeros(1) if zp is None else np.asarray(zp, np.int64).ravel()
        return cls(dtype_name(dtype), dtype.bitwidth, np.asarray(scale, np.float64).ravel(), zps)


def quant_rule(target: Target, info: QInfo, role: str, tensor: str) -> tuple[str, str] | None:
    """(rule, reason) when a quantizer's parameters do not fit ``target.quant`` for ``role`` (activation,
    weight or bias), else None: code type, power-of-two scale, symmetric zero point, per-tensor scale."""
    q, name = target.quant, target.name
    if role == "bias":
        if info.bits > q.bias_bits:
            return "dtype", f"bias {tensor!r} is {info.dtype} but {name} adds {q.bias_bits}-bit biases"
    else:
        allowed = q.activation_dtypes if role == "activation" else q.weight_dtypes
        if info.dtype not in allowed:
            return (
                "dtype",
                f"{role} {tensor!r} is {info.dtype}; {name} takes {', '.join(allowed)} {role}s",
            )
    if q.power_of_two and (any(pos_of_scale(s) is None for s in info.scales) or info.zero_points.any()):
        bad = next((s for s in info.scales if pos_of_scale(s) is None), info.scales[0])
        return "scale", (
            f"{role} {tensor!r} has scale {bad:.6g} (zero point {int(info.zero_points.flat[0])}), not a power "
            f"of two; {name} computes with power-of-two scales (quantize with --format fixneuron)"
        )
    if role != "bias":
        symmetric = q.activation_symmetric if role == "activation" else q.weight_symmetric
        if symmetric and info.zero_points.any():
            zp = int(info.zero_points[info.zero_points != 0][0])
            return "zero_point", f"{role} {tensor!r} has zero point {zp}; {name} {role}s are symmetric"
        granularity = q.activation_granularity if role == "activation" else q.weight_granularity
        if granularity == "per_tensor" and info.scales.size > 1:
            return "granularity", (
                f"{role} {tensor!r} is quantized per channel ({info.scales.size} scales); "
                f"{name} takes one scale per tensor"
            )
    return None
