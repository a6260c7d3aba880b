"""Run every refinement rule a target asks for, in vai_q_onnx's order, until the positions settle."""

from __future__ import annotations

__all__ = ["REFINE_PASSES", "refine_passes", "refine_model"]

import logging
from collections.abc import Mapping
from pathlib import Path

import onnx_ir as ir

from zonnx.backend.targets import Target, load_target
from zonnx.passes.base import Changes
from zonnx.quantization.refine.activation_inputs import PReluSlopePass, UnfusedActivationPass
from zonnx.quantization.refine.avgpool import AvgPoolFactorPass
from zonnx.quantization.refine.base import RefinePass
from zonnx.quantization.refine.concat import AlignConcatPass
from zonnx.quantization.refine.eltwise import EltwiseShiftPass
from zonnx.quantization.refine.leaky_relu import LeakyReluSlopePass
from zonnx.quantization.refine.pool import AlignPoolPass
from zonnx.quantization.refine.shift_bias import ShiftBiasPass
from zonnx.quantization.refine.shift_cut import ShiftCutPass
from zonnx.quantization.refine.sigmoid import SigmoidRangePass

logger = logging.getLogger(__name__)

#: The rules in the order they run: vai_q_onnx's (sigmoid, shift_read/write, shift_cut, shift_bias,
#: concat, pool), with the slope rewrites first and the avgpool factor (a graph change) last. The two
#: activation-input passes come first: they give the compiler quantized PRelu slopes and a quantizer
#: between an op and an activation the target cannot fuse into it.
REFINE_PASSES: tuple[type[RefinePass], ...] = (
    PReluSlopePass,
    UnfusedActivationPass,
    LeakyReluSlopePass,
    SigmoidRangePass,
    EltwiseShiftPass,
    ShiftCutPass,
    ShiftBiasPass,
    AlignConcatPass,
    AlignPoolPass,
    AvgPoolFactorPass,
)


def refine_passes(
    target: Target | str | Path, pool_kernels: Mapping[str, tuple[int, int]] | None = None
) -> list[RefinePass]:
    """One instance of every refinement pass for ``target`` (passes without a rule there do nothing);
    ``pool_kernels`` goes to the avgpool pass (windows of pools with dynamic input shapes)."""
    loaded = load_target(target)
    return [
        cls(loaded, pool_kernels=pool_kernels) if cls is AvgPoolFactorPass else cls(loaded)
        for cls in REFINE_PASSES
    ]


def refine_model(
    model: ir.Model,
    target: Target | str | Path,
    *,
    max_rounds: int = 4,
    pool_kernels: Mapping[str, tuple[int, int]] | None = None,
) -> Changes:
    """Apply all rules in order, repeating the round while it changes something (a later rule can
    break an earlier one: aligning a Concat moves the opos of the convolutions before it)."""
    passes = refine_passes(target, pool_kernels)
    total = Changes()
    for _ in range(max_rounds):
        round_changes = Changes()
        for p in passes:
            round_changes.merge(p.apply(model))
        total.merge(round_changes)
        if not round_changes.total:
            return total
    total.miss(
        f"refinement for target {load_target(target).name} still changed positions after "
        f"{max_rounds} rounds (rules conflict); the last round's changes are kept"
    )
    return total
