"""Fresh names for values and nodes a rewrite adds to an onnx-ir graph.

Rule: a new name is the hint itself when nothing in the graph uses it, else ``hint_1``, ``hint_2``, ... the
first one free. "Used" covers graph inputs, initializers, every node output (subgraphs included) and every
node name, so a rewrite never gives two tensors one name and never renames what the user sees.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir

__all__ = ["NameSource", "graph_names"]


def graph_names(graph: ir.Graph) -> set[str]:
    """Every value name (inputs, initializers, node outputs, subgraphs too) and node name of ``graph``."""
    names = {name for name in ir.convenience.create_value_mapping(graph) if name}
    names |= {node.name for node in ir.traversal.RecursiveGraphIterator(graph) if node.name}
    return names


class NameSource:
    """Hands out names no one in the graph uses yet (module docstring), remembering each one given."""

    def __init__(self, taken: Iterable[str]) -> None:
        self.taken = set(taken)

    @classmethod
    def of(cls, graph: ir.Graph) -> NameSource:
        """A source for new names in ``graph``."""
        return cls(graph_names(graph))

    def fresh(self, hint: str) -> str:
        """``hint``, or ``hint_<i>`` for the first i that is free; the name is taken from then on."""
        name, i = hint, 0
        while name in self.taken:
            i += 1
            name = f"{hint}_{i}"
        self.taken.add(name)
        return name
