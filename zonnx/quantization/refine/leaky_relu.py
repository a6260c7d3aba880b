"""LeakyRelu: the slope becomes the nearest slope the hardware has (DPU: 0.1 as 26/256 = 0.1015625).

Rule (vai_q_tensorflow2 / vai_q_pytorch)::

    k = round(alpha * denominator)
    k in numerators:   alpha := k / denominator   (the original is kept in metadata "zonnx.original_alpha")
    otherwise:         left alone; the op will not run on the NPU (a miss says so)
"""

from __future__ import annotations

__all__ = ["LeakyReluSlopePass", "ORIGINAL_ALPHA"]

import logging

import numpy as np
import onnx_ir as ir

from zonnx.backend.targets import LeakyReluSlope
from zonnx.passes.base import Changes
from zonnx.passes.fusion.matching import label
from zonnx.quantization.refine.base import RefinePass
from zonnx.quantization.refine.positions import QuantGraph

logger = logging.getLogger(__name__)

#: Node metadata key holding the alpha a LeakyRelu had before this pass rewrote it.
ORIGINAL_ALPHA = "zonnx.original_alpha"


class LeakyReluSlopePass(RefinePass):
    """Rewrites each LeakyRelu's alpha to the target's k/denominator slope when one is nearest.

    Acts when the target has ``[quant.leaky_relu]``; quantized or not, every LeakyRelu is checked.
    Options: see ``RefinePass`` (``max_sweeps`` is not used: one sweep suffices).
    """

    name = "refine-leaky-relu"
    rule_key = "leaky_relu"

    def sweep(self, model: ir.Model, graph: QuantGraph, rule: LeakyReluSlope, changes: Changes) -> None:
        slopes = ", ".join(f"{k}/{rule.denominator}" for k in rule.numerators)
        for node in model.graph:
            if node.op_type != "LeakyRelu" or node.domain not in ("", "ai.onnx"):
                continue
            alpha = float(np.float32(node.attributes.get_float("alpha", 0.01)))
            k = round(alpha * rule.denominator)
            if k not in rule.numerators:
                changes.miss(
                    f"{label(node)}: alpha {alpha:.6g} is not a hardware slope ({slopes}); left alone "
                    "(it will not run on the NPU)"
                )
                continue
            exact = float(np.float32(k / rule.denominator))
            if alpha == exact:
                continue
            node.attributes["alpha"] = ir.AttrFloat32("alpha", exact)
            node.metadata_props.setdefault(ORIGINAL_ALPHA, repr(alpha))
            changes.add(f"LeakyRelu alpha {alpha:.6g} -> {k}/{rule.denominator}")
