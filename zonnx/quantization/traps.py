"""Known quantization traps that the op rules handle on purpose (see docs/design.md, "The quantizer").

Detection head: ``Concat(boxes, sigmoid scores)``. A quantized Concat has one grid for all its inputs
(every NPU concatenates by copying codes, so the targets also align its inputs to that grid). With boxes
in pixels, ``[-5, 59]`` say, and scores in ``[0, 1]``, the shared 8-bit step is ``64 / 255 = 0.25``: every
score lands on one of about 4 codes. The rule: a Concat that joins a unit-range output (Sigmoid,
Softmax, HardSigmoid; through value-moving ops) with any other tensor is left float. Each branch keeps the
quantizer of the op that made it (the scores the fixed ``[0, 1]`` grid of their Sigmoid, step 1/255), and
the Concat, which has no MACs, runs on the CPU after the NPU on a target.

Residual stream (``extra_options["ResidualStream16"]``): in a post-LayerNorm transformer the tensors
around each LayerNorm (the residual Add's inputs and output, the LayerNorm's output) carry the outlier
channels trained BERTs grow (a few channels ~10-60x the median): one 8-bit per-tensor grid leaves the
other channels a handful of codes. When the target takes int16 activations, ``residual_stream_nodes``
names the LayerNorms and the Adds that feed one; their activations get int16 (step /256). The attention
mask Add is not one of them: its -10000 input would need a requantization ratio no 15-bit multiplier holds.
"""

from __future__ import annotations

__all__ = ["UNIT_RANGE_OPS", "mixed_range_concat", "residual_stream_nodes"]

import onnx_ir as ir

#: Ops whose outputs lie in [0, 1] whatever their input.
UNIT_RANGE_OPS = frozenset({"Sigmoid", "Softmax", "HardSigmoid"})
#: Ops that only move values: a unit-range value stays unit-range through them.
_MOVES = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Identity", "Split"})


def _unit_range(v: ir.Value | None) -> bool:
    producer = v.producer() if v is not None else None
    while producer is not None and producer.op_type in _MOVES:
        v = producer.inputs[0]
        producer = v.producer() if v is not None else None
    return producer is not None and producer.op_type in UNIT_RANGE_OPS


def mixed_range_concat(node: ir.Node) -> str | None:
    """Why ``node`` is left float when it is a Concat of unit-range scores and other values, else None."""
    if node.op_type != "Concat":
        return None
    inputs = [v for v in node.inputs if v is not None and v.const_value is None]
    unit = [_unit_range(v) for v in inputs]
    if any(unit) and not all(unit):
        return (
            "detection-head trap: Concat of unit-range scores and other values (boxes) stays float so each "
            "branch keeps its own grid"
        )
    return None


_NORMS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization"})


def residual_stream_nodes(model: ir.Model) -> list[str]:
    """Names of the LayerNorm nodes and of the two-activation Adds whose output feeds a LayerNorm."""
    names = []
    for node in model.graph:
        if node.op_type in _NORMS or (
            node.op_type == "Add"
            and all(v is not None and v.const_value is None for v in node.inputs)
            and any(use.node.op_type in _NORMS for use in node.outputs[0].uses())
        ):
            names.append(node.name)
    return names
