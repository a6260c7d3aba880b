"""Partitioning: claim maximal connected, convex groups of NPU-capable nodes as subgraphs; the rest is CPU.

Units. Each capability group (an op with its fused activation and output quantizers) is one unit; a
CPU boundary quantize is a unit of its own. Dequantizers and Constants are no unit: they are copied
into every part that reads them, so an edge runs from the unit producing a dequantizer's integer
input straight to the units reading its float output.

Growing. Units are visited in topological order; a supported unit starts a group and is merged with
the group of every supported unit it reads from, unless the merged set would not be *convex*: a path
that leaves it through another unit (a CPU node or another subgraph) and comes back in would make the
NPU and CPU parts depend on each other in a cycle. The check is a search from the set's outside
successors, bounded by the set's last topological position. Cost decides small groups: a group with
fewer than ``min_nodes`` ops (nodes other than quantizers and constants) goes back to the CPU with the
reason "subgraph of N ops and K MACs is below the minimum M ops / C MACs" unless it carries at least
``min_macs`` MACs (default ``MIN_MACS``, 1M: one large convolution is worth the round trip to the NPU;
0 turns the cost rule off).

Boundaries. An NPU subgraph reads and writes integer tensors: it contains the DequantizeLinear nodes of
its inputs and the QuantizeLinear nodes of its outputs, so ``inputs`` are QuantizeLinear outputs (the
integer codes; the CPU keeps the boundary quantize) and ``outputs`` are the integer codes its
QuantizeLinear nodes write (the CPU keeps the boundary dequantize, a copy when the NPU reads them too).
In the FixNeuron form, where one node quantizes and dequantizes, the FixNeuron on an output belongs to
the producing subgraph and a boundary tensor is its float output, exact on the integer grid; a FixNeuron
on a graph input is copied into its readers, so that input enters as the float tensor before it.
Constants (weights, scales) are not inputs. A dequantizer read by several parts appears in each.
"""

from __future__ import annotations

__all__ = ["Subgraph", "Partition", "partition", "MIN_MACS"]

import dataclasses
import logging
from collections.abc import Iterable

import onnx_ir as ir

from zonnx.backend.partition.capability import CapabilityResult, node_keys
from zonnx.errors import OptionError
from zonnx.passes.fusion.matching import const_array

logger = logging.getLogger(__name__)

_COPIED = ("dequantize", "constant")
#: A group this costly goes to the NPU however few ops it has.
MIN_MACS = 1_000_000
CPU = -1


@dataclasses.dataclass
class Subgraph:
    """One NPU subgraph: nodes in topological order, boundary tensors, ops (non-quantizer nodes), MACs."""

    id: int
    node_names: list[str]
    inputs: list[str]
    outputs: list[str]
    macs: int
    ops: int = 0


@dataclasses.dataclass
class Partition:
    """Subgraphs, the reason for every CPU node, and summary numbers.

    A copied dequantizer counts as one node, on the NPU when every reader is there. ``rules`` gives
    each CPU node's rule id (op_type, kernel, not_quantized, min_nodes, boundary, ...). ``advice`` is
    the low-coverage warning (``coverage.coverage_advice``), empty when the NPU share is fine.
    """

    target: str
    subgraphs: list[Subgraph]
    cpu_nodes: dict[str, str]
    rules: dict[str, str]
    total_nodes: int
    npu_nodes: int
    total_ops: int
    npu_ops: int
    total_macs: int
    npu_macs: int
    min_nodes: int
    min_macs: int = MIN_MACS
    advice: str = ""

    @property
    def num_subgraphs(self) -> int:
        return len(self.subgraphs)

    @property
    def mac_share(self) -> float:
        """Share of the known MACs that run on the NPU (0 when the model has none)."""
        return self.npu_macs / self.total_macs if self.total_macs else 0.0

    def subgraph_of(self, node: str) -> list[int]:
        """Ids of the subgraphs holding ``node`` (several for a copied dequantizer)."""
        return [s.id for s in self.subgraphs if node in s.node_names]


