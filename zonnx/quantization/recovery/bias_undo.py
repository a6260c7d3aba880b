"""Undo for bias correction: the state of every bias it may rewrite, taken before it starts.

Rule: a correction that lowers the model's output SQNR on the very samples it was measured on is a
measured loss, so ``correct_biases`` puts the model back as it was (``BiasSnapshot.restore``) and says
so. What a correction touches, and so what the snapshot holds: each bias initializer's value, the
inputs of its quantizer nodes (a corrected bias read by other nodes too is stored under a new name and
rewired), their ``pos`` attributes and their scale / zero-point initializers (a power-of-two bias may be
given a wider position), and the quantizer's ``source``. Initializers the correction added and nothing
reads any more are removed.
"""

from __future__ import annotations

__all__ = ["BiasSnapshot"]

from collections.abc import Iterable
from typing import Any

import onnx_ir as ir

from zonnx.quantization.refine.positions import Quantizer


class BiasSnapshot:
    """What ``restore`` needs to put a set of biases and their quantizers back as they were."""

    def __init__(self, model: ir.Model, biases: Iterable[tuple[ir.Value, Quantizer | None]]) -> None:
        self.model = model
        self.initializers = set(model.graph.initializers)
        self.values: dict[ir.Value, Any] = {}
        self.inputs: dict[ir.Node, tuple[ir.Value | None, ...]] = {}
        self.positions: dict[ir.Node, int] = {}
        self.sources: list[tuple[Quantizer, ir.Value]] = []
        for value, quantizer in biases:
            self.values[value] = value.const_value
            if quantizer is not None:
                self._quantizer(quantizer)

    def _quantizer(self, q: Quantizer) -> None:
        self.sources.append((q, q.source))
        for node in q.nodes:
            self.inputs[node] = tuple(node.inputs)
            pos = node.attributes.get_int("pos")
            if pos is not None:
                self.positions[node] = pos
            for value in node.inputs[1:]:
                if value is not None and value.is_initializer():
                    self.values.setdefault(value, value.const_value)

    def restore(self) -> None:
        """Put every recorded value, input, position and source back; drop initializers nobody reads."""
        for value, tensor in self.values.items():
            value.const_value = tensor
        for node, inputs in self.inputs.items():
            for i, value in enumerate(inputs):
                if node.inputs[i] is not value:
                    node.replace_input_with(i, value)
        for node, pos in self.positions.items():
            node.attributes["pos"] = ir.AttrInt64("pos", pos)
        for q, source in self.sources:
            q.source = source
        graph = self.model.graph
        for name in set(graph.initializers) - self.initializers:
            if not graph.initializers[name].uses():
                graph.initializers.pop(name)
