"""``inspect_model``: what an ONNX model holds (I/O, ops, parameters, MACs, quantization, unknown shapes)."""

from __future__ import annotations

__all__ = [
    "TensorInfo",
    "DtypeParams",
    "Parameters",
    "UnknownShape",
    "ModelSummary",
    "inspect_model",
    "summary_to_dict",
]

import dataclasses
import json
import logging
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from zonnx.inspection.folding import infer_folded
from zonnx.inspection.macs import Macs, count_macs, fix_input_shapes
from zonnx.inspection.quant import Quantization, detect_quantization
from zonnx.inspection.shapes import (
    DEFAULT_DOMAINS,
    ValueType,
    const_names,
    dtype_bits,
    dtype_name,
    infer,
    iter_graphs,
    iter_nodes,
    op_key,
    shape_skeleton,
    value_types,
)
from zonnx.ir.io import ModelLike, check_wiring, load_proto

logger = logging.getLogger(__name__)

#: Control-flow ops whose bodies are subgraphs.
_CONTROL_FLOW = ("If", "Loop", "Scan")


@dataclasses.dataclass
class TensorInfo:
    """A graph input or output: ``shape`` lists ints and symbolic dim names ('?' when unnamed);
    None when the model gives no shape."""

    name: str
    dtype: str
    shape: list[int | str] | None


@dataclasses.dataclass
class DtypeParams:
    """Parameters of one element type: tensors, elements and storage bytes."""

    dtype: str
    tensors: int
    count: int
    bytes: int


@dataclasses.dataclass
class Parameters:
    """Constant tensors (initializers and Constant nodes, subgraphs included).

    ``count`` is elements, ``bytes`` storage (4-bit types pack two per byte); ``external`` counts
    initializers whose data lives in an external file (sized from their shape, never read).
    """

    count: int = 0
    bytes: int = 0
    tensors: int = 0
    initializers: int = 0
    constants: int = 0
    external: int = 0
    by_dtype: list[DtypeParams] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class UnknownShape:
    """A node output that has no shape after onnx shape inference on the model as given."""

    name: str
    op_type: str
    node: str


@dataclasses.dataclass
class ModelSummary:
    """What ``inspect_model`` found. ``to_json()`` gives these keys, in this order:

    ``path`` (None for in-memory models), ``ir_version``, ``opsets`` (domain -> version, the default
    domain as 'ai.onnx'), ``producer_name``, ``producer_version``, ``graph_name``, ``metadata_keys``,
    ``inputs``/``outputs`` (TensorInfo: name, dtype, shape), ``nodes`` (all, subgraphs included),
    ``subgraph_nodes``, ``control_flow`` (op -> count of If/Loop/Scan), ``functions`` (model-local
    'domain:name'), ``op_histogram`` (op -> count, most frequent first, 'domain:Op' outside the default
    domain), ``parameters`` (Parameters), ``macs`` (Macs: total, complete, by_op, unknown, unknown_dims,
    batch, fixed_dims), ``quantization`` (Quantization), ``unknown_shapes`` (UnknownShape list),
    ``notes`` (sentences on the assumptions made).
    """

    path: str | None
    ir_version: int
    opsets: dict[str, int]
    producer_name: str
    producer_version: str
    graph_name: str
    metadata_keys: list[str]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    nodes: int
    subgraph_nodes: int
    control_flow: dict[str, int]
    functions: list[str]
    op_histogram: dict[str, int]
    parameters: Parameters
    macs: Macs
    quantization: Quantization
    unknown_shapes: list[UnknownShape]
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the summary (``dataclasses.asdict``)."""
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        """Stable JSON of the summary: the keys listed in the class docstring, in that order."""
        return json.dumps(self.to_dict(), indent=indent)


def summary_to_dict(summary: ModelSummary) -> dict[str, Any]:
    """Plain dict of a summary (the JSON keys documented on ModelSummary)."""
    return summary.to_dict()


def _load(model_or_path: ModelLike) -> tuple[str | None, onnx.ModelProto]:
    if isinstance(model_or_path, onnx.ModelProto):
        return None, model_or_path
    if isinstance(model_or_path, ir.Model):
        return None, ir.serde.serialize_model(model_or_path)
    if not isinstance(model_or_path, str | os.PathLike):
        raise TypeError(f"inspect_model: expected a path, ModelProto or ir.Model, got {type(model_or_path)}")
    return str(model_or_path), load_proto(model_or_path, load_external_data=False)


def _tensor_info(vi: onnx.ValueInfoProto) -> TensorInfo:
    if not vi.type.HasField("tensor_type"):
        return TensorInfo(vi.name, vi.type.WhichOneof("value") or "unknown", None)
    tt = vi.type.tensor_type
    shape: list[int | str] | None = None
    if tt.HasField("shape"):
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:
                shape.append(d.dim_value)
            else:
                shape.append(d.dim_param if d.HasField("dim_param") and d.dim_param else "?")
    return TensorInfo(vi.name, dtype_name(tt.elem_type), shape)


def _tensor_size(t: onnx.TensorProto) -> tuple[int, int]:
    """(elements, bytes) of a tensor from its dims and type; strings count their characters."""
    numel = math.prod(t.dims)
    if t.data_type == onnx.TensorProto.STRING:
        return numel, sum(len(s) for s in t.string_data)
    bits = dtype_bits(t.data_type) or 0
    return numel, (numel * bits + 7) // 8


def _constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The tensor a Constant node produces (value_float(s)/value_int(s) become float32/int64 tensors)."""
    for a in node.attribute:
        if a.name == "value":
            return a.t
        if a.name == "sparse_value":
            return a.sparse_tensor.values
        if a.name in ("value_float", "value_floats"):
            return onnx.helper.make_tensor(
                "", onnx.TensorProto.FLOAT, [len(a.floats)] if a.floats else [], []
            )
        if a.name in ("value_int", "value_ints"):
            return onnx.helper.make_tensor("", onnx.TensorProto.INT64, [len(a.ints)] if a.ints else [], [])
    return None


