"""Static dims and MAC counts of a model's values, from onnx shape inference on a weight-free copy."""

from __future__ import annotations

__all__ = ["ShapeTable"]

import dataclasses
import logging
from collections import ChainMap
from collections.abc import Mapping, Sequence

import onnx_ir as ir

from zonnx.inspection.macs import MAC_OPS, fix_input_shapes, node_macs
from zonnx.inspection.shapes import ValueType, infer, shape_skeleton, value_types

logger = logging.getLogger(__name__)

Dims = tuple[int | str | None, ...]


def _ir_dims(value: ir.Value) -> Dims | None:
    if value.shape is None:
        return None
    return tuple(
        (d if d >= 0 else None)
        if isinstance(d, int)
        else (d.value if isinstance(d, ir.SymbolicDim) else None)
        for d in value.shape
    )


@dataclasses.dataclass
class ShapeTable:
    """Dims per value name (the model's own when fully known, else inferred) and the inference notes.

    The model is never modified: inference runs on a serialized skeleton whose graph-input dims were
    fixed (``zonnx.inspection.macs.fix_input_shapes``: a symbolic leading dim becomes 1, ``input_shapes``
    sets whole inputs).
    """

    types: dict[str, ValueType]
    own: dict[str, Dims | None]
    notes: list[str]

    @classmethod
    def build(cls, model: ir.Model, input_shapes: Mapping[str, Sequence[int]] | None = None) -> ShapeTable:
        skeleton = shape_skeleton(ir.serde.serialize_model(model))
        fixed, left = fix_input_shapes(skeleton, 1, input_shapes)
        notes = [f"input {f.input}[{f.axis}] ({f.symbol!r}) set to {f.value} ({f.source})" for f in fixed]
        notes += [f"input dim {d} is not a number (give input_shapes)" for d in left]
        # declared dims that are not numbers may be stale expressions of the input symbols: infer them again
        numeric = [
            vi
            for vi in skeleton.graph.value_info
            if all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)
        ]
        del skeleton.graph.value_info[:]
        skeleton.graph.value_info.extend(numeric)
        inferred, why = infer(skeleton)
        if inferred is None:
            notes.append(why)
        types = value_types(inferred if inferred is not None else skeleton)
        for note in notes:
            logger.info("shapes: %s", note)
        return cls(types, {v.name: _ir_dims(v) for v in _values(model.graph) if v.name}, notes)

    def dims(self, value: ir.Value | str) -> Dims | None:
        """Dims of a value: ints for known sizes, str for symbols, None for unknown dims."""
        name = value if isinstance(value, str) else value.name
        if name is None:
            return None
        own = self.own.get(name)
        if own is not None and all(isinstance(d, int) for d in own):
            return own
        vt = self.types.get(name)
        if vt is not None and vt.dims is not None:
            return tuple(d if isinstance(d, int) and d > 0 else (d or None) for d in vt.dims)
        return own

    def static(self, value: ir.Value | str) -> tuple[int, ...] | None:
        """Dims when every one is a number, else None."""
        dims = self.dims(value)
        return tuple(dims) if dims is not None and all(isinstance(d, int) for d in dims) else None  # type: ignore[arg-type]

    def macs(self, node: ir.Node) -> int | None:
        """MACs by ``zonnx.inspection.macs`` rules; None for other ops or unknown shapes."""
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if (domain, node.op_type) not in MAC_OPS:
            return None
        local: dict[str, ValueType] = {}
        for value in [*node.inputs, *node.outputs]:
            if value is not None and value.name and self.static(value) is not None:
                local[value.name] = ValueType(int(value.dtype or 1), self.static(value))  # type: ignore[arg-type]
        count, _why = node_macs(ir.serde.serialize_node(node), ChainMap(local, self.types))
        return count


def _values(graph: ir.Graph) -> list[ir.Value]:
    values = list(graph.inputs) + list(graph.initializers.values())
    values += [v for n in graph for v in n.outputs]
    return values
