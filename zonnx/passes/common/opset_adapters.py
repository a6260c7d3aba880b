"""zonnx's opset adapters: rewrite the default-domain nodes whose signature or meaning changed (opset 7 on).

The rule: a node at opset ``src`` moving to ``dst`` passes through every adapter registered for
its op at a version ``v`` with ``since(op, src) < v <= dst``, in version order; an op without an
adapter only gets re-versioned, because its later versions merely add types or attributes whose
defaults keep the old behaviour (checked against onnx's schema history). What changed:

- attributes that became inputs: Slice/TopK (10), Clip min/max and Pad pads/value (11), Dropout
  ratio (12), Split split, Squeeze/Unsqueeze/ReduceSum axes (13), the other Reduce* axes (18),
  DFT axis (20);
- Softmax/LogSoftmax/Hardmax (13): before, the input is coerced to 2-D at ``axis`` and each row is
  normalized; after, only ``axis`` is. Same result when ``axis`` is the last dim; otherwise
  ``Reshape(Op(Flatten(x, axis), axis=1), Shape(x))``;
- Upsample-7/9 and Resize-10 -> Resize: asymmetric coordinates; ORT's old nearest rounding
  (truncate when upsampling, round up when downsampling) as nearest_mode floor/ceil;
- BatchNormalization: ``spatial`` removed (9; spatial=0 refused), training outputs removed (14);
- Scatter -> ScatterElements (11), RoiAlign's old output_half_pixel mode kept (16), GridSample
  bilinear/bicubic -> linear/cubic (20), GroupNormalization scale/bias per group -> per channel (21);
- refused: Scan-8, Dropout-7's mask when used (it becomes bool at 10), ops removed at ``dst``,
  and below opset 7 any op whose schema changed at 7.

New constant inputs are initializers in the main graph and Constant nodes in subgraphs and functions.
"""

from __future__ import annotations

__all__ = ["FIRST_ADAPTED_OPSET", "ADAPTED_OPS", "Refused", "Rewriter", "schema_since"]

import logging
from collections.abc import Callable, Iterator

import numpy as np
import onnx
import onnx_ir as ir

from zonnx.ir.io import MIN_OPSET, default_opset
from zonnx.passes.base import Changes

logger = logging.getLogger(__name__)

#: Opset the adapters start from; below it only ops unchanged up to this opset are handled.
FIRST_ADAPTED_OPSET = MIN_OPSET

#: Ops whose adapters need the input's dtype or shape.
_NEEDS_TYPES = frozenset({"Clip", "Pad", "Softmax", "LogSoftmax", "Hardmax", "GroupNormalization"})


class Refused(Exception):
    """A node the adapters cannot rewrite; the message says why."""


def schema_since(op: str, opset: int) -> int | None:
    """The since_version of ``op``'s schema in force at ``opset``, or None when no such op exists."""
    try:
        return onnx.defs.get_schema(op, opset, "").since_version
    except onnx.defs.SchemaError:
        return None


