"""Triage a quantized model: which activation quantizers, left out, bring its outputs back to float.

A *site* is one activation quantizer of the quantized model, in topological order: a
QuantizeLinear -> DequantizeLinear pair, a VitisQuantizeLinear -> VitisDequantizeLinear pair, or a
FixNeuron node, on a non-constant tensor. Bypassing a site makes its readers take the unrounded value
(the float fall-back of that tensor; weights stay as they are).

Bisection (Compass's fake-quant debug scopes, done automatically):

1. Score the model with every site on (baseline) against float outputs with the metric (cosine by
   default). At or above the tolerance: nothing to do.
2. Keep only the first p sites on (the rest bypassed); the score falls as p grows, so a binary search
   finds the smallest p whose score is below the tolerance: site p is the first culprit (about
   log2(sites) runs).
3. Bypass the culprit for good and search again, until the model with the culprits bypassed meets the
   tolerance or ``max_culprits`` are found: the culprits are a small set whose float fall-back
   recovers the output.
4. For each culprit, the remedies tried on it alone (``triage_remedies``): float (the site bypassed),
   16 bits over the same range, and its range searched again on the triage samples; each scored on the
   full model with only that site changed, so the user sees which one recovers it and how much.

When even every activation quantizer bypassed misses the tolerance, the weights cause the loss (per-tensor
weights with very uneven channels, typically): triage says so with that score instead of bisecting.
"""

from __future__ import annotations

__all__ = ["Site", "TriageResult", "find_sites", "bypass", "triage"]

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from zonnx.errors import OptionError
from zonnx.metrics.evaluate import FloatReference
from zonnx.quantization.formats.remove_activations import METADATA_KEY as REMOVED_KEY
from zonnx.quantization.triage_remedies import REMEDIES, site_values, with_16_bits, with_range

logger = logging.getLogger(__name__)

_PAIRS = {"QuantizeLinear": "DequantizeLinear", "VitisQuantizeLinear": "VitisDequantizeLinear"}


@dataclasses.dataclass(frozen=True)
class Site:
    """An activation quantizer: ``tensor`` is rounded by ``nodes`` into ``output``."""

    index: int
    tensor: str
    output: str
    nodes: tuple[str, ...]


@dataclasses.dataclass
class TriageResult:
    """Baseline score, the culprits in the order found, and what bypassing each alone is worth."""

    metric: str
    tolerance: float
    sites: int
    baseline: float
    culprits: list[Site]
    recovered: float
    alone: dict[str, float]
    runs: int
    activations_off: float | None = None  # the score with every activation quantizer bypassed, when it misses
    #: Per culprit tensor, the score with each remedy tried on it alone (``triage_remedies.REMEDIES``).
    remedies: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)

    def best_remedy(self, tensor: str) -> str | None:
        """The remedy with the highest score for ``tensor``; among ties the cheapest (REMEDIES lists the
        dearest first)."""
        tried = self.remedies.get(tensor, {})
        if not tried:
            return None
        return max(tried, key=lambda r: (tried[r], REMEDIES.index(r)))

    @property
    def first(self) -> Site | None:
        return self.culprits[0] if self.culprits else None


def find_sites(model: onnx.ModelProto) -> list[Site]:
    """Every activation quantizer of ``model`` (main graph), in node order."""
    graph = model.graph
    consts = {t.name for t in graph.initializer} | {
        o for n in graph.node if n.op_type == "Constant" for o in n.output
    }
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for i in node.input:
            readers.setdefault(i, []).append(node)
    sites: list[Site] = []
    for node in graph.node:
        if not node.input or node.input[0] in consts:
            continue
        if node.op_type == "FixNeuron":
            sites.append(Site(len(sites), node.input[0], node.output[0], (node.name,)))
        elif node.op_type in _PAIRS:
            users = readers.get(node.output[0], [])
            if len(users) == 1 and users[0].op_type == _PAIRS[node.op_type]:
                sites.append(Site(len(sites), node.input[0], users[0].output[0], (node.name, users[0].name)))
    return sites


def _put_back_clipping(model: onnx.ModelProto, sites: Sequence[Site], swap: dict[str, str]) -> None:
    """A site whose quantizer also did a removed Relu/Clip's clipping (``remove_activations``) gets that
    Relu/Clip back on its float value, so bypassing the quantizer removes the rounding only."""
    meta = next((p.value for p in model.metadata_props if p.key == REMOVED_KEY), None)
    if not meta:
        return
    removed = json.loads(meta)
    for site in sites:
        if site.tensor not in removed:
            continue
        op, lo, hi = removed[site.tensor]
        clipped = f"{site.tensor}_clip_bypass"
        ins = [site.tensor]
        if op == "Clip":
            for bound, tag in ((lo, "min"), (hi, "max")):
                name = f"{clipped}_{tag}" if bound is not None else ""
                if bound is not None:
                    model.graph.initializer.append(
                        onnx.numpy_helper.from_array(np.array(bound, np.float32), name)
                    )
                ins.append(name)
        model.graph.node.append(onnx.helper.make_node(op, ins, [clipped]))
        swap[site.output] = clipped


