"""Give every value a type and shape: onnx's inference with data propagation, then ORT runs for what it leaves.

The rule. First ``onnx.shape_inference`` (non-strict, with data propagation) runs on the model and
its results are merged in without overwriting anything already known. Then every main-graph value
still untyped, of unknown rank or with anonymous dims is exposed as an output of a copy of the model,
which ORT runs on generated inputs: once at a base size, once with other random data, and once per
symbolic input dim with only that dim changed. A dim equal in all runs is recorded as a number; a
dim that follows one input symbol exactly gets that symbol's name (``N``), one proportional to it
``N*k`` or ``N/k``; any other dim that changes (several symbols, data-dependent sizes) gets a name of
its own. When a symbol cannot be varied (the model fails at every other size tried), dims that do
not change are not trusted either and get their own names. Only value types are written: nodes
and numerics do not change. Values left unknown (subgraph values onnx cannot type, values the ORT
runs cannot reach) are listed by ``unknown_shapes`` and reported as misses.
"""

from __future__ import annotations

__all__ = ["UnknownShape", "unknown_shapes", "ShapeInferencePass"]

import dataclasses
import logging
from collections.abc import Iterator, Mapping

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from zonnx.errors import OptionError, first_line
from zonnx.ir.io import to_proto
from zonnx.passes.base import Changes, ZonnxPass

logger = logging.getLogger(__name__)

#: Initializers larger than this are handed to onnx's inference as typed inputs, without data.
_BIG_INITIALIZER_BYTES = 1024


@dataclasses.dataclass(frozen=True)
class UnknownShape:
    """A value whose type or shape is not (fully) known, and the node producing it."""

    name: str  # the value
    op_type: str
    node: str
    reason: str  # "no type", "no shape" or "dims 0, 2 unknown"

    def __str__(self) -> str:
        return f"{self.name} (output of {self.op_type} node {self.node}): {self.reason}"


def _dim_known(dim: int | ir.SymbolicDim) -> bool:
    """A number >= 0 or a named symbol ("?", paddle2onnx's spelling of "unknown", is no name)."""
    if isinstance(dim, int):
        return dim >= 0
    return dim.value not in (None, "", "?")


def _dim_informative(dim: int | ir.SymbolicDim) -> bool:
    """Known, and not one of the placeholder names (``unk__3``) onnx's inference makes up."""
    return _dim_known(dim) and not (isinstance(dim, ir.SymbolicDim) and dim.value.startswith("unk__"))


def _refinable(value: ir.Value) -> bool:
    """Untyped, rank-unknown, or with a dim that is anonymous or a made-up placeholder."""
    if _missing(value):
        return True
    shape = value.shape
    return isinstance(value.type, ir.TensorType) and not all(_dim_informative(d) for d in shape)


def _missing(value: ir.Value) -> str | None:
    """Why ``value``'s type or shape is incomplete, or None when both are known."""
    if value.type is None:
        return "no type"
    if not isinstance(value.type, ir.TensorType):
        return None  # sequences and optionals have no single shape
    if value.shape is None:
        return "no shape"
    unknown = [str(i) for i, d in enumerate(value.shape) if not _dim_known(d)]
    return f"dims {', '.join(unknown)} unknown" if unknown else None


def _produced_values(graph: ir.Graph) -> Iterator[tuple[ir.Node, ir.Value]]:
    """(producer, value) for every named node output of ``graph`` and its subgraphs."""
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for value in node.outputs:
            if value.name:
                yield node, value


def unknown_shapes(model: ir.Model) -> list[UnknownShape]:
    """Every node output (subgraphs included) whose type, rank or some dim is unknown, in graph order."""
    result = []
    for node, value in _produced_values(model.graph):
        reason = _missing(value)
        if reason:
            result.append(UnknownShape(value.name, node.op_type, node.name or "(unnamed)", reason))
    return result


