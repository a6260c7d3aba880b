"""Fold nodes whose inputs are all constant (and shape computations on static shapes) into initializers."""

from __future__ import annotations

__all__ = ["ConstantFoldingPass", "StaticInfo", "constant_array", "describe", "is_constant"]

import dataclasses
import logging
import math
from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator
from onnx_ir.passes.common import _c_api_utils

from zonnx.ir.io import MAX_IR_VERSION
from zonnx.passes.base import Changes, ZonnxPass

logger = logging.getLogger(__name__)

_ONNX_DOMAINS = ("", "ai.onnx")
#: Random ops: folding would freeze one sample.
_RANDOM = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)
#: Quantization ops keep their constant inputs: folding them would turn quantized weights back to float.
_KEEP_QUANTIZED = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
#: Ops the reference evaluator runs with Python loops (slow) or lacks: evaluate them with ORT first.
_ORT_FIRST = frozenset(
    {
        "Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool",
        "MaxRoiPool", "RoiAlign", "Resize", "Upsample", "LSTM", "GRU", "RNN", "GridSample",
        "DeformConv", "Col2Im", "NonMaxSuppression", "QLinearMatMul", "MatMulInteger",
    }
)  # fmt: skip
_INT_TYPES = frozenset({ir.DataType.INT64, ir.DataType.INT32, ir.DataType.INT16, ir.DataType.INT8})


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
    return producer is not None and producer.op_type == "Constant" and producer.domain in _ONNX_DOMAINS


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
            _warn_once(
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


@dataclasses.dataclass(frozen=True)
class _Partial:
    """A 1-D (or scalar) integer shape vector whose entries may be unknown (None)."""

    values: tuple[int | None, ...]
    dtype: np.dtype
    scalar: bool = False

    def known(self) -> np.ndarray | None:
        if any(v is None for v in self.values):
            return None
        arr = np.array(self.values, dtype=self.dtype)
        return arr.reshape(()) if self.scalar else arr


def _attr(node: ir.Node, name: str, default=None):
    attr = node.attributes.get(name)
    return default if attr is None or attr.is_ref() else attr.value


def _slice_indices(n: int, start: int, end: int, step: int) -> list[int]:
    """ONNX Slice index semantics on one axis of length n (negatives wrap, then clamp)."""
    start, end = (start + n if start < 0 else start), (end + n if end < 0 else end)
    if step > 0:
        return list(range(min(max(start, 0), n), min(max(end, 0), n), step))
    return list(range(min(max(start, 0), n - 1), min(max(end, -1), n - 1), step))


def _as_partial(value: ir.Value | None, partials: dict[ir.Value, _Partial]) -> _Partial | None:
    if value in partials:
        return partials[value]
    arr = constant_array(value)
    if arr is None or arr.dtype.kind not in "iu" or arr.ndim > 1:
        return None
    return _Partial(tuple(int(v) for v in arr.ravel()), arr.dtype, arr.ndim == 0)


def _shape_partial(node: ir.Node, info: StaticInfo, partials: dict[ir.Value, _Partial]) -> _Partial | None:
    """Propagate known shape entries through Shape, Size, Cast, Gather, Slice, Concat, (Un)Squeeze."""
    op, ins = node.op_type, node.inputs
    if op == "Shape":
        dims = info.dims(ins[0])
        if dims is None:
            return None
        part = dims[slice(_attr(node, "start", 0), _attr(node, "end"))]
        return _Partial(tuple(d if isinstance(d, int) else None for d in part), np.dtype(np.int64))
    if op == "Size":
        shape = info.shape(ins[0])
        return None if shape is None else _Partial((math.prod(shape),), np.dtype(np.int64), True)
    src = partials.get(ins[0]) if ins and ins[0] is not None else None
    if op == "Concat":
        parts = [_as_partial(v, partials) for v in ins]
        if not any(v in partials for v in ins) or any(p is None or p.scalar for p in parts):
            return None
        return _Partial(sum((p.values for p in parts), ()), parts[0].dtype)  # type: ignore[union-attr]
    if src is None:
        return None
    if op == "Identity":
        return src
    if op == "Cast":
        to = ir.DataType(_attr(node, "to"))
        return dataclasses.replace(src, dtype=to.numpy()) if to in _INT_TYPES else None
    if op == "Gather" and not src.scalar and _attr(node, "axis", 0) in (0, -1):
        idx = constant_array(ins[1])
        if idx is None or idx.ndim > 1:
            return None
        n = len(src.values)
        picked = tuple(src.values[int(i) + n if i < 0 else int(i)] for i in idx.ravel() if -n <= i < n)
        return _Partial(picked, src.dtype, idx.ndim == 0) if len(picked) == idx.size else None
    if op == "Slice" and not src.scalar:
        if len(ins) > 1:
            args = [None if v is None else constant_array(v) for v in ins[1:5]]
            if len(args) < 2 or any(v is not None and a is None for v, a in zip(ins[1:5], args, strict=True)):
                return None
            starts, ends = args[0].tolist(), args[1].tolist()  # type: ignore[union-attr]
            axes = args[2].tolist() if len(args) > 2 and args[2] is not None else [0]
            steps = args[3].tolist() if len(args) > 3 and args[3] is not None else [1]
        else:
            starts, ends = _attr(node, "starts"), _attr(node, "ends")
            axes, steps = _attr(node, "axes", [0]), [1]
        if len(starts) != 1 or axes not in ([0], [-1]) or steps[0] == 0:
            return None
        idx = _slice_indices(len(src.values), int(starts[0]), int(ends[0]), int(steps[0]))
        return _Partial(tuple(src.values[i] for i in idx), src.dtype)
    if op == "Unsqueeze" and src.scalar:
        axes = constant_array(ins[1]) if len(ins) > 1 else np.array(_attr(node, "axes", []))
        return _Partial(src.values, src.dtype) if axes is not None and axes.tolist() in ([0], [-1]) else None
    if op == "Squeeze" and not src.scalar and len(src.values) == 1:
        return _Partial(src.values, src.dtype, True)
    return None


def _predicted_elements(node: ir.Node, arrays: Sequence[np.ndarray | None], info: StaticInfo) -> int | None:
    """Element count of the largest output, known before evaluating (to refuse huge results cheaply)."""
    sizes = [math.prod(s) for s in (info.shape(v) for v in node.outputs) if s is not None]
    if sizes:
        return max(sizes)
    op = node.op_type
    try:
        if op == "ConstantOfShape":
            return int(np.prod(arrays[0]))
        if op == "Expand":
            return int(np.prod(np.broadcast_shapes(arrays[0].shape, tuple(int(d) for d in arrays[1]))))
        if op == "Tile":
            return int(np.prod(np.array(arrays[0].shape) * arrays[1]))
        if op == "Range":
            start, limit, delta = (float(a) for a in arrays[:3])
            return max(math.ceil((limit - start) / delta), 0)
    except (ValueError, TypeError, IndexError, ZeroDivisionError, AttributeError):
        return None
    return None


def _node_proto(node: ir.Node) -> tuple[onnx.NodeProto, list[str]]:
    """The node as a NodeProto with inputs renamed i0.. and outputs o0.. ('' kept for absent ones)."""
    proto = ir.serde.serialize_node(node)
    del proto.input[:], proto.output[:]
    proto.input.extend("" if v is None else f"i{i}" for i, v in enumerate(node.inputs))
    proto.output.extend(f"o{i}" if v.name else "" for i, v in enumerate(node.outputs))
    return proto, [n for n in proto.input if n]


def _run_reference(node: ir.Node, feeds: dict[str, np.ndarray], opsets: dict[str, int]) -> list[np.ndarray]:
    proto, _ = _node_proto(node)
    return list(ReferenceEvaluator(proto, opsets=opsets).run(None, feeds))


def _run_ort(node: ir.Node, feeds: dict[str, np.ndarray], opsets: dict[str, int]) -> list[np.ndarray]:
    from zonnx.verify import run_ort

    helper = onnx.helper
    proto, names = _node_proto(node)
    inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(feeds[n].dtype), None) for n in names
    ]
    outputs = [helper.make_empty_tensor_value_info(o) for o in proto.output if o]
    imports = [helper.make_opsetid(d, v) for d, v in opsets.items()]
    model = helper.make_model(helper.make_graph([proto], "fold", inputs, outputs), opset_imports=imports)
    model.ir_version = MAX_IR_VERSION
    out = run_ort(model, feeds)
    return [out[o] for o in proto.output if o]


