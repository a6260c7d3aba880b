"""Activations the target's compiler takes only with quantized inputs: PRelu slopes and unfused Relu/Clip.

PRelu slope. The NPU reads the slope ``a`` as integer codes. Where the target's op table lists PRelu
(a fused activation or an activation op), every float constant slope becomes
``DequantizeLinear(q, s, 0)`` (QDQ models) or ``FixNeuron(a)`` (FixNeuron models), int8, symmetric,
per tensor::

    s = max|a| / 127                       (float-scale targets)
    s = 2^-pos, pos = floor(log2(127 / max|a|))   (power-of-two targets)
    q = clip(round_half_even(a / s), -127, 127)

Unfused activation. ONNX Runtime's placement fuses a Relu/Clip into the op before it (no quantizer on
the op's output). When the target cannot fuse that activation into that op (zhouyi-x2's eltwise Add
fuses none) but runs it as an op of its own, the op's output gets a copy of the activation's output
quantizer (scale s, zero point z). This is exact whenever 0 is on the grid (``qmin <= z <= qmax``) and
the activation is ``Relu`` or ``Clip(0, hi)``: for x < 0 both ``Relu(Q(x))`` and ``Q(Relu(x))`` are 0;
for x >= 0 the rounding is the same; the upper clamp is the grid's in both orders. The same copy is
made, always exactly, when the op's float output only passes through a data-movement op (Flatten,
Reshape, Transpose, Squeeze, Unsqueeze) to a quantizer: such ops commute with quantization.
"""

from __future__ import annotations

__all__ = ["PReluSlopePass", "UnfusedActivationPass"]

import logging
import math

import numpy as np
import onnx_ir as ir

from zonnx.custom_ops import ZONNX_DOMAIN
from zonnx.passes.base import Changes
from zonnx.passes.fusion.matching import const_array, label
from zonnx.quantization.refine.base import RefinePass, fused_activations, is_float
from zonnx.quantization.refine.positions import QuantGraph, Quantizer

logger = logging.getLogger(__name__)

_ONNX = ("", "ai.onnx")
_CLAMPS = frozenset({"Relu", "Clip"})
#: Ops that only move values: quantizing before them equals quantizing after them.
_MOVES = frozenset({"Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity"})


def _supports(target, op_type: str) -> bool:
    """The target runs ``op_type`` as an op or fuses it into some op."""
    if target.ops_for(op_type):
        return True
    return any(op_type in row.activations for row in target.ops.values())


def _fresh(graph: ir.Graph, base: str) -> str:
    names = {v.name for n in graph for v in n.outputs} | set(graph.initializers) | {n.name for n in graph}
    name, i = base, 1
    while name in names:
        name, i = f"{base}_{i}", i + 1
    return name


def _const(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=_fresh(graph, name), const_value=ir.tensor(array))
    value.shape = ir.Shape(array.shape)
    value.dtype = ir.DataType.from_numpy(array.dtype)
    graph.register_initializer(value)
    return value


def _fixneuron_template(model: ir.Model) -> ir.Node | None:
    return next((n for n in model.graph if n.op_type == "FixNeuron" and n.domain == ZONNX_DOMAIN), None)


class PReluSlopePass(RefinePass):
    """Quantizes each float constant PRelu slope (int8, symmetric, per tensor) where the target has PRelu.

    Changes nothing on targets without PRelu (one miss says so) and leaves quantized slopes alone.
    """

    name = "refine-prelu-slope"
    rule_label = "PRelu"

    def rule(self) -> bool:
        return _supports(self.target, "PRelu")

    def apply(self, model: ir.Model) -> Changes:
        """Nothing to say for a model without PRelu; otherwise the base class's sweeps (and its miss when
        the target has no PRelu)."""
        if not any(n.op_type == "PRelu" for n in model.graph):
            return Changes()
        return super().apply(model)

    def sweep(self, model: ir.Model, graph: QuantGraph, rule: bool, changes: Changes) -> None:
        template = _fixneuron_template(model)
        done: dict[ir.Value, ir.Value] = {}  # a slope shared by several PRelus is quantized once
        for node in list(model.graph):
            if node.op_type != "PRelu" or node.domain not in _ONNX or len(node.inputs) < 2:
                continue
            slope = node.inputs[1]
            if slope in done:
                node.replace_input_with(1, done[slope])
                changes.add("PRelu slope quantized")
                continue
            arr = const_array(slope)
            if arr is None or arr.dtype.kind != "f":
                continue  # already read through a quantizer, or computed
            peak = float(np.max(np.abs(arr))) or 1.0
            if self.power_of_two:
                pos = math.floor(math.log2(127.0 / peak))
                scale = float(2.0**-pos)
            else:
                pos, scale = 0, float(np.float32(peak / 127.0))
            base = f"{slope.name or label(node)}_slope"
            if template is not None and self.power_of_two:
                attrs = [a for a in template.attributes.values() if a.name != "pos"]
                new = ir.Node(ZONNX_DOMAIN, "FixNeuron", [slope], [*attrs, ir.AttrInt64("pos", pos)],
                              overload=template.overload, name=_fresh(model.graph, base + "_FixNeuron"))  # fmt: skip
            else:
                codes = np.clip(np.round(arr / np.float32(scale)), -127, 127).astype(np.int8)
                inputs = [
                    _const(model.graph, base + "_q", codes),
                    _const(model.graph, base + "_scale", np.array(scale, np.float32)),
                    _const(model.graph, base + "_zero_point", np.array(0, np.int8)),
                ]
                new = ir.Node(
                    "", "DequantizeLinear", inputs, name=_fresh(model.graph, base + "_DequantizeLinear")
                )
            new.outputs[0].name = _fresh(model.graph, base + "_dq")
            new.outputs[0].dtype = ir.DataType.FLOAT
            new.outputs[0].shape = ir.Shape(arr.shape)
            model.graph.insert_before(node, new)
            node.replace_input_with(1, new.outputs[0])
            done[slope] = new.outputs[0]
        for slope in done:  # the codes replace a float slope nothing else reads
            if not slope.uses() and slope.name in model.graph.initializers and not slope.is_graph_output():
                del model.graph.initializers[slope.name]
            changes.add("PRelu slope quantized")


