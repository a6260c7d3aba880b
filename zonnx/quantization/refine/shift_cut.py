"""Convolution-like ops: the accumulator is shifted right by ``shift_cut`` bits into the output grid.

Rule (vai_q_onnx ``adjust_shift_cut``; DPU: [0, 16])::

    shift_cut = wpos + ipos - opos   in [min, max]
    too large: wpos := max + opos - ipos       too small: wpos := min + opos - ipos

Only the weight position moves (the weights are re-quantized on the new grid: a FixNeuron or Q/DQ on a
float weight recomputes them, stored codes are rescaled). ``ipos`` is read at input 0, ``wpos`` at the
constant operand (input 1; either input of MatMul), ``opos`` after the activations the target fuses into the op (its op table; Relu, Clip, ...).
"""

from __future__ import annotations

__all__ = ["ShiftCutPass", "conv_sites"]

import logging

import onnx_ir as ir

from zonnx.backend.targets import ShiftCut
from zonnx.passes.base import Changes
from zonnx.passes.fusion.matching import label
from zonnx.quantization.refine.base import FUSED_ACTIVATIONS, RefinePass, fused_activations, usable_sites
from zonnx.quantization.refine.positions import QuantGraph, Site

logger = logging.getLogger(__name__)


def conv_sites(
    node: ir.Node,
    graph: QuantGraph,
    changes: Changes,
    with_bias: bool,
    fused: frozenset[str] = FUSED_ACTIVATIONS,
) -> list[Site] | None:
    """[input, weight, output(, bias)] sites of a convolution-like node, or None (with a miss)."""
    data, weight = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    if node.op_type == "MatMul" and weight is not None:
        first, second = graph.input_site(data), graph.input_site(weight)
        if first is not None and first.const and not (second is not None and second.const):
            data, weight = weight, data
    wsite = graph.input_site(weight)
    if wsite is not None and not wsite.const:
        changes.miss(f"{label(node)}: operand {weight.name!r} is not a constant weight; left alone")
        return None
    roles = [
        ("input", graph.input_site(data)),
        ("weight", wsite),
        ("output", graph.output_site(node.outputs[0], fused)),
    ]
    if with_bias:
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if bias is None:
            return None
        roles.append(("bias", graph.input_site(bias)))
    found = usable_sites(node, roles, True, changes)
    if found is None or len(found) != len(roles):
        if found is not None:
            changes.miss(f"{label(node)}: one tensor plays two roles; left alone")
        return None
    return found


class ShiftCutPass(RefinePass):
    """Moves weight positions so that shift_cut = wpos + ipos - opos lies in the target's range.

    Acts when the target has ``[quant.shift_cut]`` (and power-of-two scales). Options: see ``RefinePass``.
    """

    name = "refine-shift-cut"
    rule_key = "shift_cut"

    def sweep(self, model: ir.Model, graph: QuantGraph, rule: ShiftCut, changes: Changes) -> None:
        for node in model.graph:
            if node.op_type not in rule.ops or node.domain not in ("", "ai.onnx"):
                continue
            sites = conv_sites(node, graph, changes, False, fused_activations(self.target, node.op_type))
            if sites is None:
                continue
            isite, wsite, osite = sites
            ipos, wpos, opos = isite.require_pos(), wsite.require_pos(), osite.require_pos()
            shift = wpos + ipos - opos
            wanted = min(max(shift, rule.min), rule.max)
            if wanted != shift and graph.set_pos(wsite, wanted + opos - ipos):
                changes.add(
                    f"{node.op_type} {label(node)}: shift_cut {shift} -> {wanted} "
                    f"(wpos {wpos} -> {wanted + opos - ipos})"
                )
