"""The parameters of default-domain QuantizeLinear/DequantizeLinear nodes as the QOperator converter reads them."""

from __future__ import annotations

__all__ = ["INT8_CODES", "QParams", "const_value", "qdq_params", "softmax_y_scale", "dequantized"]

import dataclasses

import numpy as np
import onnx_ir as ir

#: 8-bit code type -> (qmin, qmax, numpy dtype).
INT8_CODES = {ir.DataType.INT8: (-128, 127, np.int8), ir.DataType.UINT8: (0, 255, np.uint8)}


@dataclasses.dataclass(frozen=True)
class QParams:
    """Parameters of one QuantizeLinear/DequantizeLinear node."""

    scale_v: ir.Value
    zp_v: ir.Value | None
    scale: np.ndarray
    zp: np.ndarray
    dtype: ir.DataType
    axis: int

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1

    def same(self, other: QParams) -> bool:
        def key(p: QParams) -> tuple:
            return p.dtype, p.scale.ravel().tobytes(), p.zp.ravel().tobytes(), p.per_tensor or p.axis

        return key(self) == key(other)

    def quantize(self, x: float) -> int:
        """Q(x) as QuantizeLinear computes it (float32 divide, round half to even, saturate)."""
        lo, hi, _ = INT8_CODES[self.dtype]
        return int(np.clip(np.rint(np.float32(x) / self.scale.ravel()[0]) + int(self.zp.ravel()[0]), lo, hi))


def const_value(value: ir.Value | None) -> np.ndarray | None:
    tensor = ir.convenience.get_const_tensor(value) if value is not None else None
    return None if tensor is None else tensor.numpy()


def qdq_params(node: ir.Node) -> QParams | None:
    """Constant per-tensor or per-axis parameters of a default-domain Q/DQ node, else None."""
    if node.domain not in ("", "ai.onnx") or len(node.inputs) < 2 or node.attributes.get_int("block_size", 0):
        return None
    scale, zp_v = const_value(node.inputs[1]), node.inputs[2] if len(node.inputs) > 2 else None
    zp = const_value(zp_v)
    if scale is None or scale.ndim > 1 or (zp_v is not None and zp is None):
        return None
    if zp is not None:
        dtype = zp_v.dtype or ir.DataType.from_numpy(zp.dtype)
    elif node.op_type == "DequantizeLinear" and node.inputs[0].dtype is not None:
        dtype = node.inputs[0].dtype
    else:
        dtype = ir.DataType(node.attributes.get_int("output_dtype", ir.DataType.UINT8))
    zp = np.zeros(scale.shape, np.int64) if zp is None else zp.astype(np.int64)
    return QParams(
        node.inputs[1], zp_v, scale.astype(np.float32), zp, dtype, node.attributes.get_int("axis", 1)
    )


def softmax_y_scale(scale: np.float32) -> np.float32:
    """y_scale for QLinearSoftmax, which multiplies by floor(1/y_scale): when 1/scale is an integer k up
    to float32 rounding (1/255 gives 254.99998), the largest float32 whose reciprocal floors to k."""
    k, y = np.rint(np.float32(1) / scale), np.float32(scale)
    while abs(np.float32(1) / scale - k) < 1e-3 and np.floor(np.float32(1) / y) < k:
        y = np.nextafter(y, np.float32(0))
    return y


def dequantized(value: ir.Value | None) -> tuple[ir.Node, QParams] | None:
    node = value.producer() if value is not None else None
    qp = qdq_params(node) if node is not None and node.op_type == "DequantizeLinear" else None
    return None if qp is None else (node, qp)
