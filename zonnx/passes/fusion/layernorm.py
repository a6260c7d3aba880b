"""Fuse a decomposed layer normalization into one LayerNormalization node (opset 17+).

Exporters without a LayerNormalization op (torch below opset 17, TF) write it as::

    mean = ReduceMean(x, axes)          d = Sub(x, mean)          (d may be computed twice)
    var  = ReduceMean(Pow(d, 2), axes)  (or Mul(d, d))
    y    = Div(d, Sqrt(Add(var, eps)))  (or Mul(d, Reciprocal(Sqrt(..))), or Mul(d, Div(1, Sqrt(..))))
    y    = Add(Mul(y, gamma), beta)     (gamma and beta optional, constant)

which is ``LayerNormalization(x, gamma, beta, axis=-k, epsilon=eps)`` when ``axes`` are the last ``k``
dims of x, both ReduceMeans keep dims, and gamma and beta vary only along those dims (they are broadcast
to the normalized shape; a missing gamma is ones, a missing beta is left out). Axes are the attribute
below opset 18 and the second input from 18 on.
"""

from __future__ import annotations

__all__ = ["FuseLayerNormPass"]

import dataclasses
import logging

import numpy as np
import onnx_ir as ir

from zonnx.passes.base import Changes, ZonnxPass
from zonnx.passes.fusion.matching import (
    Context,
    Rule,
    const_array,
    consumer,
    drop,
    exclusive,
    is_close,
    label,
    other_input,
    producer,
    replace_value,
    run_rules,
    scalar,
)

logger = logging.getLogger(__name__)

#: First default-domain opset with LayerNormalization.
LAYERNORM_OPSET = 17


@dataclasses.dataclass
class _Match:
    sqrt: ir.Node
    x: ir.Value
    mean: ir.Node
    var: ir.Node
    square: ir.Node
    add_eps: ir.Node
    eps: ir.Value | None
    subs: list[ir.Node]
    tail: list[ir.Node]  # Reciprocal/Div(1, .) when present, then the Div or Mul giving the normalized x
    gamma: ir.Node | None = None
    beta: ir.Node | None = None
    k: int = 0
    dims: tuple[int, ...] = ()
    why: str = ""  # why k or dims could not be found

    @property
    def nodes(self) -> list[ir.Node]:
        extra = [n for n in (self.gamma, self.beta) if n is not None]
        return [self.mean, *self.subs, self.square, self.var, self.add_eps, self.sqrt, *self.tail, *extra]

    @property
    def where(self) -> str:
        return f"LayerNorm pattern at {label(self.sqrt)}"


def _is_centered(value: ir.Value | None, x: ir.Value, mean: ir.Value) -> ir.Node | None:
    """The Sub node computing ``x - mean`` that produces ``value``."""
    sub = producer(value, "Sub")
    if sub is None or sub.inputs[0] is not x or sub.inputs[1] is not mean:
        return None
    return sub


