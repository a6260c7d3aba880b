"""Remove nodes that compute their input unchanged (Identity, Dropout, same-type Cast, x*1, ...)."""

from __future__ import annotations

__all__ = ["RemoveNoOpsPass"]

import logging
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from zonnx.passes.base import Changes, ZonnxPass
from zonnx.passes.common.constant_folding import StaticInfo, constant_array, describe

logger = logging.getLogger(__name__)

_ONNX_DOMAINS = ("", "ai.onnx")
#: A Slice end at or beyond this is "to the end" on any real tensor.
_TO_END = 2**31 - 1
_SHAPE_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})

#: A rule returns (what to count, the value the node's output equals) or None when it is not a no-op.
Verdict = tuple[str, ir.Value] | None


def _attr(node: ir.Node, name: str, default=None):
    attr = node.attributes.get(name)
    return default if attr is None or attr.is_ref() else attr.value


def _sole_use_producer(value: ir.Value | None, ops: frozenset[str] | set[str]) -> ir.Node | None:
    """The producer of ``value`` if it is one of ``ops``, in the same graph, and ``value`` has one use."""
    if value is None:
        return None
    node = value.producer()
    if node is None or node.op_type not in ops or node.domain not in _ONNX_DOMAINS:
        return None
    if value.is_graph_output() or len(value.uses()) != 1:
        return None
    return node


def _axes(node: ir.Node) -> list[int] | None:
    """Axes of Squeeze/Unsqueeze from the attribute (opset < 13) or the constant second input."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        arr = constant_array(node.inputs[1])
        return None if arr is None else [int(a) for a in arr.ravel()]
    axes = _attr(node, "axes")
    return None if axes is None else list(axes)


def _normalized(axes: list[int] | None, rank: int | None) -> set[int] | None:
    if axes is None or (rank is None and any(a < 0 for a in axes)):
        return None
    return {a + rank if a < 0 else a for a in axes}  # type: ignore[operator]


def _rank(info: StaticInfo, value: ir.Value | None) -> int | None:
    dims = info.dims(value)
    return None if dims is None else len(dims)


def _identity(node: ir.Node, info: StaticInfo) -> Verdict:
    return ("Identity", node.inputs[0]) if node.inputs and node.inputs[0] is not None else None


def _concat(node: ir.Node, info: StaticInfo) -> Verdict:
    return ("Concat of one input", node.inputs[0]) if len(node.inputs) == 1 else None


def _cast(node: ir.Node, info: StaticInfo) -> Verdict:
    src = info.dtype(node.inputs[0])
    if node.op_type == "CastLike":
        same = src is not None and src == info.dtype(node.inputs[1])
    else:
        same = src is not None and src.value == _attr(node, "to")
    return (f"{node.op_type} to the same type", node.inputs[0]) if same else None


def _transpose(node: ir.Node, info: StaticInfo) -> Verdict:
    perm, rank = _attr(node, "perm"), _rank(info, node.inputs[0])
    same = list(perm) == list(range(len(perm))) if perm is not None else rank is not None and rank <= 1
    return ("Transpose with identity perm", node.inputs[0]) if same else None


def _pad(node: ir.Node, info: StaticInfo) -> Verdict:
    pads = constant_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if pads is None and len(node.inputs) == 1:
        pads = np.array(_attr(node, "pads", [1]))
    return ("Pad with zero pads", node.inputs[0]) if pads is not None and not pads.any() else None


def _broadcast_keeps(x_dims, const_shape: tuple[int, ...]) -> bool:
    """Whether broadcasting x with a tensor of ``const_shape`` leaves x's shape as it is."""
    if not const_shape:
        return True
    if x_dims is None or len(const_shape) > len(x_dims):
        return False
    return all(c == 1 or c == d for c, d in zip(const_shape[::-1], x_dims[::-1], strict=False))


def _arith(node: ir.Node, info: StaticInfo) -> Verdict:
    """x*1, 1*x, x+0, 0+x, x-0, x/1 when the constant does not broadcast x to a bigger shape."""
    neutral = {"Mul": 1, "Div": 1, "Add": 0, "Sub": 0}[node.op_type]
    sides = [(0, 1), (1, 0)] if node.op_type in ("Mul", "Add") else [(0, 1)]
    for x_i, c_i in sides:
        const = constant_array(node.inputs[c_i])
        if const is None or const.dtype.kind not in "fiu" or not np.all(const == neutral):
            continue
        x = node.inputs[x_i]
        if info.dtype(x) is not None and info.dtype(x).numpy() != const.dtype:  # type: ignore[union-attr]
            continue
        if _broadcast_keeps(info.dims(x), const.shape):
            word = "by" if node.op_type in ("Mul", "Div") else "of"
            return (f"{node.op_type} {word} {neutral}", x)
    return None


