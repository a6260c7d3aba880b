"""NPU coverage check: a partition that leaves the NPU (nearly) idle is said out loud, with the cause and fix.

Rule. Let ``share`` be the partition's NPU share of MACs (of nodes when the model has no MAC count).
When no node or ``share < LOW_SHARE`` runs on the NPU, the *cause* is the rule that keeps the most MACs
on the CPU (ties and MAC-free models: the most nodes), ignoring ``boundary`` (quantizers and copies that
follow their readers). The advice names the share, the cause with one example reason, and the fix for
that rule (``FIXES``): quantize for the target (dtype, scale, zero point, granularity, not quantized),
fix the input shapes (dynamic shapes), lower ``--min-nodes`` / ``--min-macs``, or no fix (op types the
target has no kernel for). ``check_coverage`` logs the advice as a warning, or raises
``LowCoverageError`` when ``strict``.
"""

from __future__ import annotations

__all__ = [
    "LOW_SHARE",
    "dynamic_advice",
    "LowCoverageError",
    "coverage_advice",
    "check_coverage",
    "quant_summary",
]

import logging
from collections import Counter

from zonnx.backend.partition.capability import CapabilityResult
from zonnx.backend.partition.partitioner import Partition
from zonnx.backend.targets import Target
from zonnx.errors import UnsupportedModelError

logger = logging.getLogger(__name__)

#: Below this NPU share of MACs the partition is reported as low coverage.
LOW_SHARE = 0.5

_QUANT_RULES = ("dtype", "scale", "zero_point", "granularity")


class LowCoverageError(UnsupportedModelError):
    """Strict mode: the NPU would run no node or a small share of the model's MACs."""


def quant_summary(target: Target) -> str:
    """What the target's quantization is, in a few words: 'power-of-two per-tensor int8'."""
    q = target.quant
    words = ["power-of-two" if q.power_of_two else "float-scale"]
    words.append("symmetric" if q.activation_symmetric else "asymmetric")
    words.append(q.activation_granularity.replace("_", "-"))
    words.append("/".join(q.activation_dtypes))
    return " ".join(words)


def _fix(rule: str, target: Target) -> str:
    name = target.name
    if rule in _QUANT_RULES or rule == "not_quantized":
        return (
            f"{name} takes {quant_summary(target)} activations: quantize the float model for it with "
            f"`zonnx quantize MODEL OUT --calib DATA --target {name}` "
            f"(or quantize_static(..., extra_options={{'Target': '{name}'}}))"
        )
    if rule == "dynamic_shape":
        return (
            "give the inputs fixed shapes: `zonnx compile MODEL --input-shape NAME:1,3,224,224` (the "
            "provider option input_shapes, or `zonnx convert --input-shape` before quantizing)"
        )
    if rule == "min_nodes":
        return "lower --min-nodes (provider option min_nodes) or --min-macs (min_macs)"
    if rule == "compile":
        return "the compiler refused the subgraph; see the reason above and report it if the op is listed"
    return (
        f"{name} has no NPU kernel for these nodes (see `zonnx inspect --target {name}`); they run on the CPU"
    )


def coverage_advice(part: Partition, capability: CapabilityResult, target: Target) -> str:
    """The warning text when the NPU gets no node or less than ``LOW_SHARE`` of the MACs, else ''."""
    share = (
        part.mac_share if part.total_macs else (part.npu_nodes / part.total_nodes if part.total_nodes else 1)
    )
    if part.npu_nodes and share >= LOW_SHARE:
        return ""
    macs: Counter[str] = Counter()
    nodes: Counter[str] = Counter()
    example: dict[str, str] = {}
    for name, reason in part.cpu_nodes.items():
        rule = part.rules.get(name, "")
        if rule == "boundary":
            continue
        verdict = capability.nodes.get(name)
        macs[rule] += (verdict.macs or 0) if verdict is not None else 0
        nodes[rule] += 1
        if not reason.startswith("in the group of"):
            example.setdefault(rule, reason)
        example.setdefault("~" + rule, reason)
    if not nodes:
        return ""
    cause = max(nodes, key=lambda r: (macs[r], nodes[r]))
    where = f"{100 * share:.1f}% of MACs" if part.total_macs else f"{100 * share:.1f}% of nodes"
    return (
        f"{target.name}: only {part.npu_nodes} of {part.total_nodes} nodes ({where}) run on the NPU. "
        f"Cause: rule {cause!r} keeps {nodes[cause]} node(s) on the CPU, e.g. "
        f"{example.get(cause, example['~' + cause])}. "
        f"Fix: {_fix(cause, target)}."
    )


def dynamic_advice(part: Partition, capability: CapabilityResult) -> str:
    """'N nodes (K MACs) stay on the CPU because their shapes are not static ...; fix: ...', or ''."""
    names = [n for n, r in part.rules.items() if r == "dynamic_shape"]
    if not names:
        return ""
    macs = sum((capability.nodes[n].macs or 0) for n in names if n in capability.nodes)
    return (
        f"{len(names)} node(s) ({macs:,} MACs) stay on the CPU because their shapes are not static, e.g. "
        f"{part.cpu_nodes[names[0]]}. Fix: give the inputs fixed shapes with `zonnx compile MODEL "
        "--input-shape NAME:DIMS` (shape arithmetic is then folded) or provider option input_shapes"
    )


def check_coverage(advice: str, where: str, *, strict: bool = False) -> None:
    """Warn with ``advice`` (a ``coverage_advice`` text); raise ``LowCoverageError`` instead when ``strict``."""
    if not advice:
        return
    if strict:
        raise LowCoverageError(f"{where}: {advice} (strict mode: low NPU coverage is an error)")
    logger.warning("%s: %s", where, advice)