def _axes(node: ir.Node) -> tuple[int, ...] | None:
    """A ReduceMean's axes (attribute or constant input); () means all axes; None when unknown."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        arr = const_array(node.inputs[1])
        return None if arr is None else tuple(int(a) for a in arr.reshape(-1))
    if node.attributes.get_int("noop_with_empty_axes", 0):
        return None
    return tuple(node.attributes.get_ints("axes", ()))


def _param(arr: np.ndarray | None, dims: tuple[int, ...], rank: int | None) -> np.ndarray | None:
    """``arr`` broadcast to the normalized dims when it varies only along them, else None."""
    if arr is None or arr.dtype.kind != "f":
        return None
    if arr.ndim > len(dims) and (rank is None or arr.ndim > rank):
        return None
    a = arr
    while a.ndim > len(dims) and a.shape[0] == 1:
        a = a[0]
    if a.ndim > len(dims):
        return None
    try:
        return np.broadcast_to(a, dims)
    except ValueError:
        return None


def _dims_from_params(norm: ir.Value, known: tuple[int | None, ...]) -> tuple[int, ...] | None:
    """Normalized dims read off the gamma (or beta) constant that follows, when x's dims are unknown.

    The constant's shape (leading 1s dropped) must have one dim per normalized axis, none of them 1
    (a 1 could be a broadcast), and agree with the dims that are known.
    """
    node = norm.consumers()[0] if len(norm.consumers()) == 1 else None
    if node is None or node.op_type not in ("Mul", "Add") or node.domain != "":
        return None
    arr = const_array(other_input(node, norm))
    if arr is None:
        return None
    shape = arr.shape
    while len(shape) > len(known) and shape[0] == 1:
        shape = shape[1:]
    if len(shape) != len(known) or 1 in shape:
        return None
    if any(k is not None and k != d for k, d in zip(known, shape, strict=True)):
        return None
    return tuple(int(d) for d in shape)


class LayerNormRule(Rule[_Match]):
    """Replaces `Div(x - mean(x), Sqrt(mean((x - mean(x))^2) + eps)) * gamma + beta` with `LayerNormalization(x)`."""

    anchor = "Sqrt"
    what = "fused LayerNormalization"

    def __init__(self, target_opset: int = LAYERNORM_OPSET) -> None:
        self.target_opset = target_opset

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        add_eps = producer(node.inputs[0], "Add")
        if add_eps is None:
            return None
        var = producer(add_eps.inputs[0], "ReduceMean") or producer(add_eps.inputs[1], "ReduceMean")
        if var is None:
            return None
        square = producer(var.inputs[0], "Pow", "Mul")
        if square is None or (square.op_type == "Mul" and square.inputs[0] is not square.inputs[1]):
            return None
        sub = producer(square.inputs[0], "Sub")
        mean = producer(sub.inputs[1], "ReduceMean") if sub is not None else None
        if sub is None or mean is None or mean.inputs[0] is not sub.inputs[0]:
            return None
        x = sub.inputs[0]
        tail, numerator = self._divide(node)
        if not tail:
            return None
        sub1 = _is_centered(numerator, x, mean.outputs[0])
        if sub1 is None:
            return None
        subs = [sub1] if sub1 is sub else [sub1, sub]
        m = _Match(node, x, mean, var, square, add_eps, other_input(add_eps, var.outputs[0]), subs, tail)
        self._affine(ctx, m)
        return m

    @staticmethod
    def _divide(sqrt: ir.Node) -> tuple[list[ir.Node], ir.Value | None]:
        """The nodes dividing by the standard deviation and the numerator they divide."""
        std = sqrt.outputs[0]
        for node in std.consumers():
            if node.domain != "":
                continue
            if node.op_type == "Div" and node.inputs[1] is std:
                if node.inputs[0] is not std and scalar(node.inputs[0]) is None:
                    return [node], node.inputs[0]
                inv = node  # Div(1, std)
            elif node.op_type == "Reciprocal":
                inv = node
            else:
                continue
            mul = consumer(inv.outputs[0], "Mul")
            if mul is not None:
                return [inv, mul], other_input(mul, inv.outputs[0])
        return [], None

    def _affine(self, ctx: Context, m: _Match) -> None:
        """Attach the gamma Mul and beta Add that follow, when their constants fit the normalized dims."""
        axes, rank = _axes(m.mean), ctx.rank(m.x)
        if axes is None or axes != _axes(m.var):
            m.why = f"the ReduceMean axes {axes} and {_axes(m.var)} differ or are not constant"
            return
        if rank is None and (not axes or min(axes) >= 0):
            m.why = f"the rank of {m.x.name} is unknown"
            return
        if rank is not None:
            axes = tuple(sorted(a % rank - rank for a in axes)) if axes else tuple(range(-rank, 0))
        k = len(axes)
        if tuple(sorted(axes)) != tuple(range(-k, 0)):
            m.why = f"ReduceMean axes {_axes(m.mean)} are not the trailing dims of {m.x.name}"
            return
        shape = ctx.dims(m.x)
        trailing = shape[-k:] if shape is not None and len(shape) >= k else (None,) * k
        dims = trailing if None not in trailing else _dims_from_params(m.tail[-1].outputs[0], trailing)
        if dims is None:
            m.why = f"the last {k} dims of {m.x.name} are not static (and no gamma/beta gives them)"
            return
        m.k, m.dims = k, tuple(int(d) for d in dims)  # type: ignore[arg-type]
        out = m.tail[-1].outputs[0]
        for role, op in (("gamma", "Mul"), ("beta", "Add")):
            users = out.consumers()
            if len(users) != 1 or users[0].domain != "" or out.is_graph_output():
                return
            node = users[0]
            if node.op_type != op:
                continue  # no gamma: try the same node as beta
            if _param(const_array(other_input(node, out)), m.dims, rank) is None:
                return
            setattr(m, role, node)
            out = node.outputs[0]

    def check(self, ctx: Context, m: _Match) -> str | None:
        if ctx.opset < LAYERNORM_OPSET:
            advice = (
                f"run opset-upgrade to {self.target_opset} first"
                if self.target_opset >= LAYERNORM_OPSET
                else f"the target opset {self.target_opset} is below {LAYERNORM_OPSET} too"
            )
            return (
                f"{m.where}: LayerNormalization needs opset {LAYERNORM_OPSET}; "
                f"model is at opset {ctx.opset} ({advice})"
            )
        if m.why:
            return f"{m.where}: {m.why}"
        for rm in (m.mean, m.var):
            if not rm.attributes.get_int("keepdims", 1):
                return f"{m.where}: {label(rm)} has keepdims=0"
        if m.square.op_type == "Pow" and not is_close(scalar(m.square.inputs[1]), 2.0):
            return f"{m.where}: {label(m.square)} raises to {scalar(m.square.inputs[1])}, not 2"
        eps = scalar(m.eps)
        if eps is None or eps < 0:
            return f"{m.where}: epsilon {m.eps.name if m.eps else '?'} is not a non-negative constant scalar"
        if m.tail[0].op_type == "Div" and len(m.tail) == 2 and not is_close(scalar(m.tail[0].inputs[0]), 1.0):
            return f"{m.where}: {label(m.tail[0])} divides {scalar(m.tail[0].inputs[0])}, not 1"
        if m.x.dtype is not None and not m.x.dtype.is_floating_point():
            return f"{m.where}: {m.x.name} is {m.x.dtype}, not a float type"
        nodes = m.nodes
        reason = exclusive([n.outputs[0] for n in nodes[:-1]], nodes)
        return f"{m.where}: {reason}" if reason else None

    def rewrite(self, ctx: Context, m: _Match) -> None:
        last = m.nodes[-1]
        graph = last.graph
        assert graph is not None
        rank = ctx.rank(m.x)
        gamma = beta = None
        if m.gamma is not None:
            gamma = _param(const_array(other_input(m.gamma, m.tail[-1].outputs[0])), m.dims, rank)
        if m.beta is not None:
            beta = _param(const_array(other_input(m.beta, (m.gamma or m.tail[-1]).outputs[0])), m.dims, rank)
        dtype = next(
            (a.dtype for a in (gamma, beta) if a is not None),
            m.x.dtype.numpy() if m.x.dtype is not None else np.dtype(np.float32),
        )
        base = (m.sqrt.name or "layernorm").strip("/").replace("/", "_")
        scale = np.ones(m.dims) if gamma is None else gamma.astype(np.float64)
        inputs = [m.x, ctx.initializer(graph, f"{base}_scale", scale.astype(dtype))]
        if beta is not None:
            inputs.append(ctx.initializer(graph, f"{base}_bias", beta.astype(np.float64).astype(dtype)))
        ln = ir.node("LayerNormalization", inputs, attributes={"axis": -m.k, "epsilon": float(scalar(m.eps))})
        graph.insert_before(last, ln)
        replace_value(last.outputs[0], ln.outputs[0])
        drop(m.nodes)


class FuseLayerNormPass(ZonnxPass):
    """Fuse decomposed layer normalizations into LayerNormalization; numerics preserved to float rounding.

    The model's own opset decides: below 17 every candidate is recorded as a miss (the pass never
    changes opset imports). Options: ``target_opset`` (default 17), the opset the pipeline upgrades to,
    used only in the advice of that miss.
    """

    name = "fuse-layernorm"

    def __init__(self, target_opset: int = 17) -> None:
        super().__init__()
        self.target_opset = target_opset

    def apply(self, model: ir.Model) -> Changes:
        return run_rules(model, [LayerNormRule(self.target_opset)])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(target_opset={self.target_opset})"
