"""The one registry of NPU op kinds: every op module of ``zonnx.backend.ops`` and what it registers.

Adding an op kind means adding one module with a ``SPEC`` (``spec.OpSpec``) and one line in ``MODULES``.
The compiler (``compiler.lower``), the numpy reference (``runtime.reference``), the ORT lowering
(``runtime.ort_lowering``) and the partitioner (``partition.lowerable``) read it here.

Pending rules of one ONNX op type are tried in ``MODULES`` order, the first whose ``claims`` accepts the
node wins (MatMul of two activations -> ``matmul2`` before ``matmul``; Add with a constant -> ``lincomb``
before ``add``; Mul of codes or quantized constants -> ``mul`` before ``lincomb``).
"""

from __future__ import annotations

__all__ = [
    "MODULES",
    "KINDS",
    "CODE_RULES",
    "PENDING_OPS",
    "kind",
    "pending_rule",
    "pending_rules",
    "lowerable_op_types",
    "constant_input_indices",
    "lowering_check",
]

import logging
from collections.abc import Callable
from typing import Any

from . import (
    add,
    clamp,
    concat,
    conv,
    gather,
    layout,
    lincomb,
    lut,
    matmul,
    matmul2,
    mul,
    pad,
    pool,
    prelu,
    rescale,
    resize,
    slice,
)
from .spec import LAYOUTS, Kind, OpSpec, Rule

logger = logging.getLogger(__name__)

#: Every op module's spec, in rule order.
MODULES: tuple[OpSpec, ...] = (
    conv.SPEC,
    matmul2.SPEC,
    matmul.SPEC,
    mul.SPEC,
    lincomb.SPEC,
    add.SPEC,
    rescale.SPEC,
    pool.SPEC,
    concat.SPEC,
    lut.SPEC,
    prelu.SPEC,
    clamp.SPEC,
    layout.SPEC,
    resize.SPEC,
    slice.SPEC,
    gather.SPEC,
    pad.SPEC,
)


def _kinds() -> dict[str, Kind]:
    out: dict[str, Kind] = {}
    for spec in MODULES:
        for k in spec.kinds:
            if k.name in out:
                raise ValueError(f"op kind {k.name!r} is registered twice ({spec.module}).")
            if isinstance(k.layout, str) and k.layout not in LAYOUTS:
                raise ValueError(f"op kind {k.name!r}: layout {k.layout!r} is not one of {LAYOUTS}.")
            out[k.name] = k
    return out


def _rules(form: str) -> list[Rule]:
    return [r for spec in MODULES for r in spec.rules if r.form == form]


#: Program op kind -> its reference, ORT lowering, layout rule and native kernels.
KINDS: dict[str, Kind] = _kinds()
#: ONNX op type acting on codes -> ``lower(lowering, node, codes, inputs)``.
CODE_RULES: dict[str, Callable[..., None]] = {op: r.lower for r in _rules("code") for op in r.onnx_ops}
_PENDING: dict[str, list[Rule]] = {}
for _rule in _rules("pending"):
    for _op in sorted(_rule.onnx_ops):
        _PENDING.setdefault(_op, []).append(_rule)
#: ONNX op types that wait for their output quantizer.
PENDING_OPS: frozenset[str] = frozenset(_PENDING)
_ALWAYS = frozenset({"Constant", "QuantizeLinear", "DequantizeLinear"})


def kind(name: str) -> Kind | None:
    """The registered program op kind ``name`` (None when unknown)."""
    return KINDS.get(name)


def pending_rules(op_type: str) -> tuple[Rule, ...]:
    """The pending rules of ``op_type`` in the order they are tried."""
    return tuple(_PENDING.get(op_type, ()))


def pending_rule(p: Any) -> Rule | None:
    """The rule that lowers pending node ``p`` (first in ``MODULES`` order that claims it)."""
    for rule in _PENDING.get(p.node.op_type, ()):
        if rule.claims is None or rule.claims(p):
            return rule
    return None


def lowerable_op_types() -> frozenset[str]:
    """ONNX op types (default domain) that ``compile_subgraph`` lowers, quantizers and Constant included."""
    return _ALWAYS | PENDING_OPS | frozenset(CODE_RULES)


def constant_input_indices(op_type: str) -> tuple[int, ...]:
    """Input indices of ``op_type`` the compiler needs as constants."""
    for spec in MODULES:
        if op_type in spec.const_inputs:
            return spec.const_inputs[op_type]
    return ()


def lowering_check(op_type: str) -> Callable[[Any], str | None] | None:
    """The op module's extra lowering check for ``op_type`` (``fn(node) -> reason or None``)."""
    for spec in MODULES:
        if op_type in spec.checks:
            return spec.checks[op_type]
    return None
