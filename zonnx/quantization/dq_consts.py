"""Tensors a model already holds in quantized form: the output of a DequantizeLinear of constants.

ORT leaves such a tensor as it is (no new quantizer) and uses its parameters where a bias needs them;
``dq_params`` reads those parameters (per tensor, or per axis with the node's ``axis``).
"""

from __future__ import annotations

__all__ = ["dq_params"]

import numpy as np
import onnx_ir as ir

from zonnx.quantization.schemes import QuantParams, qdtype

_DQ_TYPES = {ir.DataType.INT8: "int8", ir.DataType.UINT8: "uint8", ir.DataType.INT16: "int16",
             ir.DataType.UINT16: "uint16", ir.DataType.INT4: "int4", ir.DataType.UINT4: "uint4",
             ir.DataType.INT32: "int32"}  # fmt: skip


def dq_params(v: ir.Value) -> QuantParams | None:
    """The parameters of the DequantizeLinear producing ``v`` when its codes, scale and zero point are
    constants (a pre-quantized weight or input), else None."""
    node = v.producer()
    if node is None or node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
        return None
    ins = list(node.inputs)
    if not ins or any(x is None or x.const_value is None for x in ins):
        return None
    codes = ins[0]
    name = _DQ_TYPES.get(codes.dtype)
    if name is None:
        return None
    dtype = qdtype(name)
    scale = np.asarray(ins[1].const_value.numpy(), np.float32)
    zp = np.asarray(ins[2].const_value.numpy()) if len(ins) > 2 else np.zeros(scale.shape, dtype.np_dtype)
    axis = node.attributes.get_int("axis", 1) if scale.ndim else None
    lo, hi = dtype.qrange()
    return QuantParams(scale, zp.astype(dtype.np_dtype), dtype, axis, None, lo, hi)
