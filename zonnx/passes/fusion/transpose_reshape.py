"""Cancel or merge adjacent Transpose, Reshape and Flatten nodes (layout shuffles left by exporters).

Rules, with ``T(x, p)`` a Transpose with perm p and ``R(x, s)`` a Reshape to shape s::

    T(T(x, p1), p2)  = T(x, p)   with p[i] = p1[p2[i]]; removed when p is the identity
    R(R(x, s1), s2)  = R(x, s2)  when the middle value has no other reader; a 0 in s2 (copy the input
                                 dim, allowzero=0) is replaced by the middle value's static dim; a -1
                                 needs no care (the element count is the same)
    R(Flatten(x), s) = Flatten(x) when s gives Flatten's 2-D shape again, else R(x, s)
    R(T(x, p), s)    = R(x, s)   when p moves only size-1 dims (the non-1 dims keep their order, so
                                 the Transpose does not move data)
    T(R(x, s), p)    = R(x, s')  under the same condition, s' the Transpose's static output shape
    R(x, s)          = x         when a merge above leaves a Reshape to x's own static shape

Shapes come from the graph (ONNX shape inference runs once when one is missing); rules needing a dim
that is not static record a miss. A removed value that was a graph output keeps its name.
"""

from __future__ import annotations

__all__ = ["CancelTransposeReshapePass"]

import dataclasses
import logging
import math

import numpy as np
import onnx_ir as ir

from zonnx.passes.base import Changes, ZonnxPass
from zonnx.passes.fusion.matching import (
    Context,
    Rule,
    const_array,
    drop,
    exclusive,
    label,
    producer,
    prune,
    replace_value,
    run_rules,
    set_attr,
)

logger = logging.getLogger(__name__)

Dims = tuple[int | None, ...]


@dataclasses.dataclass
class _Match:
    node: ir.Node
    prev: ir.Node


def _perm(ctx: Context, node: ir.Node) -> list[int] | None:
    """A Transpose's perm; the default (reversed dims) needs the input's rank."""
    perm = node.attributes.get_ints("perm", None)
    if perm is not None:
        return list(perm)
    rank = ctx.rank(node.inputs[0])
    return None if rank is None else list(range(rank))[::-1]


def _resolve(dims: Dims | None, target: np.ndarray, allowzero: int) -> Dims | None:
    """The output dims of a Reshape of a value with ``dims`` to ``target`` (None for unknown dims)."""
    out: list[int | None] = []
    for i, t in enumerate(int(v) for v in target.reshape(-1)):
        if t == 0 and not allowzero:
            out.append(dims[i] if dims is not None and i < len(dims) else None)
        else:
            out.append(t)
    if -1 in out:
        known = [d for d in out if d != -1]
        total = math.prod(dims) if dims is not None and None not in dims else None
        rest = math.prod(known) if None not in known else None
        out[out.index(-1)] = total // rest if total is not None and rest else None
    return tuple(out)


def _static(dims: Dims | None) -> tuple[int, ...] | None:
    return None if dims is None or None in dims else tuple(int(d) for d in dims)  # type: ignore[arg-type]


def _out_dims(ctx: Context, node: ir.Node) -> Dims | None:
    """Dims of a Reshape/Flatten/Transpose output: its recorded shape, else computed from its input."""
    dims = ctx.dims(node.outputs[0])
    if dims is not None and None not in dims:
        return dims
    src = ctx.dims(node.inputs[0])
    if node.op_type == "Reshape":
        shape = const_array(node.inputs[1])
        if shape is not None:
            return _resolve(src, shape, node.attributes.get_int("allowzero", 0))
    elif node.op_type == "Flatten" and src is not None:
        axis = node.attributes.get_int("axis", 1)
        axis = axis + len(src) if axis < 0 else axis
        head, tail = src[:axis], src[axis:]
        return (
            math.prod(head) if None not in head else None,  # type: ignore[arg-type]
            math.prod(tail) if None not in tail else None,  # type: ignore[arg-type]
        )
    elif node.op_type == "Transpose" and src is not None:
        perm = _perm(ctx, node)
        return None if perm is None else tuple(src[p] for p in perm)
    return dims


def _moves_only_ones(dims: Dims | None, perm: list[int]) -> bool:
    """Whether a Transpose of a value with ``dims`` keeps the non-1 dims in order (so it moves no data)."""
    if dims is None:
        return False
    kept = [p for p in perm if dims[p] != 1]
    return kept == sorted(kept)


