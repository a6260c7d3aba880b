"""What zonnx's NPU compiler can lower, checked at partition time so that one op never sinks a subgraph.

A group the target's table accepts but the compiler cannot lower would fail at compile time and take
its whole subgraph back to the CPU. ``lowering_rule`` refuses such groups up front (rule
``no_lowering``), one by one, so that the rest of the subgraph stays on the NPU:

- the op type has no integer lowering (``ops.registry.lowerable_op_types``: Softmax,
  LayerNormalization, ConvTranspose, Reduce*, ... stay on the CPU);
- an op module's own check fails (``ops.registry.lowering_check``; Resize other than nearest: the
  compiler moves codes, linear interpolation is not lowered);
- an activation fused into the op other than Relu/Clip (the compiler fuses clamps only), unless it reads
  the op's requantized output (a lookup on codes after the op, ``capability.ON_CODES``);
- a parameter the compiler reads as a constant is computed at run time: Conv/Gemm weights, the
  divisor of Div, the indices of Gather, Slice starts/ends/axes/steps, Pad pads (each op module's
  ``const_inputs``, ``ops.registry.constant_input_indices``).

``is_param_operand`` says which float constant inputs are operation parameters rather than data that
must be quantized: a scalar float constant of Mul/Div (TPU-MLIR's MulConst: ``x * c``, ``x / c``) or of
Add/Sub (``x + c``) on targets with float scales; power-of-two targets need every constant quantized.
"""

from __future__ import annotations

__all__ = ["lowering_rule", "is_param_operand", "RULE"]

import logging
from collections.abc import Sequence

import onnx_ir as ir

from zonnx.backend.ops.registry import constant_input_indices, lowerable_op_types, lowering_check
from zonnx.backend.targets import Target
from zonnx.passes.fusion.matching import const_array
from zonnx.quantization.refine.positions import is_refine_node

logger = logging.getLogger(__name__)

RULE = "no_lowering"
_CONST_OPERAND_OPS = frozenset({"Mul", "Div", "Add", "Sub"})
_FUSED_OK = frozenset({"Relu", "Clip"})
_QUANTIZERS = {
    "DequantizeLinear",
    "VitisDequantizeLinear",
    "FixNeuron",
    "QuantizeLinear",
    "VitisQuantizeLinear",
}


def _is_constant(value: ir.Value | None) -> bool:
    """A constant, or a dequantizer / FixNeuron of one (a quantized constant)."""
    if value is None or const_array(value) is not None:
        return True
    prod = value.producer()
    return (
        prod is not None
        and prod.op_type in _QUANTIZERS
        and bool(prod.inputs)
        and const_array(prod.inputs[0]) is not None
    )


def is_param_operand(node: ir.Node, index: int, value: ir.Value, target: Target) -> bool:
    """Whether input ``index`` of ``node`` is a float scalar constant the NPU op takes as a parameter."""
    if (
        node.op_type not in _CONST_OPERAND_OPS
        or node.domain not in ("", "ai.onnx")
        or target.quant.power_of_two
    ):
        return False
    arr = const_array(value)
    return arr is not None and arr.size == 1 and arr.dtype.kind == "f"


def lowering_rule(anchor: ir.Node, members: Sequence[ir.Node]) -> tuple[str, str] | None:
    """(``no_lowering``, reason) when the compiler cannot lower the group of ``anchor``, else None.

    ``members`` are the group's nodes other than its output quantizers (the anchor first).
    """
    op, label = anchor.op_type, f"{anchor.op_type} {anchor.name!r}"
    if op not in lowerable_op_types():
        return RULE, f"{label}: zonnx's NPU compiler has no integer lowering for {op}"
    check = lowering_check(op)
    why = check(anchor) if check is not None else None
    if why is not None:
        return RULE, f"{label}: {why}"
    for index in constant_input_indices(op):
        if index < len(anchor.inputs) and not _is_constant(anchor.inputs[index]):
            value = anchor.inputs[index]
            return RULE, f"{label}: input {index} ({value.name!r}) must be a constant for the NPU compiler"
    for node in members:
        if node is anchor or node.op_type in _FUSED_OK or is_refine_node(node):
            continue
        value = node.inputs[0] if node.inputs else None
        prod = value.producer() if value is not None else None
        if prod is not None and prod.op_type in _QUANTIZERS and node.op_type in lowerable_op_types():
            continue  # applied to the op's codes: lowered on its own (a lookup table)
        return (
            RULE,
            f"{label}: the compiler fuses only Relu/Clip into an op, not {node.op_type} {node.name!r}",
        )
    return None
