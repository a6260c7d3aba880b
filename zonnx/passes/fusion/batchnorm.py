"""Fold inference BatchNormalization into the Conv, ConvTranspose, Gemm or MatMul before it, else into Mul+Add.

BatchNormalization in inference mode is a per-channel affine map on axis 1::

    y = scale * (x - mean) / sqrt(var + eps) + B = x * s + t
    s = scale / sqrt(var + eps)        t = B - mean * s

Conv (W [M, C/g, k...], bias b [M], output channel m = row m of W)::

    W'[m] = W[m] * s[m]                b' = b * s + t        (b = 0 when absent)

ConvTranspose (W [C, M/g, k...]; group G owns input rows G*C/g.. and output channels G*M/g + j)::

    W viewed as [g, C/g, M/g, k...];   W'[G, :, j] = W[G, :, j] * s[G*M/g + j];   b' = b * s + t

Gemm (Y = alpha * A' B' + beta * C; the channel is N, axis 1 of Y)::

    B' columns scaled by s (rows of the stored B when transB=1);   C' = beta * C * s + t,  beta' = 1

MatMul with a constant 2-D W [K, N] and a 2-D output (so BatchNormalization's axis 1 is W's last axis)::

    W'[:, n] = W[:, n] * s[n], then Add(t)

An Add of a per-channel constant e between the producer and BatchNormalization (a bias written as its own
node, as paddle2onnx does for ConvTranspose) is folded too: the producer's bias becomes ``(b + e) * s + t``.

Anything else (no foldable producer, shared weights, a producer read elsewhere): ``y = Mul(x, s) -> Add(t)``
with s, t shaped [C, 1, ..., 1] so they broadcast on axis 1. Folded values are computed in float64 and
cast back to the weight's dtype.
"""

from __future__ import annotations

__all__ = ["FoldBatchNormPass"]

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


@dataclasses.dataclass
class _Match:
    bn: ir.Node
    prev: ir.Node | None = None
    s: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0))  # per-channel multiplier (f64)
    t: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0))  # per-channel offset (f64)
    dtype: np.dtype = dataclasses.field(default_factory=lambda: np.dtype("float32"))  # dtype of BN's scale
    add: ir.Node | None = None  # an Add of a per-channel constant between the producer and BN
    extra: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(1))  # that constant (f64)


def _affine(bn: ir.Node) -> tuple[np.ndarray, np.ndarray, np.dtype] | str:
    """(s, t, dtype) of an inference BatchNormalization, or the reason it is not one."""
    where = label(bn)
    if bn.attributes.get_int("training_mode", 0):
        return f"{where}: training_mode=1 (training-mode BatchNormalization is not folded)"
    if bn.attributes.get_int("spatial", 1) != 1:
        return f"{where}: spatial=0 (per-activation statistics) is not folded"
    if len(bn.inputs) < 5 or any(v is None for v in bn.inputs[:5]):
        return f"{where}: has fewer than 5 inputs"
    for out in bn.outputs[1:]:
        if out.uses() or out.is_graph_output():
            return f"{where}: its running-statistics output {out.name} is read"
    arrays = []
    for value, role in zip(bn.inputs[1:5], ("scale", "B", "mean", "var"), strict=True):
        arr = const_array(value)
        if arr is None or arr.dtype.kind != "f":
            return f"{where}: {role} ({value.name}) is not a float constant"
        arrays.append(arr)
    scale, bias, mean, var = (a.astype(np.float64).reshape(-1) for a in arrays)
    if not (len(scale) == len(bias) == len(mean) == len(var)):
        return f"{where}: scale, B, mean and var have different lengths"
    eps = bn.attributes.get_float("epsilon", 1e-5)
    s = scale / np.sqrt(var + eps)
    return s, bias - mean * s, arrays[0].dtype


def _per_channel(arr: np.ndarray, rank: int, channels: int) -> np.ndarray | None:
    """``arr`` as a [channels] float64 vector when it broadcasts along axis 1 only of a rank-``rank`` value."""
    if arr.ndim > rank or arr.dtype.kind != "f":
        return None
    shape = (1,) * (rank - arr.ndim) + arr.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(arr.astype(np.float64).reshape(-1), (channels,))