def _target(ctx: Context, reshape: ir.Node, middle: Dims | None) -> tuple[np.ndarray | None, str]:
    """The Reshape's shape with 0s (copy from its input) replaced by ``middle``'s static dims."""
    shape = const_array(reshape.inputs[1])
    if shape is None:
        return None, f"the shape {reshape.inputs[1].name} is not constant"
    shape = shape.astype(np.int64).reshape(-1)
    if reshape.attributes.get_int("allowzero", 0) or 0 not in shape:
        return shape, ""
    for i in np.flatnonzero(shape == 0):
        if middle is None or i >= len(middle) or middle[i] is None:
            return (
                None,
                f"a 0 in {reshape.inputs[1].name} copies dim {i} of a value whose dims are not static",
            )
        shape[i] = middle[i]
    return shape, ""


def _set_shape(ctx: Context, reshape: ir.Node, shape: np.ndarray) -> None:
    if np.array_equal(const_array(reshape.inputs[1]), shape):
        return
    assert reshape.graph is not None
    hint = f"{(reshape.name or 'reshape').strip('/').replace('/', '_')}_shape"
    old = reshape.inputs[1]
    reshape.replace_input_with(1, ctx.initializer(reshape.graph, hint, shape.astype(np.int64)))
    prune([old])


def _bypass(node: ir.Node, source: ir.Value, prev: ir.Node) -> None:
    """Make ``node`` read ``source`` instead of ``prev``'s output; drop ``prev`` when nobody reads it."""
    node.replace_input_with(0, source)
    if not prev.outputs[0].uses() and not prev.outputs[0].is_graph_output():
        drop([prev])


def _cancel(node: ir.Node, source: ir.Value, prev: ir.Node) -> None:
    """Replace ``node``'s output with ``source``; drop ``node`` and ``prev`` when unread."""
    replace_value(node.outputs[0], source)
    drop([node])
    if not prev.outputs[0].uses() and not prev.outputs[0].is_graph_output():
        drop([prev])


class TransposePair(Rule[_Match]):
    """Replaces `Transpose(Transpose(x, p1), p2)` with `Transpose(x, p1[p2])`, or `x` for the identity."""

    anchor, what = "Transpose", "merged Transpose pair"

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        prev = producer(node.inputs[0], "Transpose")
        return None if prev is None else _Match(node, prev)

    def check(self, ctx: Context, m: _Match) -> str | None:
        p1, p2 = _perm(ctx, m.prev), _perm(ctx, m.node)
        if p1 is None or p2 is None:
            return f"{label(m.node)}: the rank of {m.prev.inputs[0].name} is unknown (Transpose without perm)"
        if [p1[i] for i in p2] == list(range(len(p2))):
            return None
        reason = exclusive([m.prev.outputs[0]], [m.node])
        return f"{label(m.node)}: not merged with {label(m.prev)}: {reason}" if reason else None

    def rewrite(self, ctx: Context, m: _Match) -> str | None:
        p1, p2 = _perm(ctx, m.prev), _perm(ctx, m.node)
        perm = [p1[i] for i in p2]
        if perm == list(range(len(perm))):
            _cancel(m.node, m.prev.inputs[0], m.prev)
            return "cancelled Transpose pair"
        set_attr(m.node, "perm", perm)
        _bypass(m.node, m.prev.inputs[0], m.prev)
        return None


