"""Pick the writer for the chosen format, after upgrading the opset to what the output needs.

With ``UseQDQContribOps`` (ORT) the Q/DQ nodes are written in the com.microsoft domain, whose kernels
take 16-bit and 4-bit types at any opset, so the opset is not raised to 21 for them.
"""

from __future__ import annotations

__all__ = ["write_model"]

import logging
from collections import Counter

import onnx_ir as ir

from zonnx.errors import OptionError
from zonnx.ir.io import default_opset
from zonnx.quantization.config import QuantConfig
from zonnx.quantization.enums import QuantFormat, VitisQuantFormat
from zonnx.quantization.formats.common import ensure_opset
from zonnx.quantization.formats.qdq import required_opset, write_bfloat16, write_qdq
from zonnx.quantization.plan import QuantPlan

logger = logging.getLogger(__name__)


def _upgrade(model: ir.Model, opset: int, cfg: QuantConfig) -> None:
    current = default_opset(model)
    if current >= opset:
        return
    if not cfg.extra.auto_upgrade_opset:
        raise OptionError(
            f"the quantized model needs opset {opset} (it is at {current}); "
            "allow AutoUpgradeOpset or upgrade with `zonnx optimize --opset {opset}`."
        )
    from zonnx.passes.catalog import make_pass

    logger.warning("upgrading opset %d -> %d: the quantized types need it", current, opset)
    make_pass("opset-upgrade", target_opset=opset)(model)


def write_model(model: ir.Model, plan: QuantPlan, cfg: QuantConfig) -> tuple[Counter[str], int]:
    """Insert quantization nodes in place; returns counts by role and the final opset."""
    if cfg.activation_type == "bfloat16":
        counts = write_bfloat16(model, plan)
        return counts, default_opset(model)
    if cfg.quant_format in (VitisQuantFormat.FixNeuron, VitisQuantFormat.QDQ):
        from zonnx.quantization.formats.fixneuron import write_fixneuron

        counts = write_fixneuron(
            model,
            plan,
            separate=cfg.quant_format == VitisQuantFormat.QDQ,
            round_mode=cfg.extra.fix_round_mode,
        )
        return counts, default_opset(model)
    contrib = cfg.extra.use_qdq_contrib_ops
    # com.microsoft Q/DQ take 16-bit and 4-bit types at any opset: no upgrade for the types (ORT's rule)
    _upgrade(model, 13 if contrib else required_opset(plan), cfg)
    counts = write_qdq(model, plan, add_qdq_pair_to_weight=cfg.extra.add_qdq_pair_to_weight)
    if cfg.quant_format == QuantFormat.QOperator:
        from zonnx.quantization.formats.qoperator import qdq_to_qoperator

        counts.update(qdq_to_qoperator(model, float_activations=cfg.extra.activation_symmetric))
    if contrib:
        _to_contrib_domain(model)
    return counts, default_opset(model)


def _to_contrib_domain(model: ir.Model) -> None:
    """UseQDQContribOps: every QuantizeLinear/DequantizeLinear moves to ORT's com.microsoft domain."""
    moved = 0
    for node in model.graph:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.domain in ("", "ai.onnx"):
            node.domain = "com.microsoft"
            moved += 1
    if moved:
        ensure_opset(model, "com.microsoft", 1)