def _evaluate(node: ir.Node, arrays: list[np.ndarray | None], opsets: dict[str, int]) -> list[np.ndarray]:
    """Run one node on constant inputs: the reference evaluator, or ORT for ops it runs slowly or lacks."""
    feeds = {f"i{i}": a for i, a in enumerate(arrays) if a is not None}
    runners = [_run_ort, _run_reference] if node.op_type in _ORT_FIRST else [_run_reference, _run_ort]
    try:
        return runners[0](node, feeds, opsets)
    except Exception as first:  # either evaluator raises many types for ops it cannot run
        try:
            out = runners[1](node, feeds, opsets)
        except Exception:
            raise first from None
        names = [r.__name__.removeprefix("_run_") for r in runners]
        reason = (str(first).strip().splitlines() or [type(first).__name__])[0]
        _warn_once(f"constant folding: {node.op_type} evaluated by {names[1]} ({names[0]} failed: {reason})")
        return out


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    """Log ``message`` as a warning the first time this process sees it."""
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning("%s", message)


def _make_initializer(graph: ir.Graph, old: ir.Value, tensor: ir.TensorProtocol) -> ir.Value:
    """Register ``tensor`` as an initializer named like ``old`` and point every use of ``old`` at it."""
    tensor.name = old.name
    new = ir.Value(
        name=old.name, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype), const_value=tensor
    )
    new.metadata_props.update(old.metadata_props)
    graph.register_initializer(new)
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    return new


