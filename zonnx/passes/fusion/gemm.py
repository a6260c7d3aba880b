"""Bring fully connected layers to one canonical form: ``Gemm(A, B, C)``, alpha=beta=1, no transposes.

Gemm computes ``Y = alpha * A' @ B' + beta * C`` with ``A' = A^T`` when transA=1 and ``B' = B^T`` when
transB=1. The canonical form keeps constant weights in their natural [K, N] layout and no scalars::

    transB=1, B constant   ->  B := B^T, transB=0
    transA=1, A constant   ->  A := A^T, transA=0
    alpha != 1             ->  B := alpha * B (or A := alpha * A when only A is constant), alpha=1
    beta != 1              ->  C := beta * C, beta=1 (beta is dropped when there is no C)
    Add(Gemm(A, B, C), k)  ->  Gemm(A, B, beta * C + k)      when k broadcasts within [M, N]
    Add(MatMul(x, W), b)   ->  Gemm(x, W, b)                 when x is 2-D, W a constant [K, N] and b
                                                             a constant broadcastable to [M, N]

A folded constant must be read only by that Gemm (shared weights are left alone). For activations of
rank > 2 (transformers: [batch, tokens, features]) the canonical form stays ``MatMul`` + ``Add``: Gemm
takes 2-D inputs only, and flattening the leading dims would add two Reshapes per layer. Each such
MatMul+Add is recorded as a miss so the report shows why it was kept.
"""

from __future__ import annotations

__all__ = ["CanonicalizeGemmPass"]

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
    run_rules,
    set_attr,
)

logger = logging.getLogger(__name__)

_ROLES = ("A", "B", "C")


@dataclasses.dataclass
class _Match:
    node: ir.Node  # the Gemm (attribute rules) or the Add (fusion rules)
    prev: ir.Node | None = None  # the MatMul or Gemm feeding the Add
    addend: ir.Value | None = None  # the Add's constant input


def _own_const(gemm: ir.Node, index: int) -> tuple[np.ndarray | None, str]:
    """Input ``index`` of ``gemm`` when it is a float constant read only by it, else (None, reason)."""
    value = gemm.inputs[index] if index < len(gemm.inputs) else None
    role = _ROLES[index]
    if value is None:
        return None, f"{role} is absent"
    arr = const_array(value)
    if arr is None:
        return None, f"{role} ({value.name}) is not constant"
    if arr.dtype.kind != "f":
        return None, f"{role} ({value.name}) is {arr.dtype}"
    reason = exclusive([value], [gemm])
    return (None, reason) if reason else (arr, "")


def _replace_const(ctx: Context, node: ir.Node, index: int, array: np.ndarray) -> None:
    """Give ``node`` a new initializer as input ``index`` and drop the old constant if now unread."""
    assert node.graph is not None
    old = node.inputs[index] if index < len(node.inputs) else None
    hint = old.name if old is not None and old.name else f"{(node.name or 'gemm').strip('/')}_{_ROLES[index]}"
    value = ctx.initializer(node.graph, hint if old is None else f"{hint}_canon", array)
    if len(node.inputs) <= index:
        node.resize_inputs(index + 1)
    node.replace_input_with(index, value)
    prune([old])


def _mn(ctx: Context, gemm: ir.Node) -> tuple[int | None, int | None]:
    """Gemm's output dims M and N when known (from A's shape and B's data or shape)."""
    a, b = ctx.dims(gemm.inputs[0]), ctx.dims(gemm.inputs[1])
    ta, tb = gemm.attributes.get_int("transA", 0), gemm.attributes.get_int("transB", 0)
    m = a[1 if ta else 0] if a is not None and len(a) == 2 else None
    n = b[0 if tb else 1] if b is not None and len(b) == 2 else None
    return m, n


def _fits(shape: tuple[int, ...], m: int | None, n: int | None) -> str | None:
    """Why a constant of ``shape`` cannot be added to a [M, N] Gemm output without changing its shape."""
    if len(shape) > 2:
        return f"it has rank {len(shape)}"
    if shape and shape[-1] != 1 and shape[-1] != n:
        return f"its last dim {shape[-1]} does not match N={n}"
    if len(shape) == 2 and shape[0] != 1 and shape[0] != m:
        return f"its first dim {shape[0]} does not match M={m}"
    return None


