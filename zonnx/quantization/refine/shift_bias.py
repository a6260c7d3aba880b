"""Convolution-like ops with a bias: the bias is shifted by ``shift_bias`` bits onto the accumulator grid.

Rule (vai_q_onnx ``adjust_shift_bias``; DPU: accumulator 24 bits, data 8 bits, max 16)::

    shift_cut  = wpos + ipos - opos
    shift_bias = wpos + ipos - bpos   in [min(0, -(accumulator_bits - (data_bits + shift_cut))), max]
    too large: bpos := wpos + ipos - max       too small: bpos := wpos + ipos - min

Only the bias position moves. Run it after ``refine-shift-cut`` (which may move wpos).
"""

from __future__ import annotations

__all__ = ["ShiftBiasPass"]

import logging

import onnx_ir as ir

from zonnx.backend.targets import ShiftBias
from zonnx.passes.base import Changes
from zonnx.passes.fusion.matching import label
from zonnx.quantization.refine.base import RefinePass, fused_activations
from zonnx.quantization.refine.positions import QuantGraph
from zonnx.quantization.refine.shift_cut import conv_sites

logger = logging.getLogger(__name__)

_OPS = ("Conv", "ConvTranspose", "Gemm")


class ShiftBiasPass(RefinePass):
    """Moves bias positions so that shift_bias = wpos + ipos - bpos lies in the target's range.

    Acts when the target has ``[quant.shift_bias]``, on the ``[quant.shift_cut] ops`` that have a bias
    input (Conv, ConvTranspose, Gemm by default). Options: see ``RefinePass``.
    """

    name = "refine-shift-bias"
    rule_key = "shift_bias"

    def sweep(self, model: ir.Model, graph: QuantGraph, rule: ShiftBias, changes: Changes) -> None:
        cut = self.target.quant.shift_cut
        ops = [op for op in (cut.ops if cut else _OPS) if op in _OPS]
        for node in model.graph:
            if node.op_type not in ops or node.domain not in ("", "ai.onnx") or len(node.inputs) < 3:
                continue
            sites = conv_sites(node, graph, changes, True, fused_activations(self.target, node.op_type))
            if sites is None:
                continue
            isite, wsite, osite, bsite = sites
            ipos, wpos, opos, bpos = (s.require_pos() for s in (isite, wsite, osite, bsite))
            low, high = rule.limits(wpos + ipos - opos)
            shift = wpos + ipos - bpos
            wanted = min(max(shift, low), high)
            if wanted != shift and graph.set_pos(bsite, wpos + ipos - wanted):
                changes.add(
                    f"{node.op_type} {label(node)}: shift_bias {shift} -> {wanted} "
                    f"(bpos {bpos} -> {wpos + ipos - wanted})"
                )