class _Groups:
    """Union-find over units with the convexity check."""

    def __init__(self, succ: dict[str, set[str]], position: dict[str, int]) -> None:
        self.succ, self.position = succ, position
        self.parent: dict[str, str] = {}
        self.members: dict[str, set[str]] = {}

    def add(self, unit: str) -> None:
        self.parent[unit] = unit
        self.members[unit] = {unit}

    def find(self, unit: str) -> str:
        while self.parent[unit] != unit:
            self.parent[unit] = self.parent[self.parent[unit]]
            unit = self.parent[unit]
        return unit

    def convex(self, units: set[str]) -> bool:
        """No path leaves ``units`` and comes back in."""
        last = max(self.position[u] for u in units)
        stack = [s for u in units for s in self.succ[u] if s not in units]
        seen: set[str] = set()
        while stack:
            unit = stack.pop()
            if unit in seen or self.position[unit] > last:
                continue
            seen.add(unit)
            for nxt in self.succ[unit]:
                if nxt in units:
                    return False
                stack.append(nxt)
        return True

    def try_merge(self, a: str, b: str) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return True
        merged = self.members[ra] | self.members[rb]
        if not self.convex(merged):
            return False
        self.parent[rb] = ra
        self.members[ra] = merged
        del self.members[rb]
        return True


def _check(
    model: ir.Model, capability: CapabilityResult, min_nodes: int, min_macs: int
) -> dict[ir.Node, str]:
    if min_nodes < 1:
        raise OptionError(f"min_nodes: must be at least 1, got {min_nodes}.")
    if min_macs < 0:
        raise OptionError(f"min_macs: must be 0 or more, got {min_macs}.")
    keys = node_keys(model.graph)
    missing = [k for k in keys.values() if k not in capability.nodes]
    if missing:
        raise OptionError(
            f"the capability result does not describe node {missing[0]!r} (and {len(missing) - 1} more); "
            "run propose() on this same model."
        )
    return keys


def partition(
    model: ir.Model, capability: CapabilityResult, *, min_nodes: int = 2, min_macs: int = MIN_MACS
) -> Partition:
    """Group the nodes ``capability`` proposed into NPU subgraphs (see the module doc); ``model`` is unchanged."""
    keys = _check(model, capability, min_nodes, min_macs)
    verdict = {node: capability.nodes[key] for node, key in keys.items()}
    order = {key: i for i, key in enumerate(capability.nodes)}
    nodes = sorted(keys, key=lambda n: order[keys[n]])
    unit_of = {n: verdict[n].group or keys[n] for n in nodes if verdict[n].role not in _COPIED}

    def sources(value: ir.Value | None, depth: int = 0) -> Iterable[str]:
        prod = value.producer() if value is not None else None
        if prod is None or depth > 8:
            return
        if prod in unit_of:
            yield unit_of[prod]
        else:
            for v in prod.inputs:
                yield from sources(v, depth + 1)

    units = list(dict.fromkeys(unit_of[n] for n in nodes if n in unit_of))
    position = {u: i for i, u in enumerate(units)}
    succ: dict[str, set[str]] = {u: set() for u in units}
    pred: dict[str, set[str]] = {u: set() for u in units}
    for node, unit in unit_of.items():
        for value in node.inputs:
            for src in sources(value):
                if src != unit:
                    succ[src].add(unit)
                    pred[unit].add(src)
    ok = {unit_of[n]: verdict[n].supported for n in unit_of}
    groups = _Groups(succ, position)
    for unit in units:
        if not ok[unit]:
            continue
        groups.add(unit)
        for src in sorted(pred[unit], key=position.__getitem__, reverse=True):
            if ok[src]:
                groups.try_merge(src, unit)

    # min_nodes, then subgraph ids in topological order of their first unit
    is_op = {n: verdict[n].role in ("op", "activation") for n in nodes}
    unit_ops = {u: 0 for u in units}
    unit_macs = {u: 0 for u in units}
    for node, unit in unit_of.items():
        unit_ops[unit] += is_op[node]
        unit_macs[unit] += verdict[node].macs or 0
    part: dict[str, int] = {u: CPU for u in units}
    reasons: dict[str, tuple[str, str]] = {}
    roots = sorted(groups.members, key=lambda r: min(position[u] for u in groups.members[r]))
    next_id = 0
    for root in roots:
        n_ops = sum(unit_ops[u] for u in groups.members[root])
        n_macs = sum(unit_macs[u] for u in groups.members[root])
        if n_ops < min_nodes and not (min_macs and n_macs >= min_macs):
            for u in groups.members[root]:
                reasons[u] = (
                    "min_nodes",
                    f"subgraph of {n_ops} ops and {n_macs:,} MACs is below the minimum {min_nodes} ops / "
                    f"{min_macs:,} MACs",
                )
            continue
        for u in groups.members[root]:
            part[u] = next_id
        next_id += 1

    def parts_of(node: ir.Node, depth: int = 0) -> set[int]:
        if node in unit_of:
            return {part[unit_of[node]]}
        found: set[int] = set()
        for value in node.outputs:
            if value.is_graph_output():
                found.add(CPU)
            for reader in value.consumers():
                if reader.graph is not model.graph:  # read inside an If/Loop body: the CPU node owns it
                    found.add(CPU)
                    continue
                found |= parts_of(reader, depth + 1) if depth < 8 else {CPU}
        return found

    placed = {n: parts_of(n) for n in nodes}
    result = _assemble(model, capability, keys, nodes, placed, unit_of, reasons, next_id, min_nodes, is_op)
    result.min_macs = min_macs
    return result


