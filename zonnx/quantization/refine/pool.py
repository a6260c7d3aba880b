"""Pooling: the input and output of MaxPool/AveragePool/GlobalAveragePool share one position (or scale).

Rule (vai_q_onnx ``align_pool``; TPU-MLIR backward calibration for MaxPool)::

    pos(in) = pos(out) = min(pos(in), pos(out))

The op types come from the target's ``[quant.align] pool_ops``. A factor Mul inserted after an average
pool by ``refine-avgpool-factor`` is looked through.
"""

from __future__ import annotations

__all__ = ["AlignPoolPass"]

import logging

import onnx_ir as ir

from zonnx.backend.targets import Align
from zonnx.passes.base import Changes
from zonnx.passes.fusion.matching import label
from zonnx.quantization.refine.base import RefinePass, align_sites, is_float, usable_sites
from zonnx.quantization.refine.positions import QuantGraph

logger = logging.getLogger(__name__)


class AlignPoolPass(RefinePass):
    """Aligns the input and output of every quantized pool in ``[quant.align] pool_ops`` to one grid.

    Options: see ``RefinePass``.
    """

    name = "refine-align-pool"
    rule_key = "align"
    rule_label = "align.pool_ops"

    def rule(self) -> Align | None:
        align = self.target.quant.align
        return align if align.pool_ops else None

    def sweep(self, model: ir.Model, graph: QuantGraph, rule: Align, changes: Changes) -> None:
        for node in model.graph:
            if node.op_type not in rule.pool_ops or node.domain not in ("", "ai.onnx"):
                continue
            if not is_float(node.outputs[0]):
                continue
            roles = [
                ("input", graph.input_site(node.inputs[0])),
                ("output", graph.output_site(node.outputs[0])),
            ]
            sites = usable_sites(node, roles, self.power_of_two, changes)
            if sites is None:
                continue
            result = align_sites(graph, sites, self.power_of_two)
            if isinstance(result, str):
                changes.miss(f"{label(node)}: {result}")
            elif result[0]:
                changes.add(f"aligned {node.op_type} {label(node)} to {result[1]}", result[0])
