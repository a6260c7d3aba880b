"""Store the scale and zero-point initializers of Q/DQ nodes in ONNX's typed fields, as ORT does.

onnx-ir serializes every initializer to ``raw_data``. ORT's quantizer writes scales into ``float_data``
and zero points into ``int32_data`` (the storage ONNX specifies for 8/16-bit and 4-bit integers), and
tools that read those fields directly (ORT's own tests, some converters) see an empty list otherwise.
The values are the same either way; only the field differs.
"""

from __future__ import annotations

__all__ = ["store_qparams_typed"]

import onnx
from onnx import helper, numpy_helper

_Q_OPS = {"QuantizeLinear", "DequantizeLinear"}
#: Largest initializer rewritten (scales and zero points are scalars or one value per channel).
_MAX_ELEMENTS = 1 << 16


def store_qparams_typed(model: onnx.ModelProto) -> int:
    """Rewrite every Q/DQ (and QOperator) scale and zero-point initializer from raw_data to its typed field; returns the count."""
    int32_zp = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT32}
    names = {n for node in model.graph.node if node.op_type in _Q_OPS for n in node.input[1:3] if n}
    names |= {i.name for i in model.graph.initializer if i.name.endswith(("_scale", "_zero_point"))}
    for node in model.graph.node:  # int32 bias parameters stay in raw_data, as ORT writes them
        if node.op_type in _Q_OPS and len(node.input) > 2 and node.input[2] in int32_zp:
            names -= set(node.input[1:3])
    count = 0
    for i, init in enumerate(model.graph.initializer):
        if (
            init.name not in names
            or not init.HasField("raw_data")
            or init.data_location == onnx.TensorProto.EXTERNAL
        ):
            continue
        array = numpy_helper.to_array(init)
        if array.size > _MAX_ELEMENTS:
            continue
        typed = helper.make_tensor(init.name, init.data_type, list(init.dims), array.flatten().tolist())
        model.graph.initializer[i].CopyFrom(typed)
        count += 1
    return count
