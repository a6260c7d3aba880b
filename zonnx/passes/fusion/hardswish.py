"""Fuse decomposed hard-sigmoid and hard-swish into ONNX HardSigmoid and HardSwish.

Exporters (paddle2onnx, older torch) write MobileNetV3's activations from elementary ops::

    hsig(x) = Clip(x + 3, 0, 6) / 6             = HardSigmoid(x, alpha=1/6, beta=0.5)
    hswish(x) = x * Clip(x + 3, 0, 6) / 6       = HardSwish(x)                 (opset 14+)
    hswish(x) = x * HardSigmoid(x, 1/6, 0.5)    = HardSwish(x)

Matched: ``Add(x, 3)`` (either operand order) -> ``Clip(., 0, 6)`` (bounds as inputs, opset 11+, or
attributes) -> either ``Div(., 6)`` / ``Mul(., 1/6)`` (then optionally ``Mul(x, .)``), or ``Mul(x, .)``
then ``Div(., 6)`` / ``Mul(., 1/6)``; and ``Mul(x, HardSigmoid(x))`` with alpha 1/6, beta 0.5. Constants
are compared to a relative tolerance of 1e-6 (HardSigmoid's float32 alpha to 1e-6 too). Every inner value
must be read only inside the pattern.

Why: a quantizer rounds every tensor it sees, and an NPU runs HardSwish as one operation (a table or a
fused activation of the convolution); quantizing its four pieces adds four rounding steps the hardware
does not have. Below opset 14 ONNX has no HardSwish: the pass then writes the HardSigmoid part only and
records a miss naming the opset.
"""

from __future__ import annotations

__all__ = ["FuseHardSwishPass", "HARDSWISH_OPSET", "OPSET_MISS", "missed_for_opset"]

import dataclasses
import logging

import onnx_ir as ir

from zonnx.passes.base import Changes, ZonnxPass
from zonnx.passes.fusion.matching import (
    Context,
    Rule,
    consumer,
    exclusive,
    is_close,
    label,
    other_input,
    producer,
    replace_with_meaning,
    run_rules,
    scalar,
)

logger = logging.getLogger(__name__)

#: First default-domain opset with HardSwish.
HARDSWISH_OPSET = 14
#: The words of a miss recorded because the model's opset has no HardSwish (``missed_for_opset``).
OPSET_MISS = f"HardSwish needs opset {HARDSWISH_OPSET}"


def missed_for_opset(changes: Changes) -> bool:
    """Whether a run of this pass left a hard-swish only because the model's opset has no HardSwish."""
    return any(OPSET_MISS in m for m in changes.misses)


_SIXTH = 1.0 / 6.0


@dataclasses.dataclass
class _Match:
    x: ir.Value
    nodes: list[ir.Node]  # output node last
    swish: bool  # x * hsig(x) (else hsig(x) alone)


def _clip_bounds(clip: ir.Node) -> tuple[float | None, float | None]:
    if len(clip.inputs) > 1:
        lo = scalar(clip.inputs[1]) if clip.inputs[1] is not None else None
        hi = scalar(clip.inputs[2]) if len(clip.inputs) > 2 and clip.inputs[2] is not None else None
        return lo, hi
    return clip.attributes.get_float("min", None), clip.attributes.get_float("max", None)


def _is_sixth(node: ir.Node | None, value: ir.Value) -> bool:
    """``node`` divides ``value`` by 6 (Div by 6, Mul by 1/6)."""
    if node is None:
        return False
    if node.op_type == "Div":
        return node.inputs[0] is value and is_close(scalar(node.inputs[1]), 6.0)
    if node.op_type == "Mul":
        return is_close(scalar(other_input(node, value)), _SIXTH)
    return False


def _times_x(value: ir.Value, x: ir.Value) -> ir.Node | None:
    mul = consumer(value, "Mul")
    return mul if mul is not None and other_input(mul, value) is x else None