class ReshapeChain(Rule[_Match]):
    """Replaces `Reshape(Reshape(x, s1), s2)` (or `Reshape(Flatten(x), s2)`) with `Reshape(x, s2)` or `x`."""

    anchor, what = "Reshape", "merged Reshape pair"

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        prev = producer(node.inputs[0], "Reshape", "Flatten")
        return None if prev is None else _Match(node, prev)

    def check(self, ctx: Context, m: _Match) -> str | None:
        middle = _out_dims(ctx, m.prev)
        target, reason = _target(ctx, m.node, middle)
        if target is None:
            return f"{label(m.node)}: not merged with {label(m.prev)}: {reason}"
        if m.prev.op_type == "Flatten" and _static(middle) and _resolve(middle, target, 1) == middle:
            return None
        reason = exclusive([m.prev.outputs[0]], [m.node])
        return f"{label(m.node)}: not merged with {label(m.prev)}: {reason}" if reason else None

    def rewrite(self, ctx: Context, m: _Match) -> str | None:
        middle = _out_dims(ctx, m.prev)
        target, _ = _target(ctx, m.node, middle)
        assert target is not None
        if m.prev.op_type == "Flatten" and _static(middle) and _resolve(middle, target, 1) == middle:
            replace_value(m.node.outputs[0], m.prev.outputs[0])
            drop([m.node])
            return "removed Reshape after Flatten"
        x = m.prev.inputs[0]
        src = _static(ctx.dims(x))
        if src is not None and _resolve(src, target, 1) == src:
            _cancel(m.node, x, m.prev)
            return f"cancelled {m.prev.op_type}+Reshape pair"
        _set_shape(ctx, m.node, target)
        _bypass(m.node, x, m.prev)
        return None if m.prev.op_type == "Reshape" else "merged Flatten+Reshape"


class ReshapeAfterTranspose(Rule[_Match]):
    """Replaces `Reshape(Transpose(x, p), s)` with `Reshape(x, s)` when p moves only size-1 dims."""

    anchor, what = "Reshape", "absorbed Transpose into Reshape"

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        prev = producer(node.inputs[0], "Transpose")
        if prev is None:
            return None
        perm = _perm(ctx, prev)
        ok = perm is not None and _moves_only_ones(ctx.dims(prev.inputs[0]), perm)
        return _Match(node, prev) if ok else None

    def check(self, ctx: Context, m: _Match) -> str | None:
        target, reason = _target(ctx, m.node, _out_dims(ctx, m.prev))
        reason = reason or exclusive([m.prev.outputs[0]], [m.node])
        return f"{label(m.node)}: {label(m.prev)} not absorbed: {reason}" if reason else None

    def rewrite(self, ctx: Context, m: _Match) -> str | None:
        target, _ = _target(ctx, m.node, _out_dims(ctx, m.prev))
        assert target is not None
        x = m.prev.inputs[0]
        src = _static(ctx.dims(x))
        if src is not None and _resolve(src, target, 1) == src:
            _cancel(m.node, x, m.prev)
            return "cancelled Transpose+Reshape pair"
        _set_shape(ctx, m.node, target)
        _bypass(m.node, x, m.prev)
        return None


class TransposeAfterReshape(Rule[_Match]):
    """Replaces `Transpose(Reshape(x, s), p)` with `Reshape(x, s')` when p moves only size-1 dims."""

    anchor, what = "Transpose", "absorbed Transpose into Reshape"

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        prev = producer(node.inputs[0], "Reshape")
        if prev is None:
            return None
        perm = _perm(ctx, node)
        ok = perm is not None and _moves_only_ones(_out_dims(ctx, prev), perm)
        return _Match(node, prev) if ok else None

    def check(self, ctx: Context, m: _Match) -> str | None:
        reason = exclusive([m.prev.outputs[0]], [m.node])
        out = _static(_out_dims(ctx, m.node))
        if not reason and (out is None or 0 in out):
            reason = f"the output dims of {label(m.node)} are not static and non-zero"
        return f"{label(m.node)}: not absorbed into {label(m.prev)}: {reason}" if reason else None

    def rewrite(self, ctx: Context, m: _Match) -> str | None:
        out = _static(_out_dims(ctx, m.node))
        assert out is not None
        x = m.prev.inputs[0]
        if _static(ctx.dims(x)) == out:
            _cancel(m.node, x, m.prev)
            return "cancelled Reshape+Transpose pair"
        _set_shape(ctx, m.prev, np.array(out, dtype=np.int64))
        set_attr(m.prev, "allowzero", 0, default=0)
        m.prev.outputs[0].shape = ir.Shape(out)
        replace_value(m.node.outputs[0], m.prev.outputs[0])
        drop([m.node])
        return None


class CancelTransposeReshapePass(ZonnxPass):
    """Merge or cancel adjacent Transpose/Reshape/Flatten nodes; exact (no arithmetic changes).

    Graph output names are preserved. No options.
    """

    name = "cancel-transpose-reshape"

    def apply(self, model: ir.Model) -> Changes:
        rules = [TransposePair(), TransposeAfterReshape(), ReshapeChain(), ReshapeAfterTranspose()]
        return run_rules(model, rules)