class _AttrRule(Rule[_Match]):
    """Gemm attribute rules: pattern is 'attribute differs from the canonical value'."""

    anchor = "Gemm"
    attr = ""
    canonical: float = 0

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        value = node.attributes.get(self.attr)
        return None if value is None or value.value == self.canonical else _Match(node)


class FoldTransB(_AttrRule):
    """Replaces `Gemm(A, B, transB=1)` with `Gemm(A, B^T)` for a constant B."""

    attr, canonical, what = "transB", 0, "folded transB into Gemm weight"

    def check(self, ctx: Context, m: _Match) -> str | None:
        arr, reason = _own_const(m.node, 1)
        return f"{label(m.node)}: transB=1 kept: {reason}" if arr is None else None

    def rewrite(self, ctx: Context, m: _Match) -> None:
        arr = const_array(m.node.inputs[1])
        _replace_const(ctx, m.node, 1, np.ascontiguousarray(arr.T))
        set_attr(m.node, "transB", 0, default=0)


class FoldTransA(_AttrRule):
    """Replaces `Gemm(A, B, transA=1)` with `Gemm(A^T, B)` for a constant A."""

    attr, canonical, what = "transA", 0, "folded transA into Gemm constant A"

    def check(self, ctx: Context, m: _Match) -> str | None:
        arr, reason = _own_const(m.node, 0)
        return f"{label(m.node)}: transA=1 kept: {reason}" if arr is None else None

    def rewrite(self, ctx: Context, m: _Match) -> None:
        _replace_const(ctx, m.node, 0, np.ascontiguousarray(const_array(m.node.inputs[0]).T))
        set_attr(m.node, "transA", 0, default=0)


class FoldAlpha(_AttrRule):
    """Replaces `Gemm(A, B, alpha=a)` with `Gemm(A, a * B)` for a constant B (or A)."""

    attr, canonical, what = "alpha", 1.0, "folded alpha into Gemm weight"

    def check(self, ctx: Context, m: _Match) -> str | None:
        arr_b, reason_b = _own_const(m.node, 1)
        arr_a, _ = _own_const(m.node, 0)
        if arr_b is None and arr_a is None:
            return f"{label(m.node)}: alpha kept: {reason_b} and A is not a constant of its own"
        return None

    def rewrite(self, ctx: Context, m: _Match) -> None:
        alpha = m.node.attributes.get_float("alpha", 1.0)
        index = 1 if _own_const(m.node, 1)[0] is not None else 0
        arr = const_array(m.node.inputs[index])
        _replace_const(ctx, m.node, index, (arr.astype(np.float64) * alpha).astype(arr.dtype))
        set_attr(m.node, "alpha", 1.0, default=1.0)


class FoldBeta(_AttrRule):
    """Replaces `Gemm(A, B, C, beta=b)` with `Gemm(A, B, b * C)` for a constant C."""

    attr, canonical, what = "beta", 1.0, "folded beta into Gemm bias"

    def check(self, ctx: Context, m: _Match) -> str | None:
        if len(m.node.inputs) < 3 or m.node.inputs[2] is None:
            return None
        arr, reason = _own_const(m.node, 2)
        return f"{label(m.node)}: beta kept: {reason}" if arr is None else None

    def rewrite(self, ctx: Context, m: _Match) -> None:
        beta = m.node.attributes.get_float("beta", 1.0)
        if len(m.node.inputs) >= 3 and m.node.inputs[2] is not None:
            arr = const_array(m.node.inputs[2])
            _replace_const(ctx, m.node, 2, (arr.astype(np.float64) * beta).astype(arr.dtype))
        set_attr(m.node, "beta", 1.0, default=1.0)


class _AddRule(Rule[_Match]):
    """Add rules: one input comes from ``producer_op``, the other is a constant."""

    anchor = "Add"
    producer_op = ""

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        for value in node.inputs:
            prev = producer(value, self.producer_op)
            addend = other_input(node, value) if prev is not None else None
            if prev is not None and const_array(addend) is not None and self.accept(prev):
                return _Match(node, prev, addend)
        return None

    def accept(self, prev: ir.Node) -> bool:
        return True


