"""Fold constant scales and offsets next to a Conv into its weight and bias.

Exporters write per-tensor or per-channel affine maps as their own Mul/Add nodes (PaddlePaddle's
"learnable affine block" in PP-LCNetV3: ``Conv -> Mul(a) -> Add(b)`` and ``act -> Mul(a) -> Add(b) -> Conv``).
Quantized, every such node adds a rounding step; folded, none. With W [M, C/g, k...], bias b [M], group g,
and ``in(m, j) = (m // (M/g)) * (C/g) + j`` the input channel that row m, column j of W reads:

- after the Conv, ``Mul(y, a)`` (a scalar or per output channel): ``W'[m] = a[m] W[m]``, ``b' = a b``;
- after the Conv, ``Add(y, d)``: ``b' = b + d``;
- before the Conv, ``Mul(x, a)`` (scalar or per input channel): ``W'[m, j] = a[in(m, j)] W[m, j]``. Exact
  with zero padding too, since ``a * 0 = 0``;
- before the Conv, ``Add(x, d)`` when every pad is 0: ``b'[m] = b[m] + sum_{j,k} W[m, j, k] d[in(m, j)]``.
  With padding the border would see ``d`` where it saw 0, so the Add stays;
- before a padded Conv, ``Add(Mul(x, a), d)`` with every ``a`` non-zero becomes ``Add(x, d / a)`` and the
  scale ``a`` moves into W (``a x + d = a (x + d / a)``): one node instead of two.

A constant qualifies when it broadcasts along axis 1 only (shape ``[]``, ``[1]``, ``[C, 1, 1]``,
``[1, C, 1, 1]``, ...). The node between must have the Conv as its only reader, and W and b must be
read by this Conv only. Values are computed in float64 and cast back to W's dtype.
"""

from __future__ import annotations

__all__ = ["FoldConvAffinePass"]

import dataclasses
import logging

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
    other_input,
    producer,
    prune,
    replace_value,
    replace_with_meaning,
    run_rules,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Match:
    conv: ir.Node
    node: ir.Node  # the Mul or Add folded
    const: ir.Value  # its constant operand
    inner: ir.Node | None = None  # the Mul under an Add before a padded Conv


def _channels(arr: np.ndarray | None, rank: int, channels: int) -> np.ndarray | None:
    """``arr`` as a float64 [channels] vector when it broadcasts along axis 1 only of a rank-``rank`` value."""
    if arr is None or arr.dtype.kind != "f" or arr.ndim > rank:
        return None
    shape = (1,) * (rank - arr.ndim) + arr.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(arr.astype(np.float64).reshape(-1), (channels,)).copy()


