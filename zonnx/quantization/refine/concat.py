"""Concat: its inputs and its output share one position (or one scale), so the NPU concatenates by copying.

Rule (vai_q_onnx ``align_concat``; Compass ``unify_scales_for_concat``; TPU-MLIR backward calibration)::

    pos(in_1) = ... = pos(in_n) = pos(out) = min(pos(in_1), ..., pos(in_n), pos(out))

For float-scale targets the tensors take the union of their ranges (see ``align_sites``). An input
shared with other consumers moves for them too: the position belongs to the tensor.
"""

from __future__ import annotations

__all__ = ["AlignConcatPass"]

import logging

import onnx_ir as ir

from zonnx.backend.targets import Align
from zonnx.passes.base import Changes
from zonnx.passes.fusion.matching import label
from zonnx.quantization.refine.base import RefinePass, align_sites, is_float, usable_sites
from zonnx.quantization.refine.positions import QuantGraph

logger = logging.getLogger(__name__)


class AlignConcatPass(RefinePass):
    """Aligns every quantized Concat's inputs and output to one position (the smallest) or one scale.

    Acts when the target's ``[quant.align] concat = true``. Options: see ``RefinePass``.
    """

    name = "refine-align-concat"
    rule_key = "align"
    rule_label = "align.concat"

    def rule(self) -> Align | None:
        align = self.target.quant.align
        return align if align.concat else None

    def sweep(self, model: ir.Model, graph: QuantGraph, rule: Align, changes: Changes) -> None:
        for node in model.graph:
            if node.op_type != "Concat" or node.domain not in ("", "ai.onnx"):
                continue
            if not is_float(node.outputs[0]):
                continue
            roles = [
                (f"input {i} ({v.name})", graph.input_site(v))
                for i, v in enumerate(node.inputs)
                if v is not None
            ]
            roles.append(("output", graph.output_site(node.outputs[0])))
            sites = usable_sites(node, roles, self.power_of_two, changes)
            if sites is None:
                continue
            result = align_sites(graph, sites, self.power_of_two)
            if isinstance(result, str):
                changes.miss(f"{label(node)}: {result}")
            elif result[0]:
                changes.add(f"aligned Concat {label(node)} to {result[1]}", result[0])
