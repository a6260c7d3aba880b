"""Fuse the erf and tanh forms of GELU into one node: ONNX Gelu (opset 20+) or ORT's contrib ops below.

The exact (erf) form and its tanh approximation::

    gelu(x)  = 0.5 * x * (1 + erf(x / sqrt(2)))
    gelu~(x) = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))

Inner parts matched: ``Erf(Div(x, sqrt(2)))`` or ``Erf(Mul(x, 1/sqrt(2)))``; ``Tanh(Mul(Add(x, Mul(x^3,
0.044715)), sqrt(2/pi)))`` with ``x^3`` as ``Pow(x, 3)``, ``Mul(x, Mul(x, x))`` or ``Mul(Mul(x, x), x)``.
With ``a = Add(inner, 1)`` the outer product may be ``Mul(Mul(x, a), 0.5)`` (torch's exporter),
``Mul(Mul(a, 0.5), x)`` or ``Mul(a, Mul(x, 0.5))``; a ``Div`` by 2 stands for a ``Mul`` by 0.5. Every
constant is compared with its exact value to a relative tolerance of 1e-6. Operand order is free.

At opset 20+ the result is ``Gelu(x, approximate="none"|"tanh")``. Below 20 ONNX has no Gelu; the pass then
writes ORT's contrib ops ``com.microsoft::Gelu`` (erf) or ``com.microsoft::FastGelu`` (tanh) and adds the
``com.microsoft`` opset import (version 1); ORT's CPU provider runs them on float32.
"""

from __future__ import annotations

__all__ = ["FuseGeluPass"]

import dataclasses
import logging
import math

import onnx_ir as ir