class DecomposedHardSwish(Rule[_Match]):
    """Replaces `Clip(x + 3, 0, 6) / 6` with HardSigmoid and `x * Clip(x + 3, 0, 6) / 6` with HardSwish."""

    anchor = "Clip"
    what = "fused HardSwish"

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        add = producer(node.inputs[0], "Add")
        if add is None:
            return None
        x = next((v for v in add.inputs if is_close(scalar(other_input(add, v)), 3.0)), None)
        if x is None or _clip_bounds(node) != (0.0, 6.0):
            return None
        clipped = node.outputs[0]
        div = next((n for n in clipped.consumers() if _is_sixth(n, clipped)), None)
        if div is not None:
            mul = _times_x(div.outputs[0], x)
            return _Match(x, [add, node, div] + ([mul] if mul else []), mul is not None)
        mul = _times_x(clipped, x)
        if mul is None:
            return None
        div = next((n for n in mul.outputs[0].consumers() if _is_sixth(n, mul.outputs[0])), None)
        return _Match(x, [add, node, mul, div], True) if div is not None else None

    def check(self, ctx: Context, m: _Match) -> str | None:
        reason = exclusive([n.outputs[0] for n in m.nodes[:-1]], m.nodes)
        if reason:
            return f"hard-swish pattern at {label(m.nodes[1])}: {reason}"
        if m.swish and ctx.opset < HARDSWISH_OPSET:
            # the HardSigmoid rule below still fuses the inner part
            return f"hard-swish pattern at {label(m.nodes[1])}: {OPSET_MISS}, the model is at {ctx.opset}"
        return None

    def rewrite(self, ctx: Context, m: _Match) -> str:
        last = m.nodes[-1]
        graph = last.graph
        assert graph is not None
        if m.swish:
            node = ir.node("HardSwish", [m.x])
            key = "fused HardSwish"
        else:
            node = ir.node("HardSigmoid", [m.x], attributes={"alpha": _SIXTH, "beta": 0.5})
            key = "fused HardSigmoid"
        graph.insert_before(last, node)
        replace_with_meaning(last.outputs[0], node.outputs[0], m.nodes)
        return key


class InnerHardSigmoid(DecomposedHardSwish):
    """Below opset 14: replaces the `Clip(x + 3, 0, 6) / 6` inside a hard-swish with HardSigmoid."""

    what = "fused HardSigmoid"

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        m = super().pattern(ctx, node)
        if m is None or not m.swish or ctx.opset >= HARDSWISH_OPSET:
            return None
        if not _is_sixth(m.nodes[2], m.nodes[1].outputs[0]):
            return None  # x * clip first, then / 6: the HardSigmoid part is not a value of its own
        return _Match(m.x, m.nodes[:3], False)

    def check(self, ctx: Context, m: _Match) -> str | None:
        reason = exclusive([n.outputs[0] for n in m.nodes[:-1]], m.nodes)
        return f"hard-sigmoid pattern at {label(m.nodes[1])}: {reason}" if reason else None


class HardSigmoidSwish(Rule[_Match]):
    """Replaces `x * HardSigmoid(x, 1/6, 0.5)` with `HardSwish(x)`."""

    anchor = "HardSigmoid"
    what = "fused HardSwish"

    def pattern(self, ctx: Context, node: ir.Node) -> _Match | None:
        x = node.inputs[0]
        alpha, beta = node.attributes.get_float("alpha", 0.2), node.attributes.get_float("beta", 0.5)
        if x is None or not (is_close(alpha, _SIXTH) and is_close(beta, 0.5)):
            return None
        mul = _times_x(node.outputs[0], x)
        return _Match(x, [node, mul], True) if mul is not None else None

    def check(self, ctx: Context, m: _Match) -> str | None:
        hsig = m.nodes[0]
        reason = exclusive([hsig.outputs[0]], m.nodes)
        if reason:
            return f"hard-swish pattern at {label(hsig)}: {reason}"
        if ctx.opset < HARDSWISH_OPSET:
            return f"hard-swish pattern at {label(hsig)}: {OPSET_MISS}, the model is at {ctx.opset}"
        return None

    def rewrite(self, ctx: Context, m: _Match) -> str:
        return DecomposedHardSwish.rewrite(self, ctx, m)  # type: ignore[arg-type]


class FuseHardSwishPass(ZonnxPass):
    """Fuse decomposed hard-sigmoid / hard-swish into HardSigmoid / HardSwish (see the module docstring)."""

    name = "fuse-hardswish"

    def apply(self, model: ir.Model) -> Changes:
        return run_rules(model, [DecomposedHardSwish(), InnerHardSigmoid(), HardSigmoidSwish()])
