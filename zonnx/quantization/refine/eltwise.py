"""Eltwise Add: limits on the shifts that bring the inputs to a common grid and the sum to the output.

Rules (vai_q_onnx ``adjust_shift_read`` / ``adjust_shift_write``; DPU: read in [0, 15], write in [-15, 15])::

    shift_read  = max(ipos) - min(ipos)   in [lo, hi]  else the largest ipos := min(ipos) + hi
    shift_write = min(ipos) - opos        in [lo, hi]  else opos := min(ipos) - clamp(shift_write)

With ``equal_input_scales`` the inputs are first put on one grid (``align_sites``). The op types come
from the target's ``[quant.eltwise] ops``. Lowering a position widens the tensor's range (never clips
more); raising opos for shift_write narrows the output range as the hardware requires. The output
position is read after the activations the target fuses into the op (DPU eltwise: Relu). Adds with a
constant operand are not eltwise ops of two feature maps and are skipped.
"""

from __future__ import annotations

__all__ = ["EltwiseShiftPass"]

import logging

import onnx_ir as ir

from zonnx.backend.targets import Eltwise
from zonnx.passes.base import Changes
from zonnx.passes.fusion.matching import const_array, label
from zonnx.quantization.refine.base import RefinePass, align_sites, fused_activations, is_float, usable_sites
from zonnx.quantization.refine.positions import QuantGraph, Site

logger = logging.getLogger(__name__)


class EltwiseShiftPass(RefinePass):
    """Keeps shift_read and shift_write of every quantized eltwise op (Add) within the target's limits.

    Acts when the target has ``[quant.eltwise]``. Options: see ``RefinePass``.
    """

    name = "refine-eltwise"
    rule_key = "eltwise"

    def sweep(self, model: ir.Model, graph: QuantGraph, rule: Eltwise, changes: Changes) -> None:
        for node in model.graph:
            if node.op_type not in rule.ops or node.domain not in ("", "ai.onnx"):
                continue
            if not is_float(node.outputs[0]) or any(
                v is None or const_array(v) is not None for v in node.inputs
            ):
                continue  # not an eltwise of two feature maps (a bias-like or shape Add)
            inputs = [(f"input {i} ({v.name})", graph.input_site(v)) for i, v in enumerate(node.inputs)]
            if any(site is not None and site.const for _, site in inputs):
                continue
            sites = usable_sites(node, inputs, self.power_of_two, changes)
            if sites is None:
                continue
            if rule.equal_input_scales and len(sites) > 1:
                result = align_sites(graph, sites, self.power_of_two)
                if isinstance(result, str):
                    changes.miss(f"{label(node)}: {result}")
                    continue
                if result[0]:
                    changes.add(f"aligned {node.op_type} {label(node)} inputs to {result[1]}", result[0])
            if rule.shift_read is None and rule.shift_write is None:
                continue
            if not self.power_of_two:
                changes.miss(
                    f"{label(node)}: shift limits need power-of-two scales; target {self.target.name} has float scales"
                )
                continue
            self._shift_read(node, graph, sites, rule, changes)
            if rule.shift_write is not None:
                fused = fused_activations(self.target, node.op_type)
                out = usable_sites(
                    node, [("output", graph.output_site(node.outputs[0], fused))], True, changes
                )
                if out is not None:
                    self._shift_write(node, graph, sites, out[0], rule.shift_write, changes)

    def _shift_read(
        self, node: ir.Node, graph: QuantGraph, sites: list[Site], rule: Eltwise, changes: Changes
    ) -> None:
        if rule.shift_read is None or len(sites) < 2:
            return
        poses = [s.require_pos() for s in sites]
        low, high = min(poses), max(poses)
        if high - low > rule.shift_read[1]:
            top = sites[poses.index(high)]
            graph.set_pos(top, low + rule.shift_read[1])
            changes.add(
                f"{node.op_type} {label(node)}: shift_read {high - low} -> {rule.shift_read[1]} "
                f"(input {top.name} pos {high} -> {low + rule.shift_read[1]})"
            )

    def _shift_write(
        self,
        node: ir.Node,
        graph: QuantGraph,
        sites: list[Site],
        out: Site,
        limits: tuple[int, int],
        changes: Changes,
    ) -> None:
        low, opos = min(s.require_pos() for s in sites), out.require_pos()
        shift = low - opos
        wanted = min(max(shift, limits[0]), limits[1])
        if wanted != shift and graph.set_pos(out, low - wanted):
            changes.add(
                f"{node.op_type} {label(node)}: shift_write {shift} -> {wanted} (opos {opos} -> {low - wanted})"
            )