def _expand(node: ir.Node, info: StaticInfo) -> Verdict:
    shape = constant_array(node.inputs[1])
    if shape is None or not _broadcast_keeps(info.dims(node.inputs[0]), tuple(int(s) for s in shape)):
        return None
    return ("Expand to the same shape", node.inputs[0])


def _slice(node: ir.Node, info: StaticInfo) -> Verdict:
    """A Slice is whole when each sliced axis starts at 0, steps by 1 and ends at or past its end."""
    if len(node.inputs) > 1:
        args = [None if v is None else constant_array(v) for v in node.inputs[1:5]]
        if len(args) < 2 or any(
            v is not None and a is None for v, a in zip(node.inputs[1:5], args, strict=False)
        ):
            return None
        starts, ends = args[0].tolist(), args[1].tolist()  # type: ignore[union-attr]
        axes = args[2].tolist() if len(args) > 2 and args[2] is not None else list(range(len(starts)))
        steps = args[3].tolist() if len(args) > 3 and args[3] is not None else [1] * len(starts)
    else:
        starts, ends = _attr(node, "starts", []), _attr(node, "ends", [])
        axes, steps = _attr(node, "axes", list(range(len(starts)))), [1] * len(starts)
    dims = info.dims(node.inputs[0])
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=False):
        dim = dims[axis] if dims is not None and -len(dims) <= axis < len(dims) else None
        known = isinstance(dim, int)
        if step != 1 or not (start == 0 or (known and start <= -dim)):  # type: ignore[operator]
            return None
        if not (end >= _TO_END or (known and end >= dim)):  # type: ignore[operator]
            return None
    return ("Slice of the whole tensor", node.inputs[0])


def _reshape_same(dims, target: list[int], allowzero: int) -> bool:
    """Reshape keeps the shape when each target entry copies (0), matches, or is the one -1."""
    if dims is None or len(dims) != len(target):
        return False
    wildcards = 0
    for d, t in zip(dims, target, strict=True):
        if t == -1:
            wildcards += 1
        elif not ((t == 0 and not allowzero) or (isinstance(d, int) and d == t)):
            return False
    return wildcards <= 1


def _flatten(node: ir.Node, info: StaticInfo) -> Verdict:
    dims, axis = info.dims(node.inputs[0]), _attr(node, "axis", 1)
    if dims is None or len(dims) != 2:
        return None
    axis = axis + 2 if axis < 0 else axis
    same = axis == 1 or (axis == 0 and dims[0] == 1) or (axis == 2 and dims[1] == 1)
    return ("Flatten of a matrix", node.inputs[0]) if same else None


def _squeeze_pair(node: ir.Node, info: StaticInfo) -> Verdict:
    """Unsqueeze(a) then Squeeze(a), or Squeeze(a) then Unsqueeze(a): the pair is the identity."""
    first_op = "Unsqueeze" if node.op_type == "Squeeze" else "Squeeze"
    first = _sole_use_producer(node.inputs[0], {first_op})
    if first is None:
        return None
    src = first.inputs[0]
    first_axes, axes = _axes(first), _axes(node)
    if first_op == "Squeeze" and first_axes is None:  # squeeze-all: the axes are the static 1-dims
        dims = info.dims(src)
        if dims is None or not all(isinstance(d, int) for d in dims):
            return None
        first_axes = [i for i, d in enumerate(dims) if d == 1]
    rank_in = _rank(info, src)
    big = (
        (rank_in + len(first_axes))
        if first_op == "Unsqueeze" and rank_in is not None and first_axes
        else rank_in
    )
    a, b = _normalized(first_axes, big), _normalized(axes, big)
    return (f"{first_op}+{node.op_type} pair", src) if a is not None and a == b and a else None


def _reshape(node: ir.Node, info: StaticInfo) -> Verdict:
    target = constant_array(node.inputs[1])
    if target is None:
        return None
    allowzero = _attr(node, "allowzero", 0)
    if _reshape_same(info.dims(node.inputs[0]), target.tolist(), allowzero):
        return ("Reshape to the same shape", node.inputs[0])
    return None


def _dropout(node: ir.Node, info: StaticInfo) -> Verdict | str:
    """Dropout is the identity in inference mode; its mask output must be unused."""
    if _attr(node, "is_test", 1) == 0:  # opset < 7 training flag
        return "is_test is 0 (training mode)"
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        mode = constant_array(node.inputs[2])
        if mode is None or mode.any():
            return "training_mode is not a constant false"
    if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
        return f"its mask output {node.outputs[1].name!r} is used"
    return ("Dropout", node.inputs[0])


_RULES: dict[str, Callable[[ir.Node, StaticInfo], Verdict | str]] = {
    "Identity": _identity,
    "Dropout": _dropout,
    "Cast": _cast,
    "CastLike": _cast,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Squeeze": _squeeze_pair,
    "Unsqueeze": _squeeze_pair,
    "Pad": _pad,
    "Mul": _arith,
    "Div": _arith,
    "Add": _arith,
    "Sub": _arith,
    "Transpose": _transpose,
    "Expand": _expand,
    "Concat": _concat,
    "Slice": _slice,
}


