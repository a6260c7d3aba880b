"""The float model made ready for annotation: opset, the prep passes, node names, the options' names checked."""

from __future__ import annotations

__all__ = ["PREP_PASSES", "prepare_for_quantization", "name_nodes", "check_node_names"]

import logging

import onnx_ir as ir

from zonnx.errors import OptionError, did_you_mean
from zonnx.ir.io import default_opset
from zonnx.quantization.config import QuantConfig

logger = logging.getLogger(__name__)

#: Passes run before annotation: weights become initializers, shapes are known, BN is folded, and each
#: linear node has its own bias (its int32 codes depend on that node's scales).
PREP_PASSES = (
    "shape-inference",
    "constant-folding",
    "remove-noops",
    "fold-batchnorm",
    "dead-code",
    "unshare-bias",
    "shape-inference",
)


def name_nodes(model: ir.Model) -> None:
    """Give every unnamed node a stable name (``<OpType>_<index>``) so users can exclude it."""
    used = {n.name for n in model.graph if n.name}
    for i, node in enumerate(model.graph):
        if not node.name:
            name = f"{node.op_type}_{i}"
            while name in used:
                name += "_"
            node.name = name
            used.add(name)


def prepare_for_quantization(model: ir.Model, cfg: QuantConfig) -> None:
    """Rule: the model at opset 13 or more (upgraded when ``AutoUpgradeOpset`` allows), ``PREP_PASSES`` run
    in order, every node named."""
    from zonnx.passes.catalog import make_pass

    target = max(default_opset(model), cfg.extra.opset or 13, 13)
    if target > default_opset(model):
        if not cfg.extra.auto_upgrade_opset:
            raise OptionError(
                f"the model is at opset {default_opset(model)} and quantized output needs 13+; "
                "allow AutoUpgradeOpset or upgrade it with `zonnx optimize --opset 13`."
            )
        logger.warning(
            "upgrading the model from opset %d to %d for quantization", default_opset(model), target
        )
        make_pass("opset-upgrade", target_opset=target)(model)
    for name in PREP_PASSES:
        make_pass(name)(model)
    name_nodes(model)


def check_node_names(model: ir.Model, cfg: QuantConfig) -> None:
    """One warning per node name an option lists that the (prepared) model does not have."""
    names = [n.name for n in model.graph]
    known = set(names)
    for option in ("nodes_to_exclude", "nodes_to_quantize", "input_nodes", "output_nodes"):
        for name in getattr(cfg, option):
            if name not in known:
                logger.warning(
                    "%s: no node named %r in the model.%s", option, name, did_you_mean(name, names)
                )