def _assemble(model, capability, keys, nodes, placed, unit_of, reasons, count, min_nodes, is_op) -> Partition:
    """Subgraph node lists, boundary tensors and MACs; CPU reasons; summary numbers."""
    verdict = {n: capability.nodes[keys[n]] for n in nodes}
    members: list[list[ir.Node]] = [[] for _ in range(count)]
    cpu_nodes: dict[str, str] = {}
    rules: dict[str, str] = {}
    for node in nodes:
        v = verdict[node]
        npu = sorted(p for p in placed[node] if p != CPU)
        for p in npu:
            members[p].append(node)
        if CPU in placed[node] or not placed[node]:
            if node in unit_of and unit_of[node] in reasons:
                rules[keys[node]], cpu_nodes[keys[node]] = reasons[unit_of[node]]
            elif not v.supported:
                rules[keys[node]], cpu_nodes[keys[node]] = v.rule or "unsupported", v.reason
            elif v.role in ("dequantize", "constant"):
                readers = "no reader" if not placed[node] else "a reader on the CPU"
                also = f" (a copy also runs in subgraph {', '.join(map(str, npu))})" if npu else ""
                rules[keys[node]] = "boundary"
                cpu_nodes[keys[node]] = (
                    f"boundary {v.role}: {node.op_type} {keys[node]!r} has {readers}{also}"
                )
            else:
                rules[keys[node]], cpu_nodes[keys[node]] = "unsupported", v.reason
    subgraphs = []
    for i, group in enumerate(members):
        inside = set(group)
        inputs: list[str] = []
        outputs: list[str] = []
        for node in group:
            for value in node.inputs:
                if value is None or not value.name or const_array(value) is not None:
                    continue
                prod = value.producer()
                if (prod is None or prod not in inside) and value.name not in inputs:
                    inputs.append(value.name)
            if node not in unit_of:
                continue  # a copy: each part reads its own
            for value in node.outputs:
                leaves = value.is_graph_output() or any(
                    (placed.get(c, {CPU}) - {i}) if c not in unit_of else placed[c] != {i}
                    for c in value.consumers()
                )
                if leaves and value.name and value.name not in outputs:
                    outputs.append(value.name)
        macs = sum(verdict[n].macs or 0 for n in group)
        ops = sum(is_op[n] for n in group)
        subgraphs.append(Subgraph(i, [keys[n] for n in group], inputs, outputs, macs, ops))
    on_npu = [n for n in nodes if placed[n] and CPU not in placed[n]]
    result = Partition(
        target=capability.target,
        subgraphs=subgraphs,
        cpu_nodes=cpu_nodes,
        rules=rules,
        total_nodes=len(nodes),
        npu_nodes=len(on_npu),
        total_ops=sum(is_op.values()),
        npu_ops=sum(s.ops for s in subgraphs),
        total_macs=sum(verdict[n].macs or 0 for n in nodes),
        npu_macs=sum(s.macs for s in subgraphs),
        min_nodes=min_nodes,
    )
    logger.info(
        "%s: %d subgraphs, %d/%d nodes and %.1f%% of MACs on the NPU",
        result.target, result.num_subgraphs, result.npu_nodes, result.total_nodes, 100 * result.mac_share,
    )  # fmt: skip
    return result
