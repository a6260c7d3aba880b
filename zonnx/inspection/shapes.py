"""Graph walking, element types and value shapes from onnx shape inference on a weight-free model copy."""

from __future__ import annotations

__all__ = [
    "DEFAULT_DOMAINS",
    "INFERENCE_SYMBOL",
    "Dims",
    "ValueType",
    "dtype_name",
    "dtype_bits",
    "op_key",
    "iter_graphs",
    "iter_nodes",
    "value_types",
    "const_names",
    "shape_skeleton",
    "infer",
]

import dataclasses
import logging
import math
from collections.abc import Iterator

import onnx
import onnx.numpy_helper
import onnx.shape_inference

from zonnx.errors import first_line

logger = logging.getLogger(__name__)

DEFAULT_DOMAINS = ("", "ai.onnx")

#: Tensors above this many bytes are replaced by shape-only stubs in the copy given to shape inference.
_STUB_BYTES = 4096
_STUB_LOCATION = "zonnx-inspect-stub"
#: onnx shape inference names the dims it cannot compute 'unk__0', 'unk__1', ...
INFERENCE_SYMBOL = "unk__"

#: Dims of a value: int for a number, str for a symbolic name, None for a dim with neither.
Dims = tuple[int | str | None, ...]
_T = onnx.TensorProto
_BITS = {
    _T.FLOAT: 32, _T.UINT8: 8, _T.INT8: 8, _T.UINT16: 16, _T.INT16: 16, _T.INT32: 32, _T.INT64: 64,
    _T.BOOL: 8, _T.FLOAT16: 16, _T.DOUBLE: 64, _T.UINT32: 32, _T.UINT64: 64, _T.COMPLEX64: 64,
    _T.COMPLEX128: 128, _T.BFLOAT16: 16, _T.FLOAT8E4M3FN: 8, _T.FLOAT8E4M3FNUZ: 8, _T.FLOAT8E5M2: 8,
    _T.FLOAT8E5M2FNUZ: 8, _T.UINT4: 4, _T.INT4: 4, _T.FLOAT4E2M1: 4, _T.FLOAT8E8M0: 8, _T.UINT2: 2,
    _T.INT2: 2, _T.FLOAT6E2M3: 6, _T.FLOAT6E3M2: 6,
}  # fmt: skip


def dtype_name(elem_type: int) -> str:
    """ONNX element type as a short lower-case name: 1 -> 'float32', 3 -> 'int8', 0 -> 'unknown'."""
    if elem_type == _T.FLOAT:
        return "float32"
    if elem_type == _T.DOUBLE:
        return "float64"
    if elem_type == _T.UNDEFINED or elem_type not in _T.DataType.values():
        return "unknown"
    return _T.DataType.Name(elem_type).lower()


def dtype_bits(elem_type: int) -> int | None:
    """Storage bits of one element (4 for int4); None for strings and unknown types."""
    return _BITS.get(elem_type)


@dataclasses.dataclass(frozen=True)
class ValueType:
    """Element type (-1 for sequences, maps, optionals) and dims of one value; ``dims`` is None
    when the value has no shape."""

    elem_type: int
    dims: Dims | None


