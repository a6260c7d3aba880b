"""A partition for people (rich tables: summary, subgraphs, CPU nodes grouped by reason) and as JSON."""

from __future__ import annotations

__all__ = ["to_dict", "render_partition", "format_partition", "summary_line", "PARTITION_VERSION"]

import io
import logging
from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from zonnx.backend.partition.partitioner import Partition
from zonnx.inspection.render import PLAIN_BOX

logger = logging.getLogger(__name__)

#: Version of the JSON layout written by ``to_dict``.
PARTITION_VERSION = 1
#: CPU nodes listed per reason before "... and N more".
MAX_PER_REASON = 8


def to_dict(partition: Partition) -> dict[str, Any]:
    """Every number and name of ``partition`` as plain JSON types (stable keys, version 1)."""
    by_rule: dict[str, int] = defaultdict(int)
    for rule in partition.rules.values():
        by_rule[rule] += 1
    return {
        "version": PARTITION_VERSION,
        "target": partition.target,
        "min_nodes": partition.min_nodes,
        "min_macs": partition.min_macs,
        "advice": partition.advice,
        "summary": {
            "subgraphs": partition.num_subgraphs,
            "npu_nodes": partition.npu_nodes,
            "total_nodes": partition.total_nodes,
            "npu_ops": partition.npu_ops,
            "total_ops": partition.total_ops,
            "npu_macs": partition.npu_macs,
            "total_macs": partition.total_macs,
            "mac_share": round(partition.mac_share, 6),
            "cpu_by_rule": dict(sorted(by_rule.items())),
        },
        "subgraphs": [
            {
                "id": s.id,
                "nodes": list(s.node_names),
                "ops": s.ops,
                "inputs": list(s.inputs),
                "outputs": list(s.outputs),
                "macs": s.macs,
            }
            for s in partition.subgraphs
        ],
        "cpu_nodes": [
            {"node": name, "rule": partition.rules.get(name, ""), "reason": reason}
            for name, reason in partition.cpu_nodes.items()
        ],
    }


def summary_line(part: Partition) -> str:
    """'N of M nodes on the NPU (x% of MACs); K on CPU: rule n, ...'."""
    counts: dict[str, int] = {}
    for rule in part.rules.values():
        counts[rule] = counts.get(rule, 0) + 1
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"
    return (
        f"{part.npu_nodes} of {part.total_nodes} nodes on the NPU ({100 * part.mac_share:.1f}% of MACs) "
        f"in {part.num_subgraphs} subgraph(s); {len(part.cpu_nodes)} on CPU: {reasons}"
    )


def _headline(partition: Partition) -> str:
    share = f"{100 * partition.mac_share:.1f}%" if partition.total_macs else "n/a"
    return (
        f"[bold]{partition.target}[/]: {partition.num_subgraphs} NPU subgraph(s); "
        f"{partition.npu_nodes}/{partition.total_nodes} nodes ({partition.npu_ops}/{partition.total_ops} ops) "
        f"and {share} of {partition.total_macs:,} MACs on the NPU"
    )


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_partition(partition: Partition, console: Console | None = None, *, verbose: bool = True) -> None:
    """Print the summary line, then the subgraphs and the CPU nodes grouped by rule.

    ``verbose`` False (the CLI's default) fits a terminal: subgraphs with counts of boundary tensors,
    one row per rule with its count and one example reason, quantizer copies (rule ``boundary``) as one
    line; True lists tensor names and up to ``MAX_PER_REASON`` nodes per rule with their reasons.
    """
    console = console or Console()
    console.print(_headline(partition), soft_wrap=True)
    if partition.subgraphs:
        table = Table(box=PLAIN_BOX, title="NPU subgraphs", title_justify="left")
        for col, justify in (("id", "right"), ("nodes", "right"), ("ops", "right"), ("MACs", "right")):
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        table.add_column("inputs", justify="left" if verbose else "right")
        table.add_column("outputs", justify="left" if verbose else "right")
        for s in partition.subgraphs:
            io_cols = (
                (", ".join(s.inputs), ", ".join(s.outputs))
                if verbose
                else (str(len(s.inputs)), str(len(s.outputs)))
            )
            table.add_row(str(s.id), str(len(s.node_names)), str(s.ops), f"{s.macs:,}", *io_cols)
        console.print(table)
    if not partition.cpu_nodes:
        return
    groups: dict[str, list[str]] = defaultdict(list)
    for name in partition.cpu_nodes:
        groups[partition.rules.get(name, "")].append(name)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    if not verbose:
        table = Table(box=PLAIN_BOX, title="CPU nodes by rule", title_justify="left")
        table.add_column("rule")
        table.add_column("nodes", justify="right")
        table.add_column("example")
        limit = max(40, console.width - 30)
        for rule, names in ordered:
            if rule == "boundary":
                continue
            first = next(
                (n for n in names if not partition.cpu_nodes[n].startswith("in the group")), names[0]
            )
            table.add_row(rule, str(len(names)), _short(partition.cpu_nodes[first], limit))
        if table.row_count:
            console.print(table)
        if "boundary" in groups:
            console.print(
                f"{len(groups['boundary'])} quantize/dequantize node(s) stay with CPU readers (rule boundary); "
                "--verbose lists every CPU node, --json gives all of them",
                soft_wrap=True,
            )
        return
    table = Table(box=PLAIN_BOX, title="CPU nodes by rule", title_justify="left")
    table.add_column("rule")
    table.add_column("node")
    table.add_column("reason")
    for rule, names in ordered:
        for i, name in enumerate(names[:MAX_PER_REASON]):
            table.add_row(f"{rule} ({len(names)})" if i == 0 else "", name, partition.cpu_nodes[name])
        if len(names) > MAX_PER_REASON:
            table.add_row("", f"... and {len(names) - MAX_PER_REASON} more", "")
    console.print(table)


def format_partition(partition: Partition, width: int = 160) -> str:
    """``render_partition`` as plain text."""
    buffer = io.StringIO()
    render_partition(partition, Console(width=width, file=buffer, color_system=None))
    return buffer.getvalue()