class Rewriter:
    """Rewrites the default-domain nodes of one model (graph, subgraphs, functions) to opset ``dst``."""

    def __init__(self, model: ir.Model, dst: int) -> None:
        self.model, self.dst = model, dst
        self.changes = Changes()
        self.refused: list[str] = []
        self._names = {v.name for g in (model.graph, *model.functions.values()) for v in _values(g)}
        self._names |= {v for v in model.graph.initializers}
        self._inferred: dict[str, ir.Value] = {}

    # -- helpers the adapters use --------------------------------------------------------------
    def unique(self, hint: str) -> str:
        name, i = hint, 0
        while name in self._names:
            i += 1
            name = f"{hint}_{i}"
        self._names.add(name)
        return name

    def const(self, node: ir.Node, array: np.ndarray, hint: str) -> ir.Value:
        """A constant input for ``node``: an initializer in the main graph, a Constant node elsewhere."""
        name = self.unique(hint)
        tensor = ir.tensor(array, name=name)
        if node.graph is self.model.graph:
            value = ir.val(name, const_value=tensor)
            self.model.graph.register_initializer(value)
            return value
        const = ir.node("Constant", [], {"value": tensor}, name=self.unique(f"{hint}_node"))
        const.outputs[0].name = name
        node.graph.insert_before(node, const)
        return const.outputs[0]

    def _infer_types(self) -> None:
        """Type the untouched model once with onnx's inference, for adapters that need dtypes or ranks."""
        try:
            proto = onnx.shape_inference.infer_shapes(ir.serde.serialize_model(self.model))
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError) as e:
            logger.info("onnx shape inference failed (%s); adapters see declared types only", e)
            return
        inferred = ir.serde.deserialize_model(proto)
        self._inferred = {v.name: v for g in inferred.graphs() for v in _values(g)}

    def dtype(self, value: ir.Value) -> ir.DataType | None:
        twin = self._inferred.get(value.name)
        return value.dtype or (twin.dtype if twin is not None else None)

    def shape(self, value: ir.Value) -> ir.Shape | None:
        twin = self._inferred.get(value.name)
        return value.shape or (twin.shape if twin is not None else None)

    # -- the walk ------------------------------------------------------------------------------
    def run(self) -> None:
        scopes: list[tuple[int, list[ir.Node]]] = [
            (default_opset(self.model), list(ir.traversal.RecursiveGraphIterator(self.model.graph)))
        ]
        for func in self.model.functions.values():
            src = func.opset_imports.get("", func.opset_imports.get("ai.onnx"))
            if src is not None:
                scopes.append((src, list(ir.traversal.RecursiveGraphIterator(func))))
        if any(n.op_type in _NEEDS_TYPES for _, nodes in scopes for n in nodes):
            self._infer_types()
        for src, nodes in scopes:
            for node in nodes:
                if node.domain == "" and src < self.dst:
                    self._rewrite(node, src)
        if self.refused:
            return
        for g in (self.model.graph, *self.model.functions.values()):
            for key in ("", "ai.onnx"):
                if key in g.opset_imports:
                    g.opset_imports[key] = self.dst
        for _, nodes in scopes:
            for node in nodes:
                node.version = None

    def _rewrite(self, node: ir.Node, src: int) -> None:
        since = schema_since(node.op_type, src)
        label = f"node {node.name or '(unnamed)'} ({node.op_type}-{since})"
        if since is None:
            self.refused.append(f"{label}: {node.op_type} is not an ONNX op at opset {src}")
            return
        first = schema_since(node.op_type, FIRST_ADAPTED_OPSET)
        if src < FIRST_ADAPTED_OPSET and since != first:
            self.refused.append(
                f"{label}: {node.op_type} changed at opset {first} and zonnx's adapters start at "
                f"opset {FIRST_ADAPTED_OPSET}"
            )
            return
        try:
            original = node.op_type
            for ops, version, adapter in _ADAPTERS:
                if original in ops and since < version <= self.dst:
                    what = adapter(self, node, src)
                    if what:
                        self.changes.add(what)
            if (
                schema_since(node.op_type, self.dst) is None
                or onnx.defs.get_schema(node.op_type, self.dst, "").deprecated
            ):
                raise Refused(f"{node.op_type} is removed by opset {self.dst} and has no adapter")
        except Refused as e:
            self.refused.append(f"{label}: {e}")


def _values(graph: ir.Graph | ir.Function) -> Iterator[ir.Value]:
    """Every named value of a graph or function, its subgraphs included."""
    g = graph if isinstance(graph, ir.Graph) else graph.graph
    yield from (v for v in g.inputs if v.name)
    for node in ir.traversal.RecursiveGraphIterator(g):
        for sub in node.attributes.values():
            if sub.type == ir.AttributeType.GRAPH:
                yield from (v for v in sub.value.inputs if v.name)
        yield from (v for v in node.outputs if v.name)


# -- adapters: each rewrites one node in place and returns what it did (None: nothing) -------
def _attrs_to_inputs(
    rw: Rewriter, node: ir.Node, slots: dict[str, tuple[int, type | np.dtype]]
) -> str | None:
    """Move attributes to the input slots that replaced them (``{"axes": (1, np.int64)}``)."""
    moved = []
    for attr, (index, dtype) in slots.items():
        a = node.attributes.get(attr)
        if a is None:
            continue
        if a.is_ref():
            raise Refused(f"attribute {attr} refers to a function attribute ({a.ref_attr_name})")
        node.attributes.pop(attr)
        array = np.array(a.value, dtype=dtype)
        value = rw.const(node, array, f"{node.name or node.op_type}_{attr}")
        if len(node.inputs) <= index:
            node.resize_inputs(index + 1)
        node.replace_input_with(index, value)
        moved.append(attr)
    return f"rewrote {node.op_type} {'/'.join(moved)} to input{'s' * (len(moved) > 1)}" if moved else None