class UnfusedActivationPass(RefinePass):
    """Gives ``op -> Relu/Clip`` a quantizer between the two when the target cannot fuse them (see above).

    Acts when the op and the activation each have a row in the target's op table and the activation's
    output is quantized; other activations (LeakyRelu, PRelu: the grid would cut their negative part)
    are left fused, and the partition report names them (rule activation).
    """

    name = "refine-unfused-activation"
    rule_label = "activation fusion"

    def rule(self) -> bool:
        return True

    def sweep(self, model: ir.Model, graph: QuantGraph, rule: bool, changes: Changes) -> None:
        for node in list(model.graph):
            if node.domain not in _ONNX or len(node.outputs) != 1 or not self.target.ops_for(node.op_type):
                continue
            value = node.outputs[0]
            users = value.consumers()
            if len(users) != 1 or value.is_graph_output() or graph.site(value) is not None:
                continue
            act = users[0]
            if not is_float(value) or not act.inputs or act.inputs[0] is not value:
                continue  # shape operands (Reshape's int64 shape) and non-data inputs stay as they are
            if act.domain not in _ONNX or act.op_type in fused_activations(self.target, node.op_type):
                continue
            if not self.target.ops_for(act.op_type):
                continue
            site = graph.site(act.outputs[0])
            if site is None:
                continue
            if act.op_type not in _MOVES and (act.op_type not in _CLAMPS or not _clip_from_zero(act)):
                # the NPU partition names this pair (rule activation); no exact split exists
                logger.debug("%s after %s: not a Relu/Clip(0, hi); left fused", label(act), label(node))
                continue
            quantizer = site.quantizers[0]
            params = quantizer.params()
            if isinstance(params, str) or not params[2] <= params[1] <= params[3]:
                changes.miss(f"{label(act)}: its output quantizer has no usable grid ({params})")
                continue
            out = _copy_quantizer(model.graph, quantizer, value, act)
            act.replace_input_with(0, out)
            changes.add(f"{node.op_type} -> {act.op_type} split by a quantizer")
        # a later sweep finds nothing new: every split value now has its own site


def _clip_from_zero(node: ir.Node) -> bool:
    if node.op_type == "Relu":
        return True
    lo = const_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if lo is None:
        lo_attr = node.attributes.get_float("min", None) if "min" in node.attributes else None
        return lo_attr == 0.0
    return float(np.asarray(lo).reshape(())) == 0.0


def _copy_quantizer(graph: ir.Graph, quantizer: Quantizer, value: ir.Value, before: ir.Node) -> ir.Value:
    """Insert a copy of ``quantizer`` (its first node and first dequantizer) reading ``value``."""
    first = quantizer.nodes[0]
    chain = [first] if len(quantizer.nodes) == 1 else [first, quantizer.nodes[1]]
    current = value
    for node in chain:
        inputs = [current, *node.inputs[1:]]
        copy = ir.Node(node.domain, node.op_type, inputs, list(node.attributes.values()),
                       overload=node.overload, name=_fresh(graph, f"{value.name}_{node.op_type}"))  # fmt: skip
        copy.outputs[0].name = _fresh(graph, f"{value.name}_{node.op_type}_out")
        dtype = node.outputs[0].dtype
        if dtype is None:  # codes take the zero point's type (QuantizeLinear's default uint8); else float
            zp = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
            codes = "Quantize" in node.op_type
            dtype = (
                (ir.DataType.from_numpy(zp.dtype) if zp is not None else ir.DataType.UINT8)
                if codes
                else value.dtype
            )
        copy.outputs[0].dtype = dtype
        copy.outputs[0].shape = value.shape
        graph.insert_before(before, copy)
        current = copy.outputs[0]
    return current
