"""Control flow and the quantizer: nodes inside If/Loop/Scan bodies are not quantized, and the user is told.

Rule. zonnx annotates the main graph only. For every main-graph node with graph attributes, the nodes of
its bodies (recursively) stay float: one warning names the node, its op type and how many body nodes
stay float, so a model with control flow is never quantized partly without a word. Values that a body
reads from the outer scope are quantized like any other tensor of the main graph.
"""

from __future__ import annotations

__all__ = ["body_node_count", "warn_control_flow"]

import logging

import onnx_ir as ir

logger = logging.getLogger(__name__)


def body_node_count(node: ir.Node) -> int:
    """Nodes in ``node``'s graph attributes, nested bodies included."""
    count = 0
    for attr in node.attributes.values():
        graphs = []
        if attr.type == ir.AttributeType.GRAPH:
            graphs = [attr.value]
        elif attr.type == ir.AttributeType.GRAPHS:
            graphs = list(attr.value)
        for g in graphs:
            for inner in g:
                count += 1 + body_node_count(inner)
    return count


def warn_control_flow(model: ir.Model) -> int:
    """Warn once per main-graph node whose bodies hold nodes; returns how many body nodes stay float."""
    total = 0
    for node in model.graph:
        inside = body_node_count(node)
        if inside:
            total += inside
            logger.warning(
                "%s %r: its %d subgraph node(s) are not quantized (zonnx quantizes the main graph only); "
                "they run in float on the CPU. Inline the branch (e.g. export with fixed control flow) "
                "to quantize them.",
                node.op_type,
                node.name or node.outputs[0].name,
                inside,
            )
    return total
