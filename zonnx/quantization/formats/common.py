"""Graph surgery shared by the writers: find values, add initializers, put a quantizer on a value."""

from __future__ import annotations

__all__ = ["ValueIndex", "add_initializer", "insert_on_value", "ensure_opset", "consumer_nodes"]

from collections.abc import Callable

import numpy as np
import onnx_ir as ir


class ValueIndex:
    """Name -> value for graph inputs, initializers and node outputs of the main graph."""

    def __init__(self, graph: ir.Graph) -> None:
        self.graph = graph
        self._values: dict[str, ir.Value] = {}
        for v in graph.inputs:
            self._values[v.name] = v
        for name, v in graph.initializers.items():
            self._values[name] = v
        for node in graph:
            for out in node.outputs:
                self._values[out.name] = out
        self._used = set(self._values) | {n.name for n in graph if n.name}

    def __getitem__(self, name: str) -> ir.Value:
        return self._values[name]

    def __contains__(self, name: str) -> bool:
        return name in self._values

    def unique(self, base: str) -> str:
        """A value/node name not used yet in the graph, starting from ``base``."""
        name, i = base, 1
        while name in self._used:
            name, i = f"{base}_{i}", i + 1
        self._used.add(name)
        return name


def add_initializer(
    graph: ir.Graph, index: ValueIndex, base: str, array: np.ndarray, dtype: ir.DataType | None = None
) -> ir.Value:
    """Register a new initializer named after ``base`` and return its value."""
    name = index.unique(base)
    tensor = ir.tensor(array, dtype=dtype, name=name)
    value = ir.Value(
        name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor
    )
    graph.register_initializer(value)
    return value


def insert_on_value(
    graph: ir.Graph,
    value: ir.Value,
    build: Callable[[ir.Value], tuple[list[ir.Node], ir.Value]],
    consumers: list[ir.Node] | None = None,
) -> ir.Value:
    """Insert nodes computing ``new = f(value)`` and make consumers read ``new`` instead of ``value``.

    ``consumers`` None means every consumer, including graph outputs; a graph output keeps its name
    (the original value is renamed ``<name>_QuantizeLinear_Input``, as ORT names it). The new nodes go right after the producer
    (or at the start for graph inputs and initializers).
    """
    targets = [u for u in value.uses() if consumers is None or u.node in consumers]
    nodes, new = build(value)
    is_output = consumers is None and value.is_graph_output()
    producer = value.producer()
    if producer is not None:
        graph.insert_after(producer, nodes)
    elif len(graph) > 0:
        graph.insert_before(next(iter(graph)), nodes)
    else:
        graph.extend(nodes)
    for use in targets:
        if use.node in nodes:
            continue
        use.node.replace_input_with(use.idx, new)
    if is_output:
        original = value.name
        value.name = f"{original}_QuantizeLinear_Input"  # ORT's name (its qdq_loss_debug reads it)
        graph.outputs[:] = [new if o is value else o for o in graph.outputs]
        new.name = original
        new.type, new.shape = value.type, value.shape
    return new


def consumer_nodes(value: ir.Value, names: frozenset[str] | None) -> list[ir.Node] | None:
    """The readers of ``value`` named in ``names`` (None: every reader, as ``insert_on_value`` takes it)."""
    if names is None:
        return None
    return [use.node for use in value.uses() if use.node.name in names]


def ensure_opset(model: ir.Model, domain: str, version: int) -> None:
    """Import ``domain`` at ``version`` at least."""
    if model.opset_imports.get(domain, 0) < version:
        model.opset_imports[domain] = version
        model.graph.opset_imports[domain] = version