class _FoldRule(Rule[_Match]):
    """Shared pattern for folds into a producer: BatchNormalization whose input comes from ``producers``,
    directly or through an Add of a per-channel constant (a bias some exporters write separately)."""

    anchor = "BatchNormalization"
    producers: tuple[str, ...] = ()

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        prev = producer(node.inputs[0], *self.producers)
        if prev is not None:
            return _Match(node, prev=prev)
        add = producer(node.inputs[0], "Add")
        for value in add.inputs if add is not None else ():
            prev = producer(value, *self.producers)
            if prev is not None and const_array(other_input(add, value)) is not None:
                return _Match(node, prev=prev, add=add)
        return None

    def check(self, ctx: Context, m: _Match) -> str | None:
        affine = _affine(m.bn)
        if isinstance(affine, str):
            return affine
        m.s, m.t, m.dtype = affine
        assert m.prev is not None
        where = f"{label(m.bn)}: not folded into {label(m.prev)}"
        reason = exclusive([m.prev.outputs[0]], [m.add or m.bn])
        if not reason and m.add is not None:
            reason = exclusive([m.add.outputs[0]], [m.bn])
        if reason:
            return f"{where}: {reason}"
        reason = self.check_producer(ctx, m)
        if reason or m.add is None:
            m.extra = np.zeros(len(m.s))
            return reason
        value = other_input(m.add, m.prev.outputs[0])
        extra = _per_channel(const_array(value), self.out_rank(m), len(m.s))
        if extra is None:
            return f"{where}: the Add constant {value.name} is not a per-channel float vector"
        m.extra = extra
        return None

    def check_producer(self, ctx: Context, m: _Match) -> str | None:
        raise NotImplementedError

    def out_rank(self, m: _Match) -> int:
        """Rank of the producer's output (Gemm and 2-D MatMul: 2; Conv: rank of W)."""
        return 2

    def _weight(
        self, m: _Match, index: int, role: str, ndim: tuple[int, ...]
    ) -> tuple[np.ndarray | None, str]:
        """The producer's constant input ``index`` read only by it, or (None, reason)."""
        assert m.prev is not None
        where = f"{label(m.bn)}: not folded into {label(m.prev)}"
        value = m.prev.inputs[index] if index < len(m.prev.inputs) else None
        arr = const_array(value)
        if value is None or arr is None:
            return None, f"{where}: {role} ({value.name if value else 'absent'}) is not constant"
        if arr.dtype.kind != "f" or arr.ndim not in ndim:
            return None, f"{where}: {role} ({value.name}) is {arr.dtype} with rank {arr.ndim}"
        reason = exclusive([value], [m.prev])
        if reason:
            return None, f"{where}: {reason}"
        return arr, ""

    def _finish(self, ctx: Context, m: _Match, weight: np.ndarray, bias: np.ndarray, w_index: int) -> None:
        """Give the producer the new weight (input w_index) and bias (input w_index + 1), then drop BN."""
        prev = m.prev
        assert prev is not None and prev.graph is not None
        old = [prev.inputs[w_index], prev.inputs[w_index + 1] if len(prev.inputs) > w_index + 1 else None]
        w_name = old[0].name if old[0] is not None else "weight"
        w = ctx.initializer(prev.graph, f"{w_name}_bnfold", weight)
        b = ctx.initializer(prev.graph, f"{w_name}_bnfold_bias", bias)
        if len(prev.inputs) < w_index + 2:
            prev.resize_inputs(w_index + 2)
        prev.replace_input_with(w_index, w)
        prev.replace_input_with(w_index + 1, b)
        replace_value(m.bn.outputs[0], prev.outputs[0])
        drop([m.bn] if m.add is None else [m.bn, m.add])
        prune(old)