def _parameters(model: onnx.ModelProto) -> Parameters:
    params = Parameters()
    by_dtype: dict[str, DtypeParams] = {}

    def add(t: onnx.TensorProto) -> None:
        count, nbytes = _tensor_size(t)
        entry = by_dtype.setdefault(dtype_name(t.data_type), DtypeParams(dtype_name(t.data_type), 0, 0, 0))
        entry.tensors += 1
        entry.count += count
        entry.bytes += nbytes

    for graph in iter_graphs(model.graph):
        for t in graph.initializer:
            add(t)
            params.initializers += 1
            params.external += t.data_location == onnx.TensorProto.EXTERNAL
        for sparse in graph.sparse_initializer:
            add(sparse.values)
            params.initializers += 1
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS:
                t = _constant_tensor(node)
                if t is not None:
                    add(t)
                    params.constants += 1
    params.by_dtype = sorted(by_dtype.values(), key=lambda e: (-e.bytes, e.dtype))
    params.count = sum(e.count for e in params.by_dtype)
    params.bytes = sum(e.bytes for e in params.by_dtype)
    params.tensors = sum(e.tensors for e in params.by_dtype)
    return params


def _histogram(model: onnx.ModelProto) -> tuple[dict[str, int], dict[str, int], int]:
    """(op histogram, If/Loop/Scan counts, nodes inside subgraphs); most frequent first, then by name."""
    histogram: Counter[str] = Counter()
    control_flow: Counter[str] = Counter()
    subgraph_nodes = 0
    for node, depth in iter_nodes(model.graph):
        histogram[op_key(node)] += 1
        subgraph_nodes += depth > 0
        if node.op_type in _CONTROL_FLOW and node.domain in DEFAULT_DOMAINS:
            control_flow[node.op_type] += 1
    ordered = dict(sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0])))
    return ordered, dict(control_flow.most_common()), subgraph_nodes


def _unknown_shapes(inferred: onnx.ModelProto, types: Mapping[str, ValueType]) -> list[UnknownShape]:
    out = []
    for node, _ in iter_nodes(inferred.graph):
        for name in node.output:
            vt = types.get(name)
            if name and (vt is None or (vt.dims is None and vt.elem_type >= 0)):
                out.append(UnknownShape(name, op_key(node), node.name))
    return out


def _missing_external(model: onnx.ModelProto, folder: Path) -> list[str]:
    locations = {
        e.value
        for t in model.graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
        for e in t.external_data
        if e.key == "location"
    }
    return sorted(loc for loc in locations if not (folder / loc).is_file())


def _shape_hint(summary: ModelSummary) -> str:
    """'--input-shape x:1,3,H,W with numbers for H, W (API: shapes=...)' for the first input with open dims."""
    fixed = {(f.input, f.axis): f.value for f in summary.macs.fixed_dims}
    for inp in summary.inputs:
        dims = [fixed.get((inp.name, a), d) for a, d in enumerate(inp.shape or [])]
        names = [d if d != "?" else f"d{a}" for a, d in enumerate(dims) if isinstance(d, str)]
        if names:
            spec = ",".join(str(d if d != "?" else f"d{a}") for a, d in enumerate(dims))
            return (
                f"--input-shape {inp.name}:{spec} with numbers for {', '.join(names)} "
                f"(API: shapes={{{inp.name!r}: (...)}})"
            )
    return "--input-shape NAME:D1,D2,... (API: shapes={NAME: (D1, D2, ...)})"


