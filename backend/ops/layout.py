"""Code moves: ``copy``, ``reshape``, ``flatten``, ``transpose``, ``squeeze``, ``unsqueeze``.

Each output code is one input code on the same grid, ``q_y[i] = q_x[index(i)]`` with ONNX's index rules
(Identity, Reshape with a constant shape and ``allowzero``, Flatten, Transpose, Squeeze, Unsqueeze), so
the integer op is exact; per-channel grids are refused (the channel axis could move). A following
quantizer with another grid adds a ``rescale``; ``copy`` also joins a value to a quantizer on the same
grid. ORT lowering: the same ONNX op on stored codes (an offset commutes with a move).
"""

from __future__ import annotations

__all__ = ["SPEC", "compile_move", "lower_ort"]

import logging
import math
from typing import Any

import numpy as np
import onnx

from zonnx.backend.compiler.params import node_attrs
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.values import Codes, CompileError, constant_inputs, emit_code
from zonnx.backend.runtime.ort_kernels import Storage
from zonnx.backend.runtime.ort_values import Val

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)

_ONNX = frozenset({"Identity", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze"})


def _attrs(node: onnx.NodeProto, consts: list[np.ndarray | None]) -> tuple[str, dict[str, Any]]:
    op, a = node.op_type, node_attrs(node)
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise CompileError(f"node {node.name!r}: auto_pad is not supported; make pads explicit.")
    if op == "Identity":
        return "copy", {}
    if op == "Reshape":
        if len(consts) < 2 or consts[1] is None:
            raise CompileError(f"node {node.name!r}: Reshape needs a constant shape.")
        return "reshape", {"shape": [int(v) for v in consts[1]], "allowzero": int(a.get("allowzero", 0))}
    if op == "Flatten":
        return "flatten", {"axis": int(a.get("axis", 1))}
    if op == "Transpose":
        return "transpose", {"perm": [int(v) for v in a["perm"]] if "perm" in a else None}
    axes = a.get("axes")  # Squeeze, Unsqueeze
    if axes is None and len(consts) > 1 and consts[1] is not None:
        axes = consts[1]
    return op.lower(), {"axes": None if axes is None else [int(v) for v in np.asarray(axes).reshape(-1)]}


def compile_move(low: Any, node: onnx.NodeProto, x: Codes, ins: list[Any]) -> None:
    """Emit the code move of ``node`` reading codes ``x`` (module docstring)."""
    kind, attrs = _attrs(node, constant_inputs(ins))
    emit_code(low, node, x, kind, attrs)


def _reshape(args: list[np.ndarray], op: Op) -> np.ndarray:
    x = args[0]
    shape = list(op.attrs["shape"])
    if not op.attrs.get("allowzero"):
        shape = [x.shape[i] if v == 0 else v for i, v in enumerate(shape)]
    return x.reshape(shape)


def _squeeze(args: list[np.ndarray], op: Op) -> np.ndarray:
    axes = op.attrs["axes"]
    return np.squeeze(args[0]) if axes is None else np.squeeze(args[0], axis=tuple(axes))


def _unsqueeze(args: list[np.ndarray], op: Op) -> np.ndarray:
    x = args[0]
    axes = sorted(v % (x.ndim + len(op.attrs["axes"])) for v in op.attrs["axes"])
    for ax in axes:
        x = np.expand_dims(x, ax)
    return x


def _flatten(args: list[np.ndarray], op: Op) -> np.ndarray:
    x = args[0]
    return x.reshape(math.prod(x.shape[: op.attrs["axis"]]), -1)


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """The ONNX op of the kind on stored codes."""
    x, a, b = args[0].name, op.attrs, low.b
    if op.kind == "copy":
        return b.op("Identity", [x])
    if op.kind == "reshape":
        shape = b.const(a["shape"], np.int64, "shape")
        # allowzero exists from opset 14: written only when set, so opset-13 models stay valid
        extra = {"allowzero": 1} if a.get("allowzero") else {}
        return b.op("Reshape", [x, shape], **extra)
    if op.kind == "flatten":
        return b.op("Flatten", [x], axis=a["axis"])
    if op.kind == "transpose":
        perm = a.get("perm")
        return b.op("Transpose", [x], **({} if perm is None else {"perm": perm}))
    if op.kind == "squeeze":
        axes = a.get("axes")
        return b.op("Squeeze", [x] + ([] if axes is None else [b.const(axes, np.int64, "axes")]))
    return b.op("Unsqueeze", [x, b.const(a["axes"], np.int64, "axes")])


SPEC = OpSpec(
    module=__name__,
    kinds=(
        Kind("copy", lambda args, op: args[0].copy(), lower_ort, "input"),
        Kind("reshape", _reshape, lower_ort),
        Kind("flatten", _flatten, lower_ort),
        Kind("transpose", lambda args, op: np.transpose(args[0], op.attrs["perm"]), lower_ort),
        Kind("squeeze", _squeeze, lower_ort),
        Kind("unsqueeze", _unsqueeze, lower_ort),
    ),
    rules=(Rule(_ONNX, "code", compile_move),),
)
