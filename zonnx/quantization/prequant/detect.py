"""Tell a model that is already quantized from a float one, and by which form.

The rule: a model is pre-quantized when it holds integer compute ops or quantizers that dequantize
integer codes. Forms, checked in this order (the first that matches names the model):

- ``dynamic``: DynamicQuantizeLinear, MatMulInteger, ConvInteger, com.microsoft MatMulIntegerToFloat,
  DynamicQuantizeMatMul, DynamicQuantizeLSTM (``quantize_dynamic``);
- ``qoperator``: QLinear* ops, com.microsoft QGemm and the other QLinear ops;
- ``fixneuron``: com.zonnx FixNeuron / VitisQuantizeLinear (power-of-two, vai_q_onnx style);
- ``qdq``: DequantizeLinear of integer codes (QDQ from ORT, torch, TFLite via ``zonnx convert``, ...).
"""

from __future__ import annotations

__all__ = ["quantized_form", "DYNAMIC_OPS", "FORMS", "QDQ_DOMAINS"]

import onnx
import onnx_ir as ir

DYNAMIC_OPS = frozenset(
    {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
     "DynamicQuantizeLSTM"}
)  # fmt: skip
FORMS = ("dynamic", "qoperator", "fixneuron", "qdq")


#: Domains whose QuantizeLinear/DequantizeLinear are ONNX's: ORT writes its 4- and 16-bit Q/DQ below opset 21
#: in ``com.microsoft`` (same inputs, same semantics).
QDQ_DOMAINS = ("", "ai.onnx", "com.microsoft")


def _ops(model: ir.Model | onnx.ModelProto) -> set[tuple[str, str]]:
    nodes = model.graph.node if isinstance(model, onnx.ModelProto) else model.graph
    return {("" if n.domain in QDQ_DOMAINS else n.domain, n.op_type) for n in nodes}


def quantized_form(model: ir.Model | onnx.ModelProto) -> str | None:
    """``"dynamic"``, ``"qoperator"``, ``"fixneuron"``, ``"qdq"``, or None for a float model."""
    ops = _ops(model)
    types = {op for _, op in ops}
    if types & DYNAMIC_OPS:
        return "dynamic"
    if any(op.startswith("QLinear") or op == "QGemm" for op in types):
        return "qoperator"
    if ("com.zonnx", "FixNeuron") in ops or ("com.zonnx", "VitisQuantizeLinear") in ops:
        return "fixneuron"
    if ("", "DequantizeLinear") in ops and ("", "QuantizeLinear") in ops:
        return "qdq"  # activations quantized too; DequantizeLinear on constants alone (weight-only storage)
    return None  # is a float model whose weights keep their parameters (ORT's rule, zonnx.quantization.dq_consts)