def _merge_shape(old: ir.Shape | None, new: ir.Shape | None, keep=_dim_known) -> ir.Shape | None:
    """Keep every dim of ``old`` that ``keep`` accepts; take ``new``'s dims for the others (same rank only)."""
    if new is None:
        return old
    if old is None:
        return new
    if len(old) != len(new):
        return old
    return ir.Shape([o if keep(o) or not _dim_known(n) else n for o, n in zip(old, new, strict=True)])


def _state(value: ir.Value) -> tuple[bool, int]:
    """(typed, how many dims are informative; -1 without a shape) for counting improvements."""
    shape = value.shape
    return value.type is not None, -1 if shape is None else sum(_dim_informative(d) for d in shape)


# -- step 1: onnx's shape inference --------------------------------------------------------------
def _stubbable(tensor: ir.TensorProtocol | None) -> bool:
    """In memory, of whole-byte elements, and over ``_BIG_INITIALIZER_BYTES`` once serialized (its raw
    bytes alone are): such a tensor would be handed to onnx's inference as a typed input anyway."""
    if isinstance(tensor, ir.serde.TensorProtoTensor):
        in_raw = tensor.raw.HasField("raw_data")  # typed fields (varints) may be shorter than nbytes
    else:
        in_raw = isinstance(tensor, ir.Tensor)
    return (
        in_raw
        and tensor.dtype.bitwidth >= 8
        and not tensor.dtype.is_string()
        and tensor.nbytes > _BIG_INITIALIZER_BYTES
    )


