"""What the compiler tracks per ONNX value while it lowers a subgraph, and the compile error.

A value is integer codes of a program tensor (``Codes``: ``real = S (q - Z)`` on grid ``qp``), a
constant (``Const``: quantized codes with their grid, or a float value), a float op waiting for its
output quantizer (``Pending``, with the Relu/Clip clamps and the constant factor fused into it), or codes
under a Relu/Clip that only quantizers read (``Clamped``). Op
modules (``zonnx.backend.ops``) read these and emit program ops through the lowering object they are
handed; nothing here knows an op kind.
"""

from __future__ import annotations

__all__ = [
    "CompileError",
    "Clamped",
    "Codes",
    "Const",
    "Pending",
    "constant_inputs",
    "constant_params",
    "emit_code",
]

import logging
from typing import Any

import numpy as np
import onnx

from zonnx.errors import ZonnxError

logger = logging.getLogger(__name__)


class CompileError(ZonnxError):
    """A subgraph cannot be lowered to the target's integer operations (the message names the node)."""


class Codes:
    """A float value equal to dequantize(program tensor ``tensor``)."""

    def __init__(self, tensor: str, qp: Any) -> None:
        self.tensor, self.qp = tensor, qp


class Const:
    """A constant: integer ``codes`` with grid ``qp`` (quantized), or a float ``value`` (qp None)."""

    def __init__(self, value: np.ndarray, qp: Any = None) -> None:
        self.value, self.qp = value, qp


class Pending:
    """A float op result waiting for its output quantizer, with fused activations."""

    def __init__(self, node: onnx.NodeProto, ins: list[Any]) -> None:
        self.node, self.ins = node, ins
        self.acts: list[tuple[str, float, float]] = []
        self.mul = 1.0
        self.sources = [node.name]


class Clamped:
    """Codes ``x`` under a Relu/Clip ``act`` (``("clip", a, b)``) whose every reader is a quantizer: each
    quantizer folds the clamp into its output range, ``Q_y(clip(v, a, b)) = clip(Q_y(v), Q_y(a), Q_y(b))``
    (exact: ``Q_y`` is monotone). Clamping on ``x``'s grid first would round ``a`` and ``b`` to that grid,
    off by up to half its step, which a finer output grid shows as several codes."""

    def __init__(self, x: Codes, act: tuple[str, float, float], source: str) -> None:
        self.x, self.act, self.sources = x, act, [source]


def constant_inputs(ins: list[Any]) -> list[np.ndarray | None]:
    """The constant operands of a node as arrays (None for absent inputs and for codes)."""
    return [None if v is None or isinstance(v, Codes) else np.asarray(v.value) for v in ins]


def constant_params(node: onnx.NodeProto, x: Codes, ins: list[Any]) -> list[np.ndarray | None]:
    """``constant_inputs`` of a selection op (Slice, Split, Gather, Pad): every operand after the data
    must be a constant and the data per tensor."""
    consts = constant_inputs(ins)
    if any(isinstance(v, Codes) for v in ins[1:]):
        raise CompileError(f"node {node.name!r} ({node.op_type}): its parameters must be constants.")
    if x.qp.axis is not None:
        raise CompileError(f"node {node.name!r}: per-channel activations cannot go through {node.op_type}.")
    return consts


def emit_code(
    low: Any, node: onnx.NodeProto, x: Codes, kind: str, attrs: dict, *, per_channel: bool = False
) -> None:
    """Emit the one code op ``kind`` of ``node`` reading codes ``x``: its output keeps ``x``'s grid.

    Per-channel grids pass only where ``per_channel`` (the op keeps every channel in place).
    """
    if x.qp.axis is not None and not per_channel:
        raise CompileError(f"node {node.name!r}: per-channel activations cannot go through {node.op_type}.")
    out = node.output[0]
    low.add_tensor(out, x.qp)
    low.emit(kind, node.name, [x.tensor], [out], attrs, {}, [node.name])
    low.val[out] = Codes(out, x.qp)
