"""Building blocks of the ONNX function bodies: attribute constants, the grid, exact float32 rounding.

Every constant comes from the node's attributes through ``ref_attr_name`` (``Constant(value_int=@pos)``
then Cast and Pow), so one body serves every node; ORT inlines the body at load time and folds these
constants, leaving 4 to 11 elementwise ops per node. Before folding a body has 20 to 33 nodes, and ORT's
session setup grows faster than linearly with node count (200 chained FixNeurons: 1.0 s with ORT's
default optimizations, 4.5 s with none), so the bodies are kept small. The algebra, all exact in float32:

- ``2^k`` is ``Pow(2, k)``, exact for integer k (measured in ORT 1.31 for k in [-150, 129]);
  ``x * 2^k`` is exact unless it overflows or leaves the normal range, and the reference defines
  the scaled value as that same float32 product.
- with ``p = 2^(bw - signed)``: ``qmax = p - 1`` and ``qmin = signed * (narrow - p)``, which is -0.0 when
  unsigned (0 times a negative number); ``2^-pos`` is ``1 / 2^pos`` (or ``2 / 2^(pos+1)``), exact.
- clamp first: for integer bounds and monotone rounding, ``round(clamp(v)) == clamp(round(v))``; it also
  turns +-inf into the bounds before rounding.
- half_even, floor: ONNX Round, Floor.  trunc: ``Where(c > 0, Floor(c), Ceil(c))``.
- half_up: ``floor(v + 0.5)`` evaluated in float32 is wrong for v = 0.5 - 2^-25 (the sum rounds up to 1),
  so the body uses ``floor(v + 1/2) = ceil(floor(2v) / 2)`` (n = floor(2v): odd n -> (n+1)/2, even -> n/2),
  with the 2 folded into the scale (``2^(pos+1)``) and the clamp bounds (2 qmin, 2 qmax).
- half_away: ``ceil(floor(2v) / 2)`` for v > 0 and its mirror ``floor(ceil(2v) / 2)`` for v <= 0.
- ORT's Where turns a -0.0 taken from its first branch into +0.0 (its second branch is bit-exact), so
  each Where selects on ``c > 0`` and the branch that can yield -0.0 (or NaN) comes second.
- Ceil, Floor, Round and Clip keep the sign of a zero, and an unsigned grid clamps at -0.0, so a zero
  code has the sign of v (the rule ``grid.py`` states); this also makes the doubled scale harmless where
  ``x * 2^pos`` underflows to -0.0 but ``x * 2^(pos+1)`` is a tiny negative number.
"""

from __future__ import annotations

__all__ = ["Body", "emit_code", "emit_scale", "emit_inverse", "emit_pow2", "make_function"]

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx
from onnx import helper

logger = logging.getLogger(__name__)