class ConstantFoldingPass(ZonnxPass):
    """Lift ``Constant`` nodes to initializers, then replace nodes computable at export time by initializers.

    A node folds when every input is constant, or when it computes a shape vector whose entries are
    all static (``Shape``/``Size`` and ``Cast``/``Gather``/``Slice``/``Concat``/``(Un)Squeeze`` on it).
    Never folded: random ops, ops with subgraphs, non-ONNX domains, (De)QuantizeLinear, and any result
    over ``size_limit`` bytes (recorded as a miss). Folded values keep their names, so graph outputs
    keep theirs. Nodes and initializers left unused by folding are removed.

    Options:
        size_limit: largest folded output in bytes (default 1 << 24, 16 MiB).
    """

    name = "constant-folding"

    #: Rounds of inference+folding while shape computations keep folding.
    max_rounds = 4

    def __init__(self, size_limit: int = 1 << 24) -> None:
        super().__init__()
        self.size_limit = size_limit

    def apply(self, model: ir.Model) -> Changes:
        changes = Changes()
        opsets = dict(model.opset_imports)
        if "" not in opsets and "ai.onnx" in opsets:
            opsets[""] = opsets["ai.onnx"]
        for graph in list(model.graphs()):
            _lift_constants(graph, changes)
        # Folding a shape computation can make more shapes static: infer again and repeat (few rounds).
        for _ in range(self.max_rounds):
            info, round_changes = StaticInfo.of(model), Changes()
            shape_folds = sum(self._fold_graph(g, info, opsets, round_changes) for g in list(model.graphs()))
            changes.counts.update(round_changes.counts)
            if not shape_folds:
                break
        changes.misses.extend(round_changes.misses)
        if model.ir_version < 4 and changes.total:
            model.ir_version = 4  # IR 3 wants every initializer listed as an input; 4 does not
            changes.add("raised IR version 3 to 4 for initializers that are not inputs")
        return changes

    def _fold_graph(self, graph: ir.Graph, info: StaticInfo, opsets: dict[str, int], changes: Changes) -> int:
        """Fold one graph in topological order; return how many shape computations folded."""
        partials: dict[ir.Value, _Partial] = {}
        kept_quantized = shape_folds = 0
        folded_inputs: list[ir.Value] = []
        for node in list(graph):
            if node.domain not in _ONNX_DOMAINS or node.op_type == "Constant":
                continue
            if any(
                a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()
            ):
                continue
            all_const = bool(node.inputs) and all(v is None or is_constant(v) for v in node.inputs)
            if node.op_type == "CastLike" and is_constant(node.inputs[0]) and info.dtype(node.inputs[1]):
                all_const = True  # only the target's type matters, and it is known
            if node.op_type in _RANDOM:
                if all_const or not node.inputs:
                    changes.miss(f"{describe(node)}: random; not folded")
                continue
            if node.op_type in _KEEP_QUANTIZED:
                kept_quantized += all_const
                continue
            results: list[np.ndarray] | None = None
            if not all_const:
                part = _shape_partial(node, info, partials)
                if part is None:
                    continue
                known = part.known()
                if known is None:
                    partials[node.outputs[0]] = part
                    continue
                results = [known]
                shape_folds += 1
            else:
                results = self._evaluate_checked(node, info, opsets, changes)
                if results is None:
                    continue
            folded_inputs.extend(v for v in node.inputs if v is not None)
            for value, array in zip([v for v in node.outputs if v.name], results, strict=True):
                _make_initializer(graph, value, ir.tensor(np.asarray(array, order="C")))  # keeps 0-d scalars 0-d
            graph.remove(node, safe=True)
            changes.add(f"folded {node.op_type}")
        if kept_quantized:
            changes.miss(
                f"{kept_quantized} constant (De)QuantizeLinear node(s) kept so weights stay quantized"
            )
        _drop_dead(graph, folded_inputs, changes)
        return shape_folds

    def _evaluate_checked(
        self, node: ir.Node, info: StaticInfo, opsets: dict[str, int], changes: Changes
    ) -> list[np.ndarray] | None:
        """Evaluate, refusing results over the size limit or of another type than the graph declares."""
        arrays = [constant_array(v) if v is not None else None for v in node.inputs]
        if node.op_type == "CastLike" and arrays[1] is None:
            arrays[1] = np.empty((0,), info.dtype(node.inputs[1]).numpy())  # type: ignore[union-attr]
        if any(a is None for v, a in zip(node.inputs, arrays, strict=True) if v is not None):
            return None
        dtypes = [info.dtype(v) for v in node.outputs]
        if ir.DataType.STRING in dtypes:
            return None
        itemsize = max((d.itemsize for d in dtypes if d is not None), default=1)
        predicted = _predicted_elements(node, arrays, info)
        if predicted is not None and int(predicted * itemsize) > self.size_limit:
            changes.miss(
                f"{describe(node)}: result of about {int(predicted * itemsize)} bytes is over "
                f"the folding limit of {self.size_limit}; kept"
            )
            return None
        try:
            results = [np.asarray(r) for r in _evaluate(node, arrays, opsets)]
        except Exception as e:  # evaluators raise many types; a miss is the right outcome here
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            changes.miss(f"{describe(node)}: cannot be evaluated ({first}); kept")
            return None
        named = [v for v in node.outputs if v.name]
        if len(results) != len(named):
            return None
        for value, array in zip(named, results, strict=True):
            if array.nbytes > self.size_limit:
                changes.miss(
                    f"{describe(node)}: output {value.name!r} has {array.nbytes} bytes, "
                    f"over the folding limit of {self.size_limit}; kept"
                )
                return None
            expected = info.dtype(value)
            if array.dtype == object or (expected is not None and expected.numpy() != array.dtype):
                changes.miss(
                    f"{describe(node)}: evaluated type {array.dtype} is not the declared {expected}; kept"
                )
                return None
        return results