def op_key(node: onnx.NodeProto) -> str:
    """Histogram key of a node: its op type, prefixed by 'domain:' outside the default domain."""
    return node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}:{node.op_type}"


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def iter_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """Yield ``graph`` and every subgraph nested in its nodes (If/Loop/Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for sub in _subgraphs(node):
            yield from iter_graphs(sub)


def iter_nodes(graph: onnx.GraphProto, depth: int = 0) -> Iterator[tuple[onnx.NodeProto, int]]:
    """Yield ``(node, depth)`` for every node, subgraph nodes after their parent with depth + 1."""
    for node in graph.node:
        yield node, depth
        for sub in _subgraphs(node):
            yield from iter_nodes(sub, depth + 1)


def _dims(shape: onnx.TensorShapeProto) -> Dims:
    out: list[int | str | None] = []
    for d in shape.dim:
        if d.HasField("dim_value"):
            out.append(d.dim_value if d.dim_value >= 0 else None)
        elif d.HasField("dim_param") and d.dim_param not in ("", "?"):
            out.append(d.dim_param)
        else:
            out.append(None)
    return tuple(out)


def _value_type(vi: onnx.ValueInfoProto) -> ValueType | None:
    if not vi.type.HasField("tensor_type"):
        return ValueType(-1, None) if vi.type.WhichOneof("value") else None  # -1: not a tensor
    tt = vi.type.tensor_type
    return ValueType(tt.elem_type, _dims(tt.shape) if tt.HasField("shape") else None)


def _constant_type(node: onnx.NodeProto) -> ValueType | None:
    for attr in node.attribute:
        if attr.name == "value":
            return ValueType(attr.t.data_type, tuple(attr.t.dims))
        if attr.name == "sparse_value":
            return ValueType(attr.sparse_tensor.values.data_type, tuple(attr.sparse_tensor.dims))
        if attr.name in ("value_float", "value_int", "value_string"):
            kind = {"value_float": _T.FLOAT, "value_int": _T.INT64, "value_string": _T.STRING}[attr.name]
            return ValueType(kind, ())
        if attr.name in ("value_floats", "value_ints", "value_strings"):
            kind = {"value_floats": _T.FLOAT, "value_ints": _T.INT64, "value_strings": _T.STRING}[attr.name]
            return ValueType(kind, (len(attr.floats) + len(attr.ints) + len(attr.strings),))
    return None


def value_types(model: onnx.ModelProto) -> dict[str, ValueType]:
    """Type and shape of every value in the model and its subgraphs that has a known type."""
    types: dict[str, ValueType] = {}
    for graph in iter_graphs(model.graph):
        for vi in [*graph.value_info, *graph.input, *graph.output]:
            vt = _value_type(vi)
            if vt is not None and (vi.name not in types or types[vi.name].dims is None):
                types[vi.name] = vt
        for init in graph.initializer:
            types[init.name] = ValueType(init.data_type, tuple(init.dims))
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS and node.output:
                vt = _constant_type(node)
                if vt is not None:
                    types[node.output[0]] = vt
    return types


def const_names(model: onnx.ModelProto) -> set[str]:
    """Names of initializers and Constant-node outputs anywhere in the model."""
    names: set[str] = set()
    for graph in iter_graphs(model.graph):
        names.update(t.name for t in graph.initializer)
        names.update(
            n.output[0] for n in graph.node if n.op_type == "Constant" and n.domain in DEFAULT_DOMAINS
        )
    return names


def _is_large(tensor: onnx.TensorProto) -> bool:
    """Whether a tensor holds more than 4 KiB inline, judged from dims and type (ByteSize() would
    walk the data: 130 ms for 64 MiB)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return False  # nothing inline to copy
    if tensor.data_type == onnx.TensorProto.STRING:
        return len(tensor.string_data) > _STUB_BYTES // 8
    return math.prod(tensor.dims) * (dtype_bits(tensor.data_type) or 8) > 8 * _STUB_BYTES


def _stub(tensor: onnx.TensorProto, name: str) -> onnx.TensorProto:
    stub = onnx.TensorProto(name=name, data_type=tensor.data_type, dims=tensor.dims)
    stub.data_location = onnx.TensorProto.EXTERNAL
    stub.external_data.add(key="location", value=_STUB_LOCATION)
    return stub


def shape_skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """Copy ``model`` for shape inference without its large tensors (never modifies ``model``).

    Initializers and main-graph Constant tensors above 4 KiB become shape-only stubs (a large
    Constant becomes a stub initializer), so inference is fast and works on models over 2 GiB.
    Small tensors stay, since inference reads shape values from them (Reshape targets and the like).
    """
    src = model.graph
    sk = onnx.ModelProto(
        ir_version=max(model.ir_version, 4), producer_name=model.producer_name, domain=model.domain
    )
    sk.opset_import.extend(model.opset_import)
    sk.functions.extend(model.functions)
    g = sk.graph
    g.name = src.name
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    g.sparse_initializer.extend(src.sparse_initializer)
    for t in src.initializer:
        g.initializer.append(_stub(t, t.name) if _is_large(t) else t)
    for node in src.node:
        if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS and len(node.attribute) == 1:
            attr = node.attribute[0]
            if attr.name == "value" and _is_large(attr.t):
                g.initializer.append(_stub(attr.t, node.output[0]))
                continue
        g.node.append(node)
    return sk


def infer(model: onnx.ModelProto) -> tuple[onnx.ModelProto | None, str]:
    """Run onnx shape inference (with data propagation) on ``model``; return (result, '') or (None, why)."""
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True), ""
    except Exception as e:  # onnx raises several types (InferenceError, ValueError, RuntimeError)
        reason = first_line(e)
        logger.info("shape inference failed: %s", reason)
        return None, f"onnx shape inference failed ({reason})"
