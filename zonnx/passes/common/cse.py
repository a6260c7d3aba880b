"""Merge nodes that compute the same thing: same op, domain, attributes and the very same inputs."""

from __future__ import annotations

__all__ = ["CommonSubexpressionPass"]

import hashlib
import logging
from collections.abc import Hashable

import onnx_ir as ir

from zonnx.passes.base import Changes, ZonnxPass

logger = logging.getLogger(__name__)

#: Ops whose two calls on the same inputs may differ: never merged.
_NON_DETERMINISTIC = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "Dropout",
    }
)
#: Custom domains may hold stateful or random kernels: only standard ops are merged.
_STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})
_SUBGRAPH = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def _tensor_key(tensor: ir.TensorProtocol) -> Hashable:
    if tensor.dtype == ir.DataType.STRING:
        data = b"".join(len(s).to_bytes(8, "little") + s for s in tensor.string_data())  # type: ignore[attr-defined]
    else:
        data = tensor.tobytes()
    return (tensor.dtype, tuple(tensor.shape), hashlib.sha256(data).digest())


def _attr_key(attr: ir.Attr) -> Hashable:
    """A hashable form of an attribute; floats by bit pattern so 0.0 and -0.0 stay apart."""
    if attr.is_ref():
        return ("ref", attr.ref_attr_name)
    value, kind = attr.value, attr.type
    if kind == ir.AttributeType.FLOAT:
        return float(value).hex()
    if kind == ir.AttributeType.FLOATS:
        return tuple(float(v).hex() for v in value)
    if kind in (ir.AttributeType.INTS, ir.AttributeType.STRINGS):
        return tuple(value)
    if kind == ir.AttributeType.TENSOR:
        return _tensor_key(value)
    if kind == ir.AttributeType.TENSORS:
        return tuple(_tensor_key(t) for t in value)
    if kind in (ir.AttributeType.INT, ir.AttributeType.STRING):
        return value
    return str(value)  # type protos, sparse tensors


def _node_key(node: ir.Node) -> Hashable | None:
    """What makes two nodes interchangeable, or None when the node must never be merged."""
    if node.domain not in _STANDARD_DOMAINS or node.op_type in _NON_DETERMINISTIC:
        return None
    if any(a.type in _SUBGRAPH for a in node.attributes.values()):
        return None
    attrs = tuple(sorted((name, attr.type, _attr_key(attr)) for name, attr in node.attributes.items()))
    inputs = tuple(node.inputs)
    while inputs and inputs[-1] is None:  # trailing absent optional inputs mean nothing
        inputs = inputs[:-1]
    return (node.op_type, node.domain or "", node.overload, len(node.outputs), inputs, attrs)


def _replace_output(graph: ir.Graph, node: ir.Node, old: ir.Value, new: ir.Value) -> None:
    """Make users of ``old`` use ``new``; a graph output keeps its name (via an Identity if needed)."""
    if not new.name and old.name:  # the kept node omitted this optional output: let it produce it
        new.name = old.name
        old.name = None
    if not old.is_graph_output():
        old.replace_all_uses_with(new)
        return
    name = old.name or new.name
    producer = new.producer()
    if new.is_graph_output() or new.is_graph_input() or producer is None or producer.graph is not graph:
        identity = ir.node("Identity", inputs=[new])
        out = identity.outputs[0]
        out.type, out.shape = old.type, old.shape
        graph.insert_before(node, identity)
        old.replace_all_uses_with(out, replace_graph_outputs=True)
        old.name, out.name = None, name
        return
    if old.type is not None:
        new.type = old.type
    if old.shape is not None:
        new.shape = old.shape
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    old.name, new.name = None, name


def _merge_graph(graph: ir.Graph, changes: Changes) -> None:
    seen: dict[Hashable, ir.Node] = {}
    for node in list(graph):
        key = _node_key(node)
        if key is None:
            continue
        kept = seen.setdefault(key, node)
        if kept is node:
            continue
        for old, new in zip(node.outputs, kept.outputs, strict=True):
            _replace_output(graph, node, old, new)
        graph.remove(node, safe=True)
        changes.add(f"merged duplicate {node.op_type}")


class CommonSubexpressionPass(ZonnxPass):
    """Replace a node by an earlier node with the same op, domain, attributes and input values.

    Merging runs in topological order, so chains of duplicates collapse in one run. Never merged:
    random ops and Dropout, ops of custom domains, ops with subgraphs. Each graph (main and subgraphs)
    is handled on its own. A graph output keeps its name (an Identity is added when the kept value is
    itself a graph input or output). Counts: ``merged duplicate <op>``.
    """

    name = "cse"

    def apply(self, model: ir.Model) -> Changes:
        changes = Changes()
        for graph in list(model.graphs()):
            _merge_graph(graph, changes)
        return changes
