"""What is known about values before running anything: constants, element types and dims."""

from __future__ import annotations

__all__ = ["ONNX_DOMAINS", "Dims", "StaticInfo", "constant_array", "describe", "is_constant"]

import dataclasses
import math

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes.common import _c_api_utils

from zonnx.passes.common.fold_evaluate import warn_once

ONNX_DOMAINS = ("", "ai.onnx")


def describe(node: ir.Node) -> str:
    """How messages name a node: op and name, or op and first output when the node is unnamed."""
    return f"{node.op_type} {node.name!r}" if node.name else f"{node.op_type} -> {node.outputs[0].name!r}"


def is_constant(value: ir.Value | None) -> bool:
    """A value is constant when it is an initializer that is not a graph input, or a Constant's output."""
    if value is None or value.is_graph_input():
        return False
    if value.is_initializer():
        return value.const_value is not None
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant" and producer.domain in ONNX_DOMAINS


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """Return the numpy value of a constant (see ``is_constant``), else None."""
    if not is_constant(value):
        return None
    assert value is not None
    try:
        tensor = value.const_value if value.is_initializer() else ir.convenience.get_const_tensor(value)
    except ValueError:  # malformed Constant node (several attributes, sparse value)
        return None
    return None if tensor is None else np.asarray(tensor.numpy())


Dims = tuple[int | str | None, ...]


def _dims_of_shape(shape: ir.Shape | None) -> Dims | None:
    if shape is None:
        return None
    return tuple((d if d >= 0 else None) if isinstance(d, int) else (d.value or None) for d in shape)


def _merge_dims(a: Dims | None, b: Dims | None) -> Dims | None:
    """Per dimension prefer a static int, then a symbol; ranks that disagree keep ``a``."""
    if a is None or b is None or len(a) != len(b):
        return a if a is not None else b
    return tuple(
        x if isinstance(x, int) or not isinstance(y, int) and x is not None else y
        for x, y in zip(a, b, strict=True)
    )


def _stub_big_constants(model: ir.Model) -> list[tuple[ir.Node, ir.Attr]]:
    """Swap large Constant values for data-less stubs (inference needs only type and dims); return the
    originals so the caller can put them back. Serializing the weights would dominate the cost."""
    swapped = []
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        attr = node.attributes.get("value")
        if (
            node.op_type != "Constant"
            or attr is None
            or attr.is_ref()
            or attr.type != ir.AttributeType.TENSOR
        ):
            continue
        tensor = attr.value  # not as_tensor(): its protocol check costs more than the whole stubbing
        if tensor.dtype == ir.DataType.STRING:
            continue
        nbytes = math.prod(tensor.shape.numpy()) * tensor.dtype.itemsize
        if nbytes > 1024:
            stub = ir.ExternalTensor("stub", 0, int(nbytes), tensor.dtype, shape=tensor.shape, name="stub")
            node.attributes["value"] = ir.Attr("value", ir.AttributeType.TENSOR, stub)
            swapped.append((node, attr))
    return swapped


@dataclasses.dataclass
class StaticInfo:
    """Element type and dims of values: constants, then IR annotations merged with onnx shape inference.

    Inference runs once on a copy (large initializers left out); the model is not changed. Only values
    of the main graph get inferred facts; subgraph values use their annotations.
    """

    dtypes: dict[ir.Value, ir.DataType] = dataclasses.field(default_factory=dict)
    dims_by_value: dict[ir.Value, Dims] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, model: ir.Model) -> StaticInfo:
        info = cls()
        swapped = _stub_big_constants(model)
        try:
            proto = _c_api_utils.call_onnx_api(
                lambda p: onnx.shape_inference.infer_shapes(p, strict_mode=False, data_prop=True), model
            )
        except Exception as e:  # onnx raises several types on graphs it cannot type
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            warn_once(
                f"constant folding: onnx shape inference failed ({first}); Shape/Size/dims are folded "
                "from the model's own annotations only, so some stay unfolded"
            )
            return info
        finally:
            for node, attr in swapped:
                node.attributes["value"] = attr
        inferred: dict[str, tuple[int, Dims | None]] = {}
        for vi in [*proto.graph.input, *proto.graph.value_info, *proto.graph.output]:
            if not vi.type.HasField("tensor_type"):
                continue
            tt = vi.type.tensor_type
            dims = None
            if tt.HasField("shape"):
                dims = tuple(
                    d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or None)
                    for d in tt.shape.dim
                )
            inferred[vi.name] = (tt.elem_type, dims)
        for name, value in ir.convenience.create_value_mapping(model.graph, include_subgraphs=False).items():
            if name in inferred:
                elem, dims = inferred[name]
                if elem:
                    info.dtypes[value] = ir.DataType(elem)
                if dims is not None:
                    info.dims_by_value[value] = dims
        return info

    def dtype(self, value: ir.Value | None) -> ir.DataType | None:
        if value is None:
            return None
        if value.dtype is not None:
            return value.dtype
        if value.const_value is not None and value.is_initializer():
            return value.const_value.dtype
        return self.dtypes.get(value)

    def dims(self, value: ir.Value | None) -> Dims | None:
        """Dims (int, symbol name or None each) when the rank is known."""
        if value is None:
            return None
        if value.is_initializer() and value.const_value is not None and not value.is_graph_input():
            return tuple(value.const_value.shape)
        return _merge_dims(_dims_of_shape(value.shape), self.dims_by_value.get(value))

    def shape(self, value: ir.Value | None) -> tuple[int, ...] | None:
        """The fully static shape, or None when any dim is unknown."""
        dims = self.dims(value)
        if dims is None or not all(isinstance(d, int) for d in dims):
            return None
        return tuple(dims)  # type: ignore[arg-type]