def _axes_to_input(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    return _attrs_to_inputs(rw, node, {"split" if node.op_type == "Split" else "axes": (1, np.int64)})


def _float_dtype(rw: Rewriter, node: ir.Node) -> np.dtype:
    dtype = rw.dtype(node.inputs[0])
    if dtype is None:
        raise Refused("the input's element type is unknown, so min/max/value cannot be typed")
    return dtype.numpy()


def _clip(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    dtype = _float_dtype(rw, node)
    return _attrs_to_inputs(rw, node, {"min": (1, dtype), "max": (2, dtype)})


def _pad(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    value = node.attributes.get("value")
    if value is not None and value.value == 0.0:
        node.attributes.pop("value")
    dtype = _float_dtype(rw, node) if "value" in node.attributes else np.float32
    return _attrs_to_inputs(rw, node, {"pads": (1, np.int64), "value": (2, dtype)})


def _slice(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    return _attrs_to_inputs(rw, node, {"starts": (1, np.int64), "ends": (2, np.int64), "axes": (3, np.int64)})


def _topk(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    k = node.attributes.get("k")
    if k is not None and not k.is_ref():
        node.attributes["k"] = ir.AttrInt64s("k", [k.value])
    return _attrs_to_inputs(rw, node, {"k": (1, np.int64)})


def _dft(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    if "axis" not in node.attributes:
        node.attributes["axis"] = ir.AttrInt64("axis", 1)  # DFT-17's default; DFT-20's is -2
    return _attrs_to_inputs(rw, node, {"axis": (2, np.int64)})


def _used(value: ir.Value) -> bool:
    return bool(value.uses()) or value.is_graph_output()


def _dropout_mask(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    if len(node.outputs) > 1 and _used(node.outputs[1]):
        raise Refused("its mask output is used and changes type from the data type to bool at opset 10")
    return None


def _dropout_ratio(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    return _attrs_to_inputs(rw, node, {"ratio": (1, np.float32)})


def _bn_spatial(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    spatial = node.attributes.pop("spatial", None)
    if spatial is None:
        return None
    if spatial.value == 0:
        raise Refused("spatial=0 (per-activation statistics) has no equivalent from opset 9 on")
    return "removed BatchNormalization spatial attribute"


def _bn_outputs(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    if len(node.outputs) == 1:
        return None
    if any(_used(v) for v in node.outputs[1:]):
        raise Refused("its training outputs (mean, var, saved_mean, saved_var) are used")
    node.resize_outputs(1)
    return "dropped unused BatchNormalization training outputs"


def _softmax(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    """Old semantics: coerce to 2-D at ``axis`` and normalize rows; new: normalize along ``axis`` only."""
    attr = node.attributes.get("axis")
    if attr is not None and attr.is_ref():
        raise Refused(f"attribute axis refers to a function attribute ({attr.ref_attr_name})")
    axis = 1 if attr is None else attr.value
    x = node.inputs[0]
    shape = rw.shape(x)
    rank = None if shape is None else len(shape)
    if axis == -1 or (rank is not None and axis % max(rank, 1) == rank - 1):
        if attr is None:
            node.attributes["axis"] = ir.AttrInt64("axis", axis)
            return f"set {node.op_type} axis explicitly"
        return None
    base = node.name or node.op_type
    flat = ir.node("Flatten", [x], {"axis": axis}, name=rw.unique(f"{base}_flatten"))
    inner = ir.node(node.op_type, [flat.outputs[0]], {"axis": 1}, name=rw.unique(f"{base}_2d"))
    shape = ir.node("Shape", [x], name=rw.unique(f"{base}_shape"))
    back = ir.node("Reshape", [inner.outputs[0], shape.outputs[0]], name=rw.unique(f"{base}_reshape"))
    for n in (flat, inner, shape):
        n.outputs[0].name = rw.unique(f"{n.name}_out")
    ir.convenience.replace_nodes_and_values(
        node.graph, node, [node], [flat, inner, shape, back], [node.outputs[0]], [back.outputs[0]]
    )
    return f"wrapped {node.op_type} in Flatten/Reshape (axis semantics changed at opset 13)"


def _to_resize(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    """Upsample-7/9 and Resize-10 -> Resize-11+: asymmetric coordinates, ORT's old nearest rounding."""
    old = node.op_type
    mode = node.attributes.get("mode")
    mode_name = "nearest" if mode is None else mode.value
    if mode_name not in ("nearest", "linear"):
        raise Refused(f"mode {mode_name!r} has no Resize equivalent")
    if "scales" in node.attributes:  # Upsample-7
        scales_attr = node.attributes.pop("scales")
        scales = rw.const(node, np.array(scales_attr.value, np.float32), f"{node.name or old}_scales")
    else:
        scales = node.inputs[1]
    attrs = {"mode": mode_name, "coordinate_transformation_mode": "asymmetric"}
    if mode_name == "nearest" and old == "Upsample":
        attrs["nearest_mode"] = "floor"  # Upsample's scales are >= 1 and its kernels truncate
    elif mode_name == "nearest":
        tensor = ir.convenience.get_const_tensor(scales) if scales is not None else None
        if tensor is None:
            raise Refused("nearest mode with non-constant scales: the old rounding cannot be chosen")
        values = tensor.numpy().ravel()
        if (values >= 1).all():
            attrs["nearest_mode"] = "floor"  # old kernels truncate when upsampling ...
        elif (values <= 1).all():
            attrs["nearest_mode"] = "ceil"  # ... and round up when downsampling
        else:
            raise Refused(f"nearest mode with scales {values.tolist()} both up- and downsampling")
    node.op_type = "Resize"
    node.attributes.clear()
    for key, val in attrs.items():
        node.attributes[key] = ir.AttrString(key, val)
    node.resize_inputs(3)
    node.replace_input_with(2, scales)
    node.replace_input_with(1, None)
    return f"rewrote {old}-{schema_since(old, src)} as Resize"


def _scatter(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    node.op_type = "ScatterElements"
    return "renamed Scatter to ScatterElements"


def _roialign(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    if "coordinate_transformation_mode" in node.attributes:
        return None
    node.attributes["coordinate_transformation_mode"] = ir.AttrString(
        "coordinate_transformation_mode", "output_half_pixel"
    )
    return "kept RoiAlign's old coordinate mode (output_half_pixel)"


def _gridsample(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    mode = node.attributes.get("mode")
    old = "bilinear" if mode is None else mode.value
    new = {"bilinear": "linear", "bicubic": "cubic"}.get(old, old)
    node.attributes["mode"] = ir.AttrString("mode", new)
    return "renamed GridSample mode" if new != old or mode is None else None


def _groupnorm(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    """Opset 21 takes scale and bias per channel instead of per group: repeat constant ones."""
    groups = node.attributes["num_groups"].value
    shape = rw.shape(node.inputs[0])
    channels = shape[1] if shape is not None and len(shape) > 1 else None
    tensors = [ir.convenience.get_const_tensor(v) for v in node.inputs[1:3]]
    if not isinstance(channels, int) or any(t is None for t in tensors):
        raise Refused("scale/bias are not constants or the channel count is unknown")
    for i, t in enumerate(tensors, start=1):
        per_channel = np.repeat(t.numpy(), channels // groups)
        node.replace_input_with(i, rw.const(node, per_channel, f"{node.name or 'GroupNorm'}_{i}"))
    return "repeated GroupNormalization scale/bias per channel"


def _scan8(rw: Rewriter, node: ir.Node, src: int) -> str | None:
    raise Refused("Scan-8 (batched, with sequence_lens) has no adapter; re-export the model")


#: (op types, opset where the op changed incompatibly, adapter), applied in this order when
#: the node's version is older than that opset and the target is at least that opset.
_ADAPTERS: list[tuple[frozenset[str], int, Callable[[Rewriter, ir.Node, int], str | None]]] = [
    (frozenset({"BatchNormalization"}), 9, _bn_spatial),
    (frozenset({"Scan"}), 9, _scan8),
    (frozenset({"Dropout"}), 10, _dropout_mask),
    (frozenset({"Slice"}), 10, _slice),
    (frozenset({"TopK"}), 10, _topk),
    (frozenset({"Upsample"}), 10, _to_resize),
    (frozenset({"Clip"}), 11, _clip),
    (frozenset({"Pad"}), 11, _pad),
    (frozenset({"Resize"}), 11, _to_resize),
    (frozenset({"Scatter"}), 11, _scatter),
    (frozenset({"Dropout"}), 12, _dropout_ratio),
    (frozenset({"Split", "Squeeze", "Unsqueeze", "ReduceSum"}), 13, _axes_to_input),
    (frozenset({"Softmax", "LogSoftmax", "Hardmax"}), 13, _softmax),
    (frozenset({"BatchNormalization"}), 14, _bn_outputs),
    (frozenset({"RoiAlign"}), 16, _roialign),
    (
        frozenset({f"Reduce{k}" for k in ("Max", "Min", "Mean", "Prod", "L1", "L2", "LogSum")})
        | {"ReduceLogSumExp", "ReduceSumSquare"},
        18,
        _axes_to_input,
    ),
    (frozenset({"GridSample"}), 20, _gridsample),
    (frozenset({"DFT"}), 20, _dft),
    (frozenset({"GroupNormalization"}), 21, _groupnorm),
]

#: Op types with an adapter (the rest of the default domain is only re-versioned).
ADAPTED_OPS: frozenset[str] = frozenset().union(*(ops for ops, _, _ in _ADAPTERS))