def _lift_constants(graph: ir.Graph, changes: Changes) -> None:
    """Turn each Constant node into an initializer of the same name (graph outputs stay Constant nodes)."""
    for node in list(graph):
        if node.op_type != "Constant" or node.domain not in _ONNX_DOMAINS:
            continue
        value = node.outputs[0]
        if value.is_graph_output():
            continue
        if len(node.attributes) != 1 or "sparse_value" in node.attributes or value.name in graph.initializers:
            changes.miss(f"{describe(node)}: sparse, malformed or name taken by an initializer; kept")
            continue
        tensor = ir.convenience.get_const_tensor(value)
        if tensor is None or tensor.dtype == ir.DataType.STRING:
            continue
        _make_initializer(graph, value, tensor)
        graph.remove(node, safe=True)
        changes.add("lifted Constant to initializer")


def _drop_dead(graph: ir.Graph, candidates: list[ir.Value], changes: Changes) -> None:
    """Remove the folded nodes' former inputs (and their producers, transitively) once nothing uses them."""
    work = list(candidates)
    while work:
        value = work.pop()
        if value.uses() or value.is_graph_output() or value.is_graph_input():
            continue
        if value.is_initializer() and value.graph is graph and value.name in graph.initializers:
            graph.initializers.pop(value.name)
            changes.add("removed initializer left unused by folding")
            continue
        node = value.producer()
        if (
            node is None
            or node.graph is not graph
            or any(o.uses() or o.is_graph_output() for o in node.outputs)
        ):
            continue
        work.extend(v for v in node.inputs if v is not None)
        graph.remove(node, safe=True)
        changes.add(f"removed {node.op_type} left unused by folding")
