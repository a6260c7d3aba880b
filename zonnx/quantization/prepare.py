"""The float model made ready for annotation: opset, the prep passes, node names, the options' names checked."""

from __future__ import annotations

__all__ = [
    "PREP_PASSES",
    "TARGET_PREP_PASSES",
    "prep_passes",
    "prepare_for_quantization",
    "name_nodes",
    "check_node_names",
]

import logging
from collections import Counter

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

#: Passes added after ``fold-batchnorm`` when quantizing for an NPU target, so the quantized model rounds
#: where the NPU rounds: a convolution applies its constant scale and offset itself (PP-LCNetV3's learnable
#: affine blocks: two roundings each when quantized as nodes), and HardSwish is one operation, not
#: paddle2onnx's four nodes, whose product ``x * Clip(x + 3, 0, 6)`` reaches 300 on PP-OCRv4 rec and so
#: gets a step of 1 or 2 before the division. Measured there (char accuracy, 200 rendered lines):
#: zhouyi-x2 0.85 -> 0.97, dpu-b4096 0.990 -> 0.993 with spaces removed (its HardSwish runs on the CPU
#: either way: 53 subgraphs before and after, 313 -> 172 CPU nodes), bm1684x unchanged.
TARGET_PREP_PASSES = ("fold-conv-affine", "fuse-hardswish")


def prep_passes(target: str | None) -> tuple[str, ...]:
    """The preparation passes in order: ``PREP_PASSES``, with ``TARGET_PREP_PASSES`` after BatchNorm folding
    when there is a target."""
    if not target:
        return PREP_PASSES
    after = PREP_PASSES.index("fold-batchnorm") + 1
    return PREP_PASSES[:after] + TARGET_PREP_PASSES + PREP_PASSES[after:]


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


def prepare_for_quantization(model: ir.Model, cfg: QuantConfig) -> Counter[str]:
    """Rule: the model at opset 13 or more (upgraded when ``AutoUpgradeOpset`` allows), ``prep_passes`` run
    in order, every node named. For a target, a decomposed hard-swish the model's opset cannot express
    (HardSwish is opset 14) upgrades the model to 14 when ``AutoUpgradeOpset`` allows; otherwise it stays
    ``x * HardSigmoid(x)``. Returns what ``TARGET_PREP_PASSES`` changed (empty without a target), for the
    summary."""
    from zonnx.passes.base import ZonnxPassResult
    from zonnx.passes.catalog import make_pass
    from zonnx.passes.fusion.hardswish import HARDSWISH_OPSET

    start = default_opset(model)
    target = max(start, cfg.extra.opset or 13, 13)
    if target > start:
        if not cfg.extra.auto_upgrade_opset:
            raise OptionError(
                f"the model is at opset {start} and quantized output needs 13+; "
                "allow AutoUpgradeOpset or upgrade it with `zonnx optimize --opset 13`."
            )
        make_pass("opset-upgrade", target_opset=target)(model)
    changed: Counter[str] = Counter()
    for name in prep_passes(cfg.extra.target):
        result = make_pass(name)(model)
        if name == "fuse-hardswish" and cfg.extra.auto_upgrade_opset and _needs_hardswish_opset(result):
            make_pass("opset-upgrade", target_opset=HARDSWISH_OPSET)(model)
            result = make_pass(name)(model)
        if name in TARGET_PREP_PASSES and isinstance(result, ZonnxPassResult):
            changed.update(result.changes.counts)
    end = default_opset(model)
    if end > start:  # one line for both upgrades
        why = f" ({HARDSWISH_OPSET} for its hard-swish, one NPU operation)" if end > target else ""
        logger.warning("upgrading the model from opset %d to %d for quantization%s", start, end, why)
    name_nodes(model)
    return changed


def _needs_hardswish_opset(result: ir.passes.PassResult) -> bool:
    """Whether the hard-swish fusion left a pattern only because the model's opset has no HardSwish."""
    from zonnx.passes.base import ZonnxPassResult
    from zonnx.passes.fusion.hardswish import missed_for_opset

    return isinstance(result, ZonnxPassResult) and missed_for_opset(result.changes)


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