def _bypass(node: ir.Node, source: ir.Value) -> str | None:
    """Point users of the node's output at ``source`` and remove the node; return why not if impossible.

    When the output is a graph output, ``source`` takes its name and declared type, which needs a
    ``source`` made by another node of the same graph that is not itself a graph output.
    """
    graph, out = node.graph, node.outputs[0]
    assert graph is not None
    if not out.is_graph_output():
        out.replace_all_uses_with(source)
        graph.remove(node, safe=True)
        return None
    producer = source.producer()
    if source.is_graph_output() or source.is_graph_input() or producer is None or producer.graph is not graph:
        return f"its output {out.name!r} is a graph output fed directly by {source.name!r}"
    name = out.name
    if out.type is not None:
        source.type = out.type
    if out.shape is not None:
        source.shape = out.shape
    out.replace_all_uses_with(source, replace_graph_outputs=True)
    graph.remove(node, safe=True)
    out.name = None
    source.name = name
    return None


def _merge_into_reshape(node: ir.Node) -> tuple[str, list[ir.Value | None]] | None:
    """Reshape(f(x), s) with f a shape-only op used only here and s constant without 0: f is redundant."""
    first = _sole_use_producer(node.inputs[0], _SHAPE_OPS)
    target = constant_array(node.inputs[1])
    if first is None or target is None or first.graph is not node.graph:
        return None
    if (target == 0).any() and not _attr(node, "allowzero", 0):
        return None
    graph, inputs = first.graph, list(first.inputs)
    node.replace_input_with(0, first.inputs[0])
    graph.remove(first, safe=True)  # type: ignore[union-attr]
    return f"{first.op_type} before Reshape", inputs


def _drop_orphan_constants(graph: ir.Graph, values: list[ir.Value | None]) -> int:
    """Remove constants (initializers, Constant nodes) that a removed node was the last user of."""
    count = 0
    for value in values:
        if value is None or value.uses() or value.is_graph_output() or value.is_graph_input():
            continue
        producer = value.producer()
        if value.is_initializer() and value.graph is graph and value.name in graph.initializers:
            graph.initializers.pop(value.name)
            count += 1
        elif producer is not None and producer.op_type == "Constant" and producer.graph is graph:
            graph.remove(producer, safe=True)
            count += 1
    return count


class RemoveNoOpsPass(ZonnxPass):
    """Remove nodes whose output equals their input, in the main graph and in subgraphs.

    Rules: Identity; Dropout in inference mode with an unused mask; Cast/CastLike to the same type;
    Reshape to the same shape; Reshape/Flatten/Squeeze/Unsqueeze feeding only a constant Reshape;
    Unsqueeze+Squeeze and Squeeze+Unsqueeze on the same axes; Flatten of a matrix; Pad with zero pads;
    x*1, x/1, x+0, x-0 when the constant does not broadcast x; identity Transpose; Expand to the same
    shape; Concat of one input; Slice of the whole tensor. Graph outputs keep their names (the producer
    of the input is renamed); a node between a graph input and a graph output is kept (a miss).
    Counts are per rule: ``removed Identity``, ``removed Mul by 1``, ...
    """

    name = "remove-noops"
    max_sweeps = 4

    def apply(self, model: ir.Model) -> Changes:
        changes = Changes()
        info = StaticInfo.of(model)
        for graph in list(model.graphs()):
            for _ in range(self.max_sweeps):
                if not self._sweep(graph, info, changes):
                    break
        return changes

    def _sweep(self, graph: ir.Graph, info: StaticInfo, changes: Changes) -> int:
        removed = 0
        missed: set[str] = set()
        for node in list(graph):
            if node.graph is not graph or node.domain not in _ONNX_DOMAINS or node.op_type not in _RULES:
                continue
            if node.op_type == "Reshape" and (merged := _merge_into_reshape(node)):
                changes.add(f"removed {merged[0]}")
                changes.add("removed constant left unused", _drop_orphan_constants(graph, merged[1]))
                removed += 1
            verdict = _RULES[node.op_type](node, info)
            if verdict is None:
                continue
            if isinstance(verdict, str):
                missed.add(f"{describe(node)}: {verdict}; kept")
                continue
            kind, source = verdict
            first = node.inputs[0].producer() if "pair" in kind else None
            inputs = list(node.inputs) + (list(first.inputs) if first is not None else [])
            why = _bypass(node, source)
            if why is not None:
                missed.add(f"{describe(node)}: {why}; kept")
                continue
            if first is not None and first.graph is graph and not first.outputs[0].uses():
                graph.remove(first, safe=True)
            changes.add(f"removed {kind}")
            changes.add("removed constant left unused", _drop_orphan_constants(graph, inputs))
            removed += 1
        if not removed:  # report misses once, from the sweep that found nothing more to do
            changes.misses.extend(sorted(missed))
        return removed
