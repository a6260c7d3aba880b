"""Which tensor names a node reads, counting the outer-scope names its subgraphs (If/Loop/Scan bodies) use.

Rule. A node reads its explicit inputs and, for every graph attribute, each name a body node reads that
the body itself does not define (its inputs, initializers and node outputs), recursively. A graph's
initializer is *used* when a node reads it or it is a graph output; the others are dropped, so ORT has
nothing to warn about ("Removing initializer ... not used").
"""

from __future__ import annotations

__all__ = ["node_reads", "graph_reads", "drop_unused_initializers"]

import logging

import onnx

logger = logging.getLogger(__name__)


def _bodies(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    out = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            out.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            out.extend(attr.graphs)
    return out


def graph_reads(graph: onnx.GraphProto) -> set[str]:
    """Names ``graph``'s nodes read from outside it (the outer-scope names a body captures)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {o for n in graph.node for o in n.output}
    reads = {name for n in graph.node for name in node_reads(n)}
    reads |= {o.name for o in graph.output}
    return reads - defined - {""}


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Explicit inputs, then the outer-scope names of the node's subgraphs (no duplicates, no '')."""
    names = [i for i in node.input if i]
    for body in _bodies(node):
        names += sorted(graph_reads(body))
    return list(dict.fromkeys(names))


def drop_unused_initializers(graph: onnx.GraphProto) -> int:
    """Remove initializers no node reads (subgraphs included) and no output names; returns how many."""
    used = {name for n in graph.node for name in node_reads(n)} | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name in used]
    dropped = len(graph.initializer) - len(kept)
    if dropped:
        del graph.initializer[:]
        graph.initializer.extend(kept)
        logger.debug("dropped %d unused initializer(s)", dropped)
    return dropped