class MatMulAddToGemm(_AddRule):
    """Replaces `Add(MatMul(x, W), b)` with `Gemm(x, W, b)` for a 2-D x and constant W, b."""

    producer_op, what = "MatMul", "fused MatMul+Add into Gemm"

    def accept(self, prev: ir.Node) -> bool:
        w = const_array(prev.inputs[1])
        return w is not None and w.ndim == 2 and w.dtype.kind == "f"

    def check(self, ctx: Context, m: _Match) -> str | None:
        assert m.prev is not None
        where = f"{label(m.node)}: {label(m.prev)}+Add kept as MatMul+Add"
        rank = ctx.rank(m.prev.inputs[0])
        if rank != 2:
            known = "unknown" if rank is None else str(rank)
            return f"{where}: {m.prev.inputs[0].name} has rank {known} and Gemm takes 2-D inputs"
        reason = exclusive([m.prev.outputs[0]], [m.node])
        if reason:
            return f"{where}: {reason}"
        bias = const_array(m.addend)
        dims = ctx.dims(m.prev.inputs[0])
        n = const_array(m.prev.inputs[1]).shape[1]
        why = _fits(bias.shape, dims[0] if dims else None, n)
        if why or bias.dtype.kind != "f":
            return f"{where}: the bias {m.addend.name} does not fit C ({why or bias.dtype})"
        return None

    def rewrite(self, ctx: Context, m: _Match) -> None:
        mm, add = m.prev, m.node
        assert mm is not None and add.graph is not None
        gemm = ir.node("Gemm", [mm.inputs[0], mm.inputs[1], m.addend])
        add.graph.insert_before(add, gemm)
        replace_value(add.outputs[0], gemm.outputs[0])
        drop([add, mm])


class GemmAddToC(_AddRule):
    """Replaces `Add(Gemm(A, B, C), k)` with `Gemm(A, B, beta * C + k)` for constant C and k."""

    producer_op, what = "Gemm", "folded Add into Gemm bias"

    def check(self, ctx: Context, m: _Match) -> str | None:
        gemm = m.prev
        assert gemm is not None
        where = f"{label(m.node)}: not folded into {label(gemm)}"
        reason = exclusive([gemm.outputs[0]], [m.node])
        if reason:
            return f"{where}: {reason}"
        if len(gemm.inputs) > 2 and gemm.inputs[2] is not None:
            arr, reason = _own_const(gemm, 2)
            if arr is None:
                return f"{where}: {reason}"
        k = const_array(m.addend)
        why = _fits(k.shape, *_mn(ctx, gemm))
        if why or k.dtype.kind != "f":
            return f"{where}: {m.addend.name} does not fit C ({why or k.dtype})"
        return None

    def rewrite(self, ctx: Context, m: _Match) -> None:
        gemm, add = m.prev, m.node
        assert gemm is not None
        k = const_array(m.addend)
        c = const_array(gemm.inputs[2]) if len(gemm.inputs) > 2 and gemm.inputs[2] is not None else None
        beta = gemm.attributes.get_float("beta", 1.0)
        total = k.astype(np.float64) if c is None else beta * c.astype(np.float64) + k.astype(np.float64)
        _replace_const(ctx, gemm, 2, total.astype(k.dtype))
        set_attr(gemm, "beta", 1.0, default=1.0)
        replace_value(add.outputs[0], gemm.outputs[0])
        drop([add])


class CanonicalizeGemmPass(ZonnxPass):
    """Turn 2-D MatMul+Add into Gemm and fold Gemm's alpha, beta, transA, transB and a following Add.

    Numerics are preserved to float rounding. Rank > 2 MatMul+Add is kept (recorded as a miss).
    No options.
    """

    name = "canonicalize-gemm"

    def apply(self, model: ir.Model) -> Changes:
        rules = [MatMulAddToGemm(), GemmAddToC(), FoldTransB(), FoldTransA(), FoldAlpha(), FoldBeta()]
        return run_rules(model, rules)