def _conv_params(conv: ir.Node) -> tuple[np.ndarray, np.ndarray] | str:
    """(W, b) of a Conv whose weight and bias are constants read only by it, or the reason not."""
    w = const_array(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if w is None or w.dtype.kind != "f" or w.ndim < 3:
        return f"{label(conv)}: the weight is not a float constant"
    values = [conv.inputs[1]]
    b = np.zeros(w.shape[0], dtype=w.dtype)
    if len(conv.inputs) > 2 and conv.inputs[2] is not None:
        b = const_array(conv.inputs[2])
        if b is None or b.shape != (w.shape[0],):
            return f"{label(conv)}: the bias is not a constant of shape [{w.shape[0]}]"
        values.append(conv.inputs[2])
    reason = exclusive(values, [conv])
    return f"{label(conv)}: {reason}" if reason else (w, b)


def _input_index(w: np.ndarray, group: int) -> np.ndarray:
    """in(m, j): the input channel that W[m, j] reads, as an [M, C/g] integer array."""
    m_out, c_g = w.shape[0], w.shape[1]
    rows = np.arange(m_out)[:, None] // (m_out // group)
    return rows * c_g + np.arange(c_g)[None, :]


def _unpadded(conv: ir.Node) -> bool:
    pads = conv.attributes.get_ints("pads", None)
    auto = conv.attributes.get_string("auto_pad", "NOTSET")
    return auto in ("NOTSET", "VALID") and (not pads or not any(pads))


def _set_params(ctx: Context, conv: ir.Node, w: np.ndarray, b: np.ndarray, dtype: np.dtype) -> None:
    graph = conv.graph
    assert graph is not None
    old = list(conv.inputs[1:3])
    name = old[0].name if old[0] is not None else "weight"
    w_value = ctx.initializer(graph, f"{name}_affine", w.astype(dtype))
    b_value = ctx.initializer(graph, f"{name}_affine_bias", b.astype(dtype))
    if len(conv.inputs) < 3:
        conv.resize_inputs(3)
    conv.replace_input_with(1, w_value)
    conv.replace_input_with(2, b_value)
    prune(old)


class _ConvRule(Rule[_Match]):
    """Checks shared by the rules: a foldable Conv, and the value between it and the folded node read
    only by the two of them."""

    def check(self, ctx: Context, m: _Match) -> str | None:
        params = _conv_params(m.conv)
        if isinstance(params, str):
            return params
        if m.node.outputs[0] in m.conv.inputs:  # before the Conv: the folded nodes' outputs
            between = [m.node, m.inner] if m.inner is not None else [m.node]
            values = [n.outputs[0] for n in between]
        else:  # after the Conv: its output
            between, values = [m.node], [m.conv.outputs[0]]
        reason = exclusive(values, [m.conv, *between])
        return f"{label(m.node)}: not folded into {label(m.conv)}: {reason}" if reason else None


class _OutputRule(_ConvRule):
    """A Mul or Add of a scalar or per-output-channel constant on a Conv's output."""

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        for value in node.inputs:
            conv = producer(value, "Conv")
            if conv is not None and const_array(other_input(node, value)) is not None:
                return _Match(conv, node, other_input(node, value))
        return None

    def check(self, ctx: Context, m: _Match) -> str | None:
        reason = super().check(ctx, m)
        if reason:
            return reason
        w = const_array(m.conv.inputs[1])
        if _channels(const_array(m.const), w.ndim, w.shape[0]) is None:
            return f"{label(m.node)}: {m.const.name} is not a scalar or per-output-channel constant"
        return None


class OutputScale(_OutputRule):
    """Replaces `Mul(Conv(x), a)` with `Conv'(x)`."""

    anchor = "Mul"
    what = "folded Mul after Conv"

    def rewrite(self, ctx: Context, m: _Match) -> None:
        w, b = _conv_params(m.conv)  # type: ignore[misc]
        a = _channels(const_array(m.const), w.ndim, w.shape[0])
        assert a is not None
        shape = (-1,) + (1,) * (w.ndim - 1)
        _set_params(ctx, m.conv, w.astype(np.float64) * a.reshape(shape), b * a, w.dtype)
        replace_with_meaning(m.node.outputs[0], m.conv.outputs[0], [m.node])


class OutputOffset(_OutputRule):
    """Replaces `Add(Conv(x), d)` with `Conv'(x)`."""

    anchor = "Add"
    what = "folded Add after Conv"

    def rewrite(self, ctx: Context, m: _Match) -> None:
        w, b = _conv_params(m.conv)  # type: ignore[misc]
        d = _channels(const_array(m.const), w.ndim, w.shape[0])
        assert d is not None
        _set_params(ctx, m.conv, w, b.astype(np.float64) + d, w.dtype)
        replace_with_meaning(m.node.outputs[0], m.conv.outputs[0], [m.node])


class InputAffine(_ConvRule):
    """Replaces `Conv(Mul(x, a))` with `Conv'(x)`, `Conv(Add(x, d))` (no padding) with `Conv'(x)`, and
    `Conv(Add(Mul(x, a), d))` (padding) with `Conv'(Add(x, d / a))`."""

    anchor = "Conv"
    what = "folded Mul/Add before Conv"

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        src = producer(node.inputs[0], "Mul", "Add")
        if src is None:
            return None
        for value in src.inputs:
            const = other_input(src, value)
            if const is not None and const_array(const) is not None and const_array(value) is None:
                inner = None
                if src.op_type == "Add" and not _unpadded(node):
                    inner = producer(value, "Mul")
                    if inner is None or not any(const_array(v) is not None for v in inner.inputs):
                        return None
                return _Match(node, src, const, inner)
        return None

    def _in_channels(self, m: _Match) -> int:
        w = const_array(m.conv.inputs[1])
        return w.shape[1] * m.conv.attributes.get_int("group", 1)

    def check(self, ctx: Context, m: _Match) -> str | None:
        reason = super().check(ctx, m)
        if reason:
            return reason
        w = const_array(m.conv.inputs[1])
        c_in = self._in_channels(m)
        if _channels(const_array(m.const), w.ndim, c_in) is None:
            return f"{label(m.node)}: {m.const.name} is not a scalar or per-input-channel constant"
        if m.inner is not None:
            scale = next(v for v in m.inner.inputs if const_array(v) is not None)
            a = _channels(const_array(scale), w.ndim, c_in)
            if a is None or not np.all(a):
                return f"{label(m.inner)}: {scale.name} is not a non-zero scalar or per-channel constant"
        return None

    def rewrite(self, ctx: Context, m: _Match) -> str:
        w, b = _conv_params(m.conv)  # type: ignore[misc]
        c_in = self._in_channels(m)
        index = _input_index(w, m.conv.attributes.get_int("group", 1))
        expand = (slice(None), slice(None)) + (None,) * (w.ndim - 2)
        const = _channels(const_array(m.const), w.ndim, c_in)
        assert const is not None
        w64 = w.astype(np.float64)
        if m.node.op_type == "Mul":
            _set_params(ctx, m.conv, w64 * const[index][expand], b, w.dtype)
            replace_value(
                m.node.outputs[0], m.node.inputs[0] if m.node.inputs[1] is m.const else m.node.inputs[1]
            )
            drop([m.node])
            return "folded Mul before Conv"
        if m.inner is None:
            shift = (w64 * const[index][expand]).reshape(w.shape[0], -1).sum(axis=1)
            _set_params(ctx, m.conv, w, b.astype(np.float64) + shift, w.dtype)
            x = other_input(m.node, m.const)
            assert x is not None
            m.conv.replace_input_with(0, x)
            drop([m.node])
            return "folded Add before Conv"
        scale = next(v for v in m.inner.inputs if const_array(v) is not None)
        a = _channels(const_array(scale), w.ndim, c_in)
        assert a is not None
        x = other_input(m.inner, scale)
        assert x is not None and m.conv.graph is not None
        rank = w.ndim
        offset = ctx.initializer(
            m.conv.graph,
            f"{m.const.name}_over_scale",
            (const / a).reshape((c_in,) + (1,) * (rank - 2)).astype(w.dtype),
        )
        add = ir.node("Add", [x, offset])
        m.conv.graph.insert_before(m.node, add)
        _set_params(ctx, m.conv, w64 * a[index][expand], b, w.dtype)
        m.conv.replace_input_with(0, add.outputs[0])
        drop([m.node, m.inner])
        return "moved Mul before padded Conv into its weight"


class FoldConvAffinePass(ZonnxPass):
    """Fold constant Mul/Add next to a Conv into its weight and bias (exact; see the module docstring)."""

    name = "fold-conv-affine"

    def apply(self, model: ir.Model) -> Changes:
        return run_rules(model, [OutputScale(), OutputOffset(), InputAffine()])