from zonnx.passes.base import Changes, ZonnxPass
from zonnx.passes.fusion.matching import (
    Context,
    Rule,
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

#: First default-domain opset with Gelu.
GELU_OPSET = 20
CONTRIB_DOMAIN = "com.microsoft"

_Const = tuple[str, ir.Value | None, float]  # (role, value, exact value expected)


@dataclasses.dataclass
class _Match:
    anchor: ir.Node
    x: ir.Value
    nodes: list[ir.Node]
    consts: list[_Const]
    approximate: str  # "none" (erf) or "tanh"

    @property
    def where(self) -> str:
        return f"GELU pattern at {label(self.anchor)}"


def _half(node: ir.Node | None, value: ir.Value) -> _Const | None:
    """When ``node`` halves ``value`` (Mul by a constant, Div by a constant): the constant to check."""
    if node is None or node.domain != "":
        return None
    if node.op_type == "Mul":
        c = other_input(node, value)
        return ("the 0.5 factor", c, 0.5) if scalar(c) is not None else None
    if node.op_type == "Div" and node.inputs[0] is value and scalar(node.inputs[1]) is not None:
        return ("the divisor 2", node.inputs[1], 2.0)
    return None


def _outer(a: ir.Value, x: ir.Value) -> tuple[list[ir.Node], list[_Const]] | None:
    """Match ``0.5 * x * a`` in one of its arrangements; returns its nodes (output last) and constants."""
    for n in a.consumers():
        if n.domain != "":
            continue
        if n.op_type == "Mul" and other_input(n, a) is x:  # Mul(Mul(x, a), 0.5)
            for m in n.outputs[0].consumers():
                half = _half(m, n.outputs[0])
                if half:
                    return [n, m], [half]
        half = _half(n, a)
        if half:  # Mul(Mul(a, 0.5), x)
            m = consumer(n.outputs[0], "Mul")
            if m is not None and other_input(m, n.outputs[0]) is x:
                return [n, m], [half]
        if n.op_type == "Mul":  # Mul(a, Mul(x, 0.5))
            p = producer(other_input(n, a), "Mul", "Div")
            half = _half(p, x)
            if p is not None and half:
                return [p, n], [half]
    return None


def _cube(value: ir.Value | None, x: ir.Value) -> tuple[list[ir.Node], list[_Const]] | None:
    """Match ``x^3`` as Pow(x, 3), Mul(x, Mul(x, x)) or Mul(Mul(x, x), x)."""
    pw = producer(value, "Pow")
    if pw is not None and pw.inputs[0] is x:
        return [pw], [("the exponent", pw.inputs[1], 3.0)]
    m = producer(value, "Mul")
    if m is None:
        return None
    for lin, sq_value in ((m.inputs[0], m.inputs[1]), (m.inputs[1], m.inputs[0])):
        sq = producer(sq_value, "Mul")
        if lin is x and sq is not None and sq.inputs[0] is x and sq.inputs[1] is x:
            return [sq, m], []
    return None


class _GeluRule(Rule[_Match]):
    """Shared check and rewrite; subclasses match the inner part."""

    def __init__(self, allow_contrib: bool) -> None:
        self.allow_contrib = allow_contrib

    def _finish(
        self, anchor: ir.Node, x: ir.Value, inner: list[ir.Node], consts: list[_Const]
    ) -> _Match | None:
        add = consumer(anchor.outputs[0], "Add")
        if add is None:
            return None
        outer = _outer(add.outputs[0], x)
        if outer is None:
            return None
        nodes, more = outer
        one = ("the added 1", other_input(add, anchor.outputs[0]), 1.0)
        return _Match(anchor, x, [*inner, anchor, add, *nodes], [*consts, one, *more], self.approximate)

    approximate = "none"

    def check(self, ctx: Context, m: _Match) -> str | None:
        for role, value, want in m.consts:
            got = scalar(value)
            if not is_close(got, want):
                return f"{m.where}: {role} is {got}, not {want:.9g}"
        reason = exclusive([n.outputs[0] for n in m.nodes[:-1]], m.nodes)
        if reason:
            return f"{m.where}: {reason}"
        if m.x.dtype is not None and not m.x.dtype.is_floating_point():
            return f"{m.where}: {m.x.name} is {m.x.dtype}, not a float type"
        if ctx.opset >= GELU_OPSET:
            return None
        if not self.allow_contrib:
            return (
                f"{m.where}: ONNX Gelu needs opset {GELU_OPSET}; model is at opset {ctx.opset} "
                "and allow_contrib=False forbids com.microsoft ops"
            )
        if m.x.dtype is not None and m.x.dtype != ir.DataType.FLOAT:
            return f"{m.where}: ORT's CPU provider runs com.microsoft GELU ops on float32 only, {m.x.name} is {m.x.dtype}"
        return None

    def rewrite(self, ctx: Context, m: _Match) -> str:
        last = m.nodes[-1]
        graph = last.graph
        assert graph is not None
        form = "erf" if m.approximate == "none" else "tanh"
        if ctx.opset >= GELU_OPSET:
            attrs = {"approximate": "tanh"} if m.approximate == "tanh" else {}
            node = ir.node("Gelu", [m.x], attributes=attrs)
            key = f"fused {form} GELU into Gelu"
        else:
            op = "Gelu" if m.approximate == "none" else "FastGelu"
            node = ir.node(op, [m.x], domain=CONTRIB_DOMAIN)
            ctx.model.opset_imports.setdefault(CONTRIB_DOMAIN, 1)
            key = f"fused {form} GELU into {CONTRIB_DOMAIN}::{op}"
        graph.insert_before(last, node)
        replace_value(last.outputs[0], node.outputs[0])
        drop(m.nodes)
        return key


class ErfGelu(_GeluRule):
    """Replaces `0.5 * x * (1 + Erf(x / sqrt(2)))` with `Gelu(x)`."""

    anchor = "Erf"
    what = "fused erf GELU"

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        scale = producer(node.inputs[0], "Div", "Mul")
        if scale is None:
            return None
        if scale.op_type == "Div":
            x, c, want = scale.inputs[0], scale.inputs[1], math.sqrt(2.0)
        else:
            c = next((v for v in scale.inputs if scalar(v) is not None), None)
            x, want = other_input(scale, c), math.sqrt(0.5)
        if x is None or c is None or scalar(c) is None:
            return None
        return self._finish(node, x, [scale], [("the scale of x", c, want)])


class TanhGelu(_GeluRule):
    """Replaces `0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))` with `Gelu(x, approximate="tanh")`."""

    anchor = "Tanh"
    what = "fused tanh GELU"
    approximate = "tanh"

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        scale = producer(node.inputs[0], "Mul")
        if scale is None:
            return None
        c1 = next((v for v in scale.inputs if scalar(v) is not None), None)
        inner = producer(other_input(scale, c1), "Add") if c1 is not None else None
        if inner is None:
            return None
        for x, term in ((inner.inputs[0], inner.inputs[1]), (inner.inputs[1], inner.inputs[0])):
            mul = producer(term, "Mul")
            c2 = next((v for v in mul.inputs if scalar(v) is not None), None) if mul is not None else None
            if x is None or c2 is None:
                continue
            cube = _cube(other_input(mul, c2), x)
            if cube is None:
                continue
            nodes = [*cube[0], mul, inner, scale]
            consts = [
                *cube[1],
                ("the cubic coefficient", c2, 0.044715),
                ("the tanh scale", c1, math.sqrt(2 / math.pi)),
            ]
            return self._finish(node, x, nodes, consts)
        return None


class FuseGeluPass(ZonnxPass):
    """Fuse erf and tanh GELU subgraphs into Gelu (opset 20+) or com.microsoft Gelu/FastGelu below 20.

    The model's own opset decides which op is written; the pass never changes the default opset.
    Options: ``target_opset`` (default 17), the opset the pipeline upgrades to, used in the advice of
    misses; ``allow_contrib`` (default True) allows ORT's com.microsoft ops below opset 20 (when False,
    such candidates are recorded as misses naming the opset).
    """

    name = "fuse-gelu"

    def __init__(self, target_opset: int = 17, allow_contrib: bool = True) -> None:
        super().__init__()
        self.target_opset = target_opset
        self.allow_contrib = allow_contrib

    def apply(self, model: ir.Model) -> Changes:
        changes = run_rules(model, [ErfGelu(self.allow_contrib), TanhGelu(self.allow_contrib)])
        if self.target_opset >= GELU_OPSET:
            changes.misses = [
                f"{m}; run opset-upgrade to {self.target_opset} first" if "needs opset" in m else m
                for m in changes.misses
            ]
        return changes

    def __repr__(self) -> str:
        return f"{type(self).__name__}(target_opset={self.target_opset}, allow_contrib={self.allow_contrib})"