def _onnx_inferred(model: ir.Model, data_prop: bool) -> ir.Model:
    """A copy of ``model`` after onnx's shape inference; big initializers are passed as typed inputs.

    The big initializers are serialized as data-less stubs (their values are put back after), so the
    weights are not copied for a pass that only reads their types and shapes."""
    stubbed: dict[str, tuple[ir.Value, ir.TensorProtocol]] = {}
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if _stubbable(tensor):
            stubbed[value.name] = (value, tensor)
            value.const_value = ir.ExternalTensor(
                "zonnx-shape-stub", 0, tensor.nbytes, tensor.dtype, shape=tensor.shape, name=value.name
            )
    try:
        proto = ir.serde.serialize_model(model)
    finally:
        for value, tensor in stubbed.values():
            value.const_value = tensor
    keep = []
    for tensor in proto.graph.initializer:
        if tensor.name in stubbed or tensor.ByteSize() > _BIG_INITIALIZER_BYTES:
            proto.graph.input.append(
                onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
        else:
            keep.append(tensor)
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(keep)
    inferred = onnx.shape_inference.infer_shapes(
        proto, check_type=False, strict_mode=False, data_prop=data_prop
    )
    return ir.serde.deserialize_model(inferred)


def _merge_inferred(model: ir.Model, inferred: ir.Model) -> None:
    for graph, other in zip(model.graphs(), inferred.graphs(), strict=True):
        theirs = {v.name: v for _, v in _produced_values_flat(other)}
        for _, value in _produced_values_flat(graph):
            twin = theirs.get(value.name)
            if twin is None:
                continue
            if value.type is None and twin.type is not None:
                value.type = twin.type
            value.shape = _merge_shape(value.shape, twin.shape)


def _produced_values_flat(graph: ir.Graph) -> Iterator[tuple[ir.Node, ir.Value]]:
    """Like ``_produced_values`` but for ``graph``'s own nodes only (subgraphs come from graphs())."""
    for node in graph:
        for value in node.outputs:
            if value.name:
                yield node, value


# -- step 2: observe the values in ORT -----------------------------------------------------------
@dataclasses.dataclass
class _Inputs:
    """Graph inputs with symbolic dims: which symbol each dim is and the sizes of the base run."""

    dims: dict[str, list[int | str]]  # input -> per dim a fixed size or a symbol
    base: dict[str, int]  # symbol -> size in the base run

    def shapes(self, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        return {
            name: tuple(d if isinstance(d, int) else sizes[d] for d in dims)
            for name, dims in self.dims.items()
        }


def _input_symbols(model: ir.Model, shapes: Mapping[str, tuple[int, ...]] | None) -> _Inputs:
    """Name every non-fixed input dim: its dim_param, else ``<input>_dim<i>``; base sizes 1 (dim 0) or 64.

    Inputs sharing a dim_param share the symbol, so their sizes change together.
    """
    shapes = dict(shapes or {})
    dims: dict[str, list[int | str]] = {}
    base: dict[str, int] = {}
    inputs = [v for v in model.graph.inputs if not v.is_initializer()]
    for value in inputs:
        given = shapes.pop(value.name, None)
        if value.shape is None:
            if given is None:
                raise OptionError(f"input {value.name!r} has no shape; give it with shapes={{...}}")
            value = ir.val(value.name, value.dtype, given)
        if given is not None and len(given) != len(value.shape):
            raise OptionError(
                f"shape-inference: shapes[{value.name!r}]={tuple(given)} has {len(given)} dims but the "
                f"input has {len(value.shape)}; give one size per dimension."
            )
        dims[value.name] = []
        for i, d in enumerate(value.shape):
            if isinstance(d, int) and d >= 0:
                dims[value.name].append(d)
                continue
            symbol = d.value if _dim_known(d) else f"{value.name}_dim{i}"
            dims[value.name].append(symbol)
            base.setdefault(symbol, given[i] if given else (1 if i == 0 else 64))
    if shapes:
        raise OptionError(
            f"shape-inference: shapes given for {sorted(shapes)} but the model's inputs are "
            f"{[v.name for v in inputs]}."
        )
    return _Inputs(dims, base)


def _feeds(model: ir.Model, shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Random inputs of the given shapes: standard normal floats, integers in [0, 10), random bools."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.inputs:
        if value.is_initializer():
            continue
        if value.dtype is None or value.name not in shapes:
            raise OptionError(f"input {value.name!r} has no tensor type and shape; cannot generate it")
        dtype, shape = value.dtype.numpy(), shapes[value.name]
        if dtype.kind == "f":
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[value.name] = rng.integers(0, 10, shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[value.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            raise OptionError(f"input {value.name!r}: cannot generate dtype {dtype}")
    return feeds


def _alternatives(size: int) -> list[int]:
    """Other sizes to try for a symbol: kept multiples of 32 where the base is one."""
    if size == 1:
        return [2, 3]
    return [s for s in (size + 32, size // 2, size + 16, size * 2, size - 8) if s >= 1 and s != size]


def _name_dim(observed: dict[str, int], base: int, syms: _Inputs, alt: dict[str, int]) -> int | str | None:
    """Number, symbol expression, or None (needs a name of its own) for one dim across the runs."""
    changed = [s for s, size in observed.items() if size != base]
    if not changed:
        return base
    if len(changed) != 1:
        return None
    s = changed[0]
    b, a, got = syms.base[s], alt[s], observed[s]
    if (base, got) == (b, a):
        return s
    for k in range(2, 65):
        if (base * k, got * k) == (b, a):
            return f"{s}/{k}"
        if (base, got) == (b * k, a * k):
            return f"{s}*{k}"
    return None


def _observe(model: ir.Model, targets: list[ir.Value], shapes, changes: Changes) -> dict[str, ir.Value]:
    """Run ORT with ``targets`` exposed and return, by name, a typed and shaped twin for each."""
    proto = to_proto(model)
    exposed = {o.name for o in proto.graph.output}
    names = [v.name for v in targets if v.name not in exposed]
    proto.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    names = [o.name for o in proto.graph.output]
    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # runs at sizes the model refuses are expected: keep them quiet
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT raises its own exception types
        changes.miss(f"ORT runs skipped: onnxruntime cannot load the model ({str(e).strip()[:200]})")
        return {}
    try:
        syms = _input_symbols(model, shapes)
    except OptionError as e:
        if shapes:
            raise
        changes.miss(f"ORT runs skipped: {e}")
        return {}

    def run(sizes: Mapping[str, int], seed: int) -> dict[str, np.ndarray] | None:
        try:
            feeds = _feeds(model, syms.shapes(sizes), seed)
            return dict(zip(names, session.run(names, feeds), strict=True))
        except Exception:  # ORT raises its own exception types; any failure means "not at these sizes"
            return None

    base_run = run(syms.base, 0)
    if base_run is None:
        for size in (32, 16, 128):
            syms.base = {s: (v if v == 1 else size) for s, v in syms.base.items()}
            if (base_run := run(syms.base, 0)) is not None:
                break
    if base_run is None:
        changes.miss(
            f"ORT runs skipped: the model fails on generated inputs of shapes {syms.shapes(syms.base)}; "
            "give the pass real input shapes (shapes=...)"
        )
        return {}
    data_runs = [r for r in (run(syms.base, 1), run(syms.base, 2)) if r is not None]
    varied: dict[str, dict[str, np.ndarray]] = {}
    alt: dict[str, int] = {}
    for s, size in syms.base.items():
        for other in _alternatives(size):
            if (result := run({**syms.base, s: other}, 0)) is not None:
                varied[s], alt[s] = result, other
                break
        else:
            changes.miss(
                f"input dim {s} could not be varied (model fails at other sizes); dims kept symbolic"
            )
    trusted = len(alt) == len(syms.base)
    found = {}
    for value in targets:
        array = base_run.get(value.name)
        if not isinstance(array, np.ndarray):
            continue
        dtype = ir.DataType.from_numpy(array.dtype)
        data_shapes = [r[value.name].shape for r in data_runs]
        varied_shapes = {s: r[value.name].shape for s, r in varied.items()}
        if any(len(sh) != array.ndim for sh in [*data_shapes, *varied_shapes.values()]):
            found[value.name] = ir.val(value.name, dtype)  # the rank itself changes: type only
            continue
        dims: list[int | str] = []
        for i, d in enumerate(array.shape):
            named = None
            if all(sh[i] == d for sh in data_shapes):  # else a data-dependent size
                named = _name_dim({s: sh[i] for s, sh in varied_shapes.items()}, d, syms, alt)
            if isinstance(named, int) and not trusted:
                named = None
            dims.append(f"{value.name}_dim{i}" if named is None else named)
        found[value.name] = ir.val(value.name, dtype, dims)
    return found


class ShapeInferencePass(ZonnxPass):
    """Writes a type and shape into every value it can; nodes and numerics never change.

    Options:
        data_prop: let onnx's inference propagate constant shape data (default True).
        runtime: observe what onnx leaves unknown by running ORT on generated inputs (default True).
        shapes: base input shapes for those runs (default: batch 1, other symbolic dims 64).
    """

    name = "shape-inference"

    def __init__(
        self,
        data_prop: bool = True,
        *,
        runtime: bool = True,
        shapes: Mapping[str, tuple[int, ...]] | None = None,
    ) -> None:
        super().__init__()
        self.data_prop = data_prop
        self.runtime = runtime
        self.shapes = dict(shapes) if shapes else None

    def apply(self, model: ir.Model) -> Changes:
        changes = Changes()
        values = [v for _, v in _produced_values(model.graph)]
        before = {id(v): _state(v) for v in values}
        try:
            _merge_inferred(model, _onnx_inferred(model, self.data_prop))
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError) as e:
            changes.miss(f"onnx shape inference failed ({first_line(e)}); using ORT runs only")
        own = {id(v) for n in model.graph for v in n.outputs}
        targets = [v for v in values if id(v) in own and _refinable(v)]
        if targets and self.runtime:
            observed = _observe(model, targets, self.shapes, changes)
            for value in targets:
                twin = observed.get(value.name)
                if twin is None:
                    continue
                if value.type is None:
                    value.type = twin.type
                if value.shape is not None and twin.shape is not None and len(value.shape) != len(twin.shape):
                    changes.miss(
                        f"{value.name}: onnx infers rank {len(value.shape)}, ORT sees {len(twin.shape)}"
                    )
                value.shape = _merge_shape(value.shape, twin.shape, keep=_dim_informative)
        for value in values:
            (typed, known), (typed_now, known_now) = before[id(value)], _state(value)
            changes.add("typed values", int(typed_now and not typed))
            changes.add("shaped values", int(known_now > known))
        for unknown in unknown_shapes(model):
            changes.miss(str(unknown))
        return changes