class Body:
    """An ordered list of function-body nodes with generated local tensor names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self._count = 0
        self._cache: dict[str, str] = {}

    def add(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        """Append ``op_type(inputs)`` and return the name of its single output."""
        out = f"{op_type.lower()}_{self._count}"
        self._count += 1
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def const(self, value: float) -> str:
        """A float32 scalar constant (one node per distinct value)."""
        return self.cached(f"const:{value!r}", lambda: self.add("Constant", value_float=float(value)))

    def rename(self, tensor: str, new_name: str) -> None:
        """Give ``tensor`` the name ``new_name`` everywhere (used to name the function's outputs)."""
        for node in self.nodes:
            node.input[:] = [new_name if t == tensor else t for t in node.input]
            node.output[:] = [new_name if t == tensor else t for t in node.output]

    def cached(self, key: str, build: Callable[[], str]) -> str:
        """The tensor ``build()`` emits, emitted once per body under ``key``."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def attr_int(self, attr: str) -> str:
        """The int attribute ``attr`` of the calling node as an int64 scalar."""

        def build() -> str:
            out = self.add("Constant", value_int=0)
            self.nodes[-1].attribute[0].ref_attr_name = attr
            return out

        return self.cached(f"attr:{attr}", build)

    def attr_float(self, attr: str) -> str:
        """The int attribute ``attr`` of the calling node as a float32 scalar."""
        return self.cached(
            f"attr:{attr}:float", lambda: self.add("Cast", self.attr_int(attr), to=onnx.TensorProto.FLOAT)
        )


def emit_pow2(body: Body, exponent: str) -> str:
    """``2^exponent`` for a float32 scalar holding an integer."""
    return body.add("Pow", body.const(2.0), exponent)


def _round(body: Body, c: str, mode: str) -> str:
    """Integer-valued float32 code from the clamped value ``c`` (2v for half_up and half_away)."""
    if mode == "half_even":
        return body.add("Round", c)
    if mode == "floor":
        return body.add("Floor", c)
    if mode == "trunc":
        positive = body.add("Greater", c, body.const(0.0))
        return body.add("Where", positive, body.add("Floor", c), body.add("Ceil", c))
    half = body.const(0.5)
    up = body.add("Ceil", body.add("Mul", body.add("Floor", c), half))
    if mode == "half_up":
        return up
    if mode == "half_away":
        positive = body.add("Greater", c, body.const(0.0))
        down = body.add("Floor", body.add("Mul", body.add("Ceil", c), half))
        return body.add("Where", positive, up, down)
    raise ValueError(f"unknown rounding mode {mode!r}")


def _doubled(mode: str) -> bool:
    """half_up and half_away work on 2v (scale 2^(pos+1), bounds 2 qmin and 2 qmax)."""
    return mode in ("half_up", "half_away")


def emit_code(body: Body, x: str, mode: str) -> str:
    """Emit ``round_mode(clamp(x * 2^pos, qmin, qmax))`` as a float32 tensor; return its name."""
    one = body.const(1.0)
    signed = body.attr_float("signed")
    exponent = body.add(
        "Cast",
        body.add("Sub", body.attr_int("bit_width"), body.attr_int("signed")),
        to=onnx.TensorProto.FLOAT,
    )
    span = emit_pow2(body, exponent)  # 2^(bw - signed) = qmax + 1
    qmax = body.add("Sub", span, one)
    qmin = body.add("Mul", signed, body.add("Sub", body.attr_float("narrow"), span))
    lo, hi = (body.add("Add", qmin, qmin), body.add("Add", qmax, qmax)) if _doubled(mode) else (qmin, qmax)
    clamped = body.add("Clip", body.add("Mul", x, emit_scale(body, mode)), lo, hi)
    return _round(body, clamped, mode)


def emit_scale(body: Body, mode: str) -> str:
    """The input scale of ``mode``: 2^pos, or 2^(pos+1) for the doubled modes (one node per body)."""

    def build() -> str:
        pos = body.attr_float("pos")
        return emit_pow2(body, body.add("Add", pos, body.const(1.0)) if _doubled(mode) else pos)

    return body.cached(f"scale:{_doubled(mode)}", build)


def emit_inverse(body: Body, mode: str) -> str:
    """``2^-pos``, exactly, from the scale the body already has: 1 / 2^pos or 2 / 2^(pos+1)."""
    scale = emit_scale(body, mode)
    return body.add("Div", body.const(2.0), scale) if _doubled(mode) else body.add("Reciprocal", scale)


def make_function(
    name: str,
    domain: str,
    body: Body,
    *,
    inputs: Sequence[str],
    outputs: Sequence[str],
    opset: int,
    required: Sequence[str],
    defaults: Mapping[str, int | str],
    overload: str = "",
    doc: str = "",
) -> onnx.FunctionProto:
    """Wrap ``body`` as a FunctionProto: attributes without a default by name, the others with values."""
    function = helper.make_function(
        domain,
        name,
        list(inputs),
        list(outputs),
        body.nodes,
        [helper.make_opsetid("", opset)],
        attributes=list(required),
        attribute_protos=[helper.make_attribute(k, v) for k, v in defaults.items()],
        doc_string=doc,
    )
    function.overload = overload
    return function