def _notes(summary: ModelSummary, inference_error: str, missing_external: list[str]) -> list[str]:
    notes = []
    macs = summary.macs
    if inference_error:
        notes.append(f"{inference_error}: shapes and MACs come only from what the model declares.")
    if macs.fixed_dims:
        dims = ", ".join(
            f"{f.input}[{f.axis}] ({f.symbol!r}) = {f.value}" + (" (batch)" if f.source == "batch" else "")
            for f in macs.fixed_dims
        )
        notes.append(f"MACs were counted with input dims set: {dims}.")
    if macs.unknown:
        kinds = Counter(u.op_type for u in macs.unknown)
        what = ", ".join(f"{n} {op}" for op, n in kinds.most_common())
        if macs.unknown_dims:
            why = f"input dim(s) {', '.join(macs.unknown_dims)} have no number"
            how = f" Give input shapes to count them: {_shape_hint(summary)}."
        else:
            why, how = "shape inference could not compute the shapes they need", ""
        notes.append(
            f"MACs of {len(macs.unknown)} node(s) ({what}) are unknown, not zero: {why}; "
            f"the total counts only the others.{how}"
        )
    if summary.subgraph_nodes:
        flow = ", ".join(f"{n} {op}" for op, n in summary.control_flow.items())
        notes.append(
            f"{summary.subgraph_nodes} node(s) inside the subgraphs of {flow} are included in the op "
            "histogram, parameters and MACs (each body counted once; both If branches)."
        )
    if summary.functions:
        notes.append(
            f"model-local function(s) {', '.join(summary.functions)}: calls are counted by name; "
            "the ops inside their bodies are not."
        )
    if summary.parameters.external:
        notes.append(
            f"{summary.parameters.external} initializer(s) keep their data in external files (not read; "
            "sizes come from their shapes)."
        )
    if missing_external:
        notes.append(f"external data file(s) not found next to the model: {', '.join(missing_external)}.")
    return notes


def inspect_model(
    model_or_path: ModelLike,
    *,
    batch: int = 1,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> ModelSummary:
    """Summarize a model (path, ModelProto or ir.Model; never modified, external data never read).

    Shapes come from onnx shape inference (with data propagation) on a copy whose large tensors are
    stubs. For MACs, a leading input dim that is not a number is set to ``batch``, ``shapes`` sets
    whole inputs by name (``{"x": (1, 3, 48, 192)}``), and every dim set is listed in ``notes``.
    MACs that depend on any other non-numeric dim are reported unknown (see ``macs.py`` for the rules).
    Unknown shapes are those left after inference on the model as given. A graph that reads a tensor
    nobody writes, or reads it before it is written, is a ModelLoadError (``check_wiring``).
    """
    path, proto = _load(model_or_path)
    check_wiring(proto, path or "model")  # an invalid graph is said to be invalid, not summarized
    skeleton = shape_skeleton(proto)
    given, inference_error = infer(skeleton)
    given_types = value_types(given if given is not None else skeleton)
    sized = onnx.ModelProto()
    sized.CopyFrom(skeleton)
    fixed_dims, open_dims = fix_input_shapes(sized, batch, shapes)
    inferred, error = infer_folded(sized)
    inference_error = inference_error or error
    sized = inferred if inferred is not None else sized
    sized_types = value_types(sized)

    macs = count_macs(sized, sized_types)
    macs.fixed_dims = fixed_dims
    macs.unknown_dims = open_dims
    macs.batch = batch if any(f.source == "batch" for f in fixed_dims) else None
    histogram, control_flow, subgraph_nodes = _histogram(proto)
    inits = {t.name for t in proto.graph.initializer}
    summary = ModelSummary(
        path=path,
        ir_version=proto.ir_version,
        opsets={imp.domain or "ai.onnx": imp.version for imp in proto.opset_import},
        producer_name=proto.producer_name,
        producer_version=proto.producer_version,
        graph_name=proto.graph.name,
        metadata_keys=[p.key for p in proto.metadata_props],
        inputs=[_tensor_info(vi) for vi in proto.graph.input if vi.name not in inits],
        outputs=[_tensor_info(vi) for vi in proto.graph.output],
        nodes=sum(histogram.values()),
        subgraph_nodes=subgraph_nodes,
        control_flow=control_flow,
        functions=[f"{f.domain}:{f.name}" if f.domain else f.name for f in proto.functions],
        op_histogram=histogram,
        parameters=_parameters(proto),
        macs=macs,
        quantization=detect_quantization(sized, sized_types, const_names(proto)),
        unknown_shapes=_unknown_shapes(given if given is not None else skeleton, given_types),
        notes=[],
    )
    missing = _missing_external(proto, Path(path).parent) if path is not None else []
    summary.notes = _notes(summary, inference_error, missing)
    logger.info("inspected %s: %d nodes, %d MACs", path or summary.graph_name, summary.nodes, macs.total)
    return summary
