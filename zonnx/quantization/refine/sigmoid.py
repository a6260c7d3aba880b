"""Sigmoid-like units: limits on the input and output positions of the hardware's sigmoid table.

Rule (vai_q_onnx ``adjust_vitis_sigmoid``; DPU: ipos in [0, 15], opos >= 7, 14 + ipos - opos in [0, 31])::

    ipos := clamp(ipos, ipos_lo, ipos_hi)
    opos := max(opos, opos_min)
    shift = shift_offset + ipos - opos   outside [lo, hi]: opos := shift_offset + ipos - clamp(shift)

The op types come from the target's ``[quant.sigmoid] ops`` (a user target may add Tanh).
"""

from __future__ import annotations

__all__ = ["SigmoidRangePass"]

import logging

import onnx_ir as ir

from zonnx.backend.targets import SigmoidLimits
from zonnx.passes.base import Changes
from zonnx.passes.fusion.matching import label
from zonnx.quantization.refine.base import RefinePass, is_float, usable_sites
from zonnx.quantization.refine.positions import QuantGraph

logger = logging.getLogger(__name__)


class SigmoidRangePass(RefinePass):
    """Moves the input/output positions of every quantized sigmoid-like op into the target's limits.

    Acts when the target has ``[quant.sigmoid]``. Options: see ``RefinePass``.
    """

    name = "refine-sigmoid"
    rule_key = "sigmoid"

    def sweep(self, model: ir.Model, graph: QuantGraph, rule: SigmoidLimits, changes: Changes) -> None:
        for node in model.graph:
            if node.op_type not in rule.ops or node.domain not in ("", "ai.onnx"):
                continue
            if not is_float(node.outputs[0]):
                continue
            roles = [
                ("input", graph.input_site(node.inputs[0])),
                ("output", graph.output_site(node.outputs[0])),
            ]
            sites = usable_sites(node, roles, True, changes)
            if sites is None:
                continue
            if len(sites) != 2:
                changes.miss(f"{label(node)}: input and output are one tensor; left alone")
                continue
            isite, osite = sites
            ipos, opos = isite.require_pos(), osite.require_pos()
            new_ipos = min(max(ipos, rule.ipos[0]), rule.ipos[1])
            new_opos = max(opos, rule.opos_min)
            shift = rule.shift_offset + new_ipos - new_opos
            new_opos = rule.shift_offset + new_ipos - min(max(shift, rule.shift[0]), rule.shift[1])
            if new_opos < rule.opos_min:
                changes.miss(
                    f"{label(node)}: no output position satisfies opos >= {rule.opos_min} and "
                    f"the shift range {list(rule.shift)} with ipos {new_ipos}"
                )
                continue
            if graph.set_pos(isite, new_ipos):
                changes.add(f"{node.op_type} {label(node)}: ipos {ipos} -> {new_ipos}")
            if graph.set_pos(osite, new_opos):
                changes.add(f"{node.op_type} {label(node)}: opos {opos} -> {new_opos}")