class ConvBatchNorm(_FoldRule):
    """Replaces `BatchNormalization(Conv(x))` with `Conv'(x)`."""

    producers = ("Conv",)
    what = "folded Conv+BatchNormalization"

    def out_rank(self, m: _Match) -> int:
        assert m.prev is not None
        return const_array(m.prev.inputs[1]).ndim

    def check_producer(self, ctx: Context, m: _Match) -> str | None:
        assert m.prev is not None
        w, reason = self._weight(m, 1, "W", (3, 4, 5))
        if w is None:
            return reason
        if w.shape[0] != len(m.s):
            return f"{label(m.bn)}: {len(m.s)} channels but {label(m.prev)} has {w.shape[0]} filters"
        if len(m.prev.inputs) > 2 and m.prev.inputs[2] is not None:
            return self._weight(m, 2, "bias", (1,))[1] or None
        return None

    def rewrite(self, ctx: Context, m: _Match) -> None:
        assert m.prev is not None
        w = const_array(m.prev.inputs[1])
        b = const_array(m.prev.inputs[2]) if len(m.prev.inputs) > 2 else None
        b64 = np.zeros(len(m.s)) if b is None else b.astype(np.float64)
        w64 = w.astype(np.float64) * m.s.reshape((-1,) + (1,) * (w.ndim - 1))
        self._finish(ctx, m, w64.astype(w.dtype), ((b64 + m.extra) * m.s + m.t).astype(w.dtype), 1)