def _toposort(model: onnx.ModelProto) -> None:
    """Nodes in an order where every input is produced before it is read (appended nodes move up)."""
    graph = model.graph
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        ready = [n for n in pending if all(i in known for i in n.input)]
        if not ready:  # a cycle or an outer-scope name: keep the rest as it was
            ordered += pending
            break
        for n in ready:
            ordered.append(n)
            known.update(n.output)
        pending = [n for n in pending if n not in ready]
    del graph.node[:]
    graph.node.extend(ordered)


def bypass(model: onnx.ModelProto, sites: Sequence[Site]) -> onnx.ModelProto:
    """A copy of ``model`` whose readers of each site's output read the site's input instead."""
    if not sites:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    swap = {s.output: s.tensor for s in sites}
    _put_back_clipping(out, sites, swap)
    outputs = {o.name for o in out.graph.output}
    for node in out.graph.node:
        for i, name in enumerate(node.input):
            if name in swap:
                node.input[i] = swap[name]
    for site in sites:  # a graph output keeps its name: an Identity forwards the float value
        if site.output in outputs:
            keep = [n for n in out.graph.node if site.output not in n.output]
            del out.graph.node[:]
            out.graph.node.extend(keep)
            out.graph.node.append(onnx.helper.make_node("Identity", [swap[site.output]], [site.output]))
    _toposort(out)
    return out


def triage(
    float_model: Any,
    quant_model: onnx.ModelProto,
    feeds: Sequence[Mapping[str, np.ndarray]],
    *,
    metric: str = "cosine",
    tolerance: float = 0.99,
    max_culprits: int = 8,
    progress: Callable[[str], None] | None = None,
) -> TriageResult:
    """Run the bisection of the module docstring; ``float_model`` is a path or ModelProto."""
    if not feeds:
        raise OptionError("triage needs at least one input sample (--data).")
    sites = find_sites(quant_model)
    if not sites:
        raise OptionError("the quantized model has no activation quantizer (QuantizeLinear/DequantizeLinear "
                          "pairs or FixNeuron nodes): nothing to triage.")  # fmt: skip
    reference = FloatReference(
        float_model, feeds, metric, float_model if isinstance(float_model, str) else None
    )
    reference.require_higher_is_better("triage's tolerance")
    runs = 0

    def score(model: onnx.ModelProto) -> float:
        nonlocal runs
        runs += 1
        return reference.score(model)

    say = progress or (lambda _m: None)
    baseline = score(quant_model)
    say(f"baseline {metric} {baseline:.5f} with {len(sites)} activation quantizers")
    culprits: list[Site] = []
    current = baseline
    activations_off = None
    while current < tolerance and len(culprits) < max_culprits:
        off = set(culprits)
        low, high = 0, len(sites)  # prefix `low` meets the tolerance, prefix `high` misses it

        def with_prefix(p: int, off: set[Site] = off) -> float:
            return score(bypass(quant_model, [s for s in sites if s.index >= p or s in off]))

        everything_off = with_prefix(0)
        if everything_off < tolerance:
            activations_off = everything_off
            say(
                f"with every activation quantizer bypassed {metric} is {everything_off:.5f}: the weights cause the loss"
            )
            break
        while high - low > 1:
            mid = (low + high) // 2
            if with_prefix(mid) >= tolerance:
                low = mid
            else:
                high = mid
        culprit = sites[high - 1]
        culprits.append(culprit)
        current = score(bypass(quant_model, culprits))
        say(f"culprit {len(culprits)}: {culprit.tensor} -> {metric} {current:.5f} with it in float")
    alone = {c.tensor: score(bypass(quant_model, [c])) for c in culprits}
    remedies = {}
    for c in culprits:
        tried = {"float": alone[c.tensor]}
        wide = with_16_bits(quant_model, c.nodes)
        if wide is not None:
            tried["16-bit"] = score(wide)
        ranged = with_range(quant_model, c.nodes, site_values(quant_model, c.tensor, reference.feeds))
        if ranged is not None:
            tried["range"] = score(ranged)
        remedies[c.tensor] = tried
        say(f"remedies for {c.tensor}: " + ", ".join(f"{k} {v:.5f}" for k, v in tried.items()))
    return TriageResult(
        metric, tolerance, len(sites), baseline, culprits, current, alone, runs, activations_off, remedies
    )
