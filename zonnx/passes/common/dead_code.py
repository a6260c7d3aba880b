"""Remove what no graph output depends on: nodes, initializers, functions, opset imports, duplicate weights."""

from __future__ import annotations

__all__ = ["DeadCodeEliminationPass"]

import hashlib
import logging
from collections import Counter

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedFunctionsPass, RemoveUnusedOpsetsPass

from zonnx.passes.base import Changes, ZonnxPass

logger = logging.getLogger(__name__)


def _is_live(node: ir.Node, outputs: frozenset[ir.Value]) -> bool:
    return any(o in outputs or o.uses() for o in node.outputs)


def _drop_node(graph: ir.Graph | ir.Function, node: ir.Node) -> int:
    """Remove ``node`` and everything inside its subgraphs (so they stop using outer values)."""
    count = 1
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            subgraphs = [attr.as_graph()]
        elif attr.type == ir.AttributeType.GRAPHS:
            subgraphs = list(attr.as_graphs())
        else:
            continue
        for sub in subgraphs:
            for inner in reversed(list(sub)):
                count += _drop_node(sub, inner)
    for i in range(len(node.inputs)):
        node.replace_input_with(i, None)
    graph.remove(node)
    return count


def _remove_dead_nodes(graph: ir.Graph | ir.Function) -> int:
    """Remove nodes none of whose outputs reach a graph output, recursing into live nodes' subgraphs.

    Walking backwards, a node's users are visited before the node, so chains die in one sweep; a live
    node's subgraphs are cleaned before the nodes producing the outer values they use are judged.
    """
    outputs = frozenset(graph.outputs)
    count = 0
    for node in reversed(list(graph)):
        if not _is_live(node, outputs):
            count += _drop_node(graph, node)
            continue
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                count += _remove_dead_nodes(attr.as_graph())
            elif attr.type == ir.AttributeType.GRAPHS:
                count += sum(_remove_dead_nodes(g) for g in attr.as_graphs())
    return count


def _remove_unused_initializers(graph: ir.Graph) -> int:
    """Drop initializers nothing uses; one that is also a graph input or output is part of the signature."""
    unused = [
        v for v in graph.initializers.values() if not (v.uses() or v.is_graph_input() or v.is_graph_output())
    ]
    for value in unused:
        graph.initializers.pop(value.name)  # type: ignore[arg-type]
    return len(unused)


def _tensor_bytes(tensor: ir.TensorProtocol) -> bytes:
    if tensor.dtype != ir.DataType.STRING:
        return tensor.tobytes()
    strings = tensor.string_data()  # type: ignore[attr-defined]
    return b"".join(len(s).to_bytes(8, "little") + s for s in strings)


def _sketch(tensor: ir.TensorProtocol) -> bytes:
    """256 evenly spaced bytes of the tensor: equal tensors have equal sketches."""
    data = _tensor_bytes(tensor)
    return data[:: max(1, len(data) // 256)]


def _dedupe_initializers(graph: ir.Graph) -> int:
    """Point users of an initializer at an earlier one with the same dtype, shape and bytes; drop it."""
    seen: dict[tuple, ir.Value] = {}
    count = 0
    candidates = [
        v
        for v in graph.initializers.values()
        if v.const_value is not None and not v.is_graph_input() and not v.is_graph_output()
    ]
    # only tensors sharing dtype, shape and a sketch (256 evenly spaced bytes) with another can be
    # duplicates: the others are never hashed
    kinds = Counter((v.const_value.dtype, tuple(v.const_value.shape)) for v in candidates)
    sketches = {
        id(v): _sketch(v.const_value)
        for v in candidates
        if kinds[(v.const_value.dtype, tuple(v.const_value.shape))] > 1
    }
    alike = Counter(
        (v.const_value.dtype, tuple(v.const_value.shape), sketches[id(v)])
        for v in candidates
        if id(v) in sketches
    )
    for value in candidates:
        tensor = value.const_value
        if id(value) not in sketches or alike[(tensor.dtype, tuple(tensor.shape), sketches[id(value)])] < 2:
            continue
        data = _tensor_bytes(tensor)
        key = (tensor.dtype, tuple(tensor.shape), hashlib.sha256(data).digest())
        kept = seen.setdefault(key, value)
        if kept is value:
            continue
        value.replace_all_uses_with(kept)
        graph.initializers.pop(value.name)  # type: ignore[arg-type]
        count += 1
    return count


class DeadCodeEliminationPass(ZonnxPass):
    """Remove nodes no graph output depends on (also in subgraphs and functions), unused initializers,
    unused functions and opset imports, and initializers that duplicate another one byte for byte.

    The model's inputs and outputs are untouched. Counts: ``removed unused node``, ``removed unused
    initializer``, ``merged duplicate initializer``, ``removed unused function``, ``removed unused opset
    import``.
    """

    name = "dead-code"

    def apply(self, model: ir.Model) -> Changes:
        changes = Changes()
        changes.add("removed unused node", _remove_dead_nodes(model.graph))
        for function in model.functions.values():
            changes.add("removed unused node", _remove_dead_nodes(function))
        graphs = list(model.graphs())  # after node removal: subgraphs of removed nodes are gone
        changes.add("removed unused initializer", sum(_remove_unused_initializers(g) for g in graphs))
        changes.add("merged duplicate initializer", sum(_dedupe_initializers(g) for g in graphs))

        functions_before = len(model.functions)
        RemoveUnusedFunctionsPass()(model)
        changes.add("removed unused function", functions_before - len(model.functions))

        def n_imports() -> int:
            return len(model.opset_imports) + sum(len(f.opset_imports) for f in model.functions.values())

        imports_before = n_imports()
        RemoveUnusedOpsetsPass()(model)
        changes.add("removed unused opset import", imports_before - n_imports())
        return changes