class ConvTransposeBatchNorm(_FoldRule):
    """Replaces `BatchNormalization(ConvTranspose(x))` with `ConvTranspose'(x)`."""

    producers = ("ConvTranspose",)
    what = "folded ConvTranspose+BatchNormalization"

    def out_rank(self, m: _Match) -> int:
        assert m.prev is not None
        return const_array(m.prev.inputs[1]).ndim

    def check_producer(self, ctx: Context, m: _Match) -> str | None:
        assert m.prev is not None
        w, reason = self._weight(m, 1, "W", (3, 4, 5))
        if w is None:
            return reason
        groups = m.prev.attributes.get_int("group", 1)
        if w.shape[0] % groups or w.shape[1] * groups != len(m.s):
            return f"{label(m.bn)}: {len(m.s)} channels but {label(m.prev)} has {w.shape[1] * groups} outputs"
        if len(m.prev.inputs) > 2 and m.prev.inputs[2] is not None:
            return self._weight(m, 2, "bias", (1,))[1] or None
        return None

    def rewrite(self, ctx: Context, m: _Match) -> None:
        assert m.prev is not None
        w = const_array(m.prev.inputs[1])
        b = const_array(m.prev.inputs[2]) if len(m.prev.inputs) > 2 else None
        g = m.prev.attributes.get_int("group", 1)
        per_group = w.shape[1]
        kernel = w.shape[2:]
        view = w.astype(np.float64).reshape(g, w.shape[0] // g, per_group, *kernel)
        view = view * m.s.reshape(g, 1, per_group, *(1,) * len(kernel))
        b64 = np.zeros(len(m.s)) if b is None else b.astype(np.float64)
        bias = ((b64 + m.extra) * m.s + m.t).astype(w.dtype)
        self._finish(ctx, m, view.reshape(w.shape).astype(w.dtype), bias, 1)


class GemmBatchNorm(_FoldRule):
    """Replaces `BatchNormalization(Gemm(a, B, C))` with `Gemm(a, B', C')`."""

    producers = ("Gemm",)
    what = "folded Gemm+BatchNormalization"

    def check_producer(self, ctx: Context, m: _Match) -> str | None:
        assert m.prev is not None
        w, reason = self._weight(m, 1, "B", (2,))
        if w is None:
            return reason
        n = w.shape[0] if m.prev.attributes.get_int("transB", 0) else w.shape[1]
        if n != len(m.s):
            return f"{label(m.bn)}: {len(m.s)} channels but {label(m.prev)} has N={n}"
        if len(m.prev.inputs) > 2 and m.prev.inputs[2] is not None:
            c, reason = self._weight(m, 2, "C", (0, 1, 2))
            if c is None:
                return reason
            try:
                np.broadcast_shapes(c.shape, (1, n))
            except ValueError:
                return f"{label(m.bn)}: C of {label(m.prev)} has shape {c.shape}"
        return None

    def rewrite(self, ctx: Context, m: _Match) -> None:
        assert m.prev is not None
        w = const_array(m.prev.inputs[1])
        c = const_array(m.prev.inputs[2]) if len(m.prev.inputs) > 2 else None
        trans_b = m.prev.attributes.get_int("transB", 0)
        w64 = w.astype(np.float64) * (m.s[:, None] if trans_b else m.s[None, :])
        beta = m.prev.attributes.get_float("beta", 1.0)
        c64 = np.zeros(len(m.s)) if c is None else beta * c.astype(np.float64)
        set_attr(m.prev, "beta", 1.0, default=1.0)
        self._finish(ctx, m, w64.astype(w.dtype), ((c64 + m.extra) * m.s + m.t).astype(w.dtype), 1)


class MatMulBatchNorm(_FoldRule):
    """Replaces `BatchNormalization(MatMul(x, W))` with `Add(MatMul(x, W'), t)` for a 2-D output."""

    producers = ("MatMul",)
    what = "folded MatMul+BatchNormalization"

    def check_producer(self, ctx: Context, m: _Match) -> str | None:
        assert m.prev is not None
        w, reason = self._weight(m, 1, "W", (2,))
        if w is None:
            return reason
        rank = ctx.rank(m.prev.inputs[0])
        where = f"{label(m.bn)}: not folded into {label(m.prev)}"
        if rank is None:
            return f"{where}: the rank of {m.prev.inputs[0].name} is unknown"
        if rank != 2:
            return f"{where}: its output is rank {rank}, so channel axis 1 is not W's last axis"
        if w.shape[1] != len(m.s):
            return f"{label(m.bn)}: {len(m.s)} channels but {label(m.prev)} has N={w.shape[1]}"
        return None

    def rewrite(self, ctx: Context, m: _Match) -> None:
        mm = m.prev
        assert mm is not None and mm.graph is not None
        old = mm.inputs[1]
        w = const_array(old)
        weight = ctx.initializer(mm.graph, f"{old.name}_bnfold", (w.astype(np.float64) * m.s).astype(w.dtype))
        bias = ctx.initializer(mm.graph, f"{old.name}_bnfold_bias", (m.extra * m.s + m.t).astype(w.dtype))
        mm.replace_input_with(1, weight)
        add = ir.node("Add", [mm.outputs[0], bias])
        mm.graph.insert_after(mm, add)
        replace_value(m.bn.outputs[0], add.outputs[0])
        drop([m.bn] if m.add is None else [m.bn, m.add])
        prune([old])


class BatchNormToMulAdd(Rule[_Match]):
    """Replaces `BatchNormalization(x)` with `Add(Mul(x, s), t)`."""

    anchor = "BatchNormalization"
    what = "BatchNormalization to Mul+Add"

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        return _Match(node)

    def check(self, ctx: Context, m: _Match) -> str | None:
        affine = _affine(m.bn)
        if isinstance(affine, str):
            return affine
        m.s, m.t, m.dtype = affine
        rank = ctx.rank(m.bn.inputs[0])
        if rank is None or rank < 2:
            known = "unknown" if rank is None else f"{rank} (below 2)"
            return (
                f"{label(m.bn)}: the rank of {m.bn.inputs[0].name} is {known}; cannot shape Mul+Add constants"
            )
        return None

    def rewrite(self, ctx: Context, m: _Match) -> None:
        bn = m.bn
        graph = bn.graph
        assert graph is not None
        x = bn.inputs[0]
        rank = ctx.rank(x) or 2
        dtype = x.dtype.numpy() if x.dtype is not None else m.dtype
        shape = (-1,) + (1,) * (rank - 2)
        base = bn.name.strip("/").replace("/", "_") if bn.name else (bn.outputs[0].name or "bn")
        s = ctx.initializer(graph, f"{base}_scale", m.s.reshape(shape).astype(dtype))
        t = ctx.initializer(graph, f"{base}_shift", m.t.reshape(shape).astype(dtype))
        mul = ir.node("Mul", [x, s])
        add = ir.node("Add", [mul.outputs[0], t])
        graph.insert_before(bn, [mul, add])
        replace_value(bn.outputs[0], add.outputs[0])
        drop([bn])


class FoldBatchNormPass(ZonnxPass):
    """Fold inference BatchNormalization into a preceding Conv/ConvTranspose/Gemm/MatMul, else into Mul+Add.

    A fold needs the producer's output read only by the BatchNormalization and its weights constant
    (initializers or Constant nodes) and read only by it. Numerics are preserved up to float rounding.
    No options.
    """

    name = "fold-batchnorm"

    def apply(self, model: ir.Model) -> Changes:
        rules = [
            ConvBatchNorm(),
            ConvTransposeBatchNorm(),
            GemmBatchNorm(),
            MatMulBatchNorm(),
            BatchNormToMulAdd(),
        ]
        return run_rules(model, rules)
