"""``clamp``: Relu / Clip on codes, and the clamp bounds of a Relu / Clip fused into the op before it.

Relu and Clip are monotone on one grid, so on codes::

    q_y = clamp(q_x, lo, hi),   lo = Q(a) (Relu: a = 0), hi = Q(b)

with ``Q`` the grid's quantizer (exact: Q is monotone); fused into a requantizing op they narrow its
output clamp instead (``activation``, ``params.clamp_bounds``). ORT lowering: ``Clip`` on stored codes.
"""

from __future__ import annotations

__all__ = ["SPEC", "activation", "compile_clamp", "reference", "lower_ort"]

import logging
from typing import Any

import numpy as np
import onnx

from zonnx.backend.compiler.params import clamp_bounds
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.values import Codes
from zonnx.backend.runtime.ort_kernels import Storage
from zonnx.backend.runtime.ort_values import Val, clip_stored

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)

#: ONNX ops that are clamps (fused into a pending op, or a ``clamp`` on codes).
CLAMP_OPS = frozenset({"Relu", "Clip"})


def activation(node: onnx.NodeProto, ins: list[Any]) -> tuple[str, float, float]:
    """("clip", a, b): the real bounds of a Relu / Clip (inputs or Clip-6 attributes)."""
    if node.op_type == "Relu":
        return ("clip", 0.0, np.inf)
    lo = float(np.asarray(ins[1].value)) if len(ins) > 1 and ins[1] is not None else -np.inf
    hi = float(np.asarray(ins[2].value)) if len(ins) > 2 and ins[2] is not None else np.inf
    for a in node.attribute:  # Clip-6 attributes
        lo = a.f if a.name == "min" else lo
        hi = a.f if a.name == "max" else hi
    return ("clip", lo, hi)


def compile_clamp(low: Any, node: onnx.NodeProto, x: Codes, ins: list[Any]) -> None:
    """Emit the ``clamp`` of a Relu / Clip reading codes ``x``."""
    lo, hi = clamp_bounds([activation(node, ins)], x.qp)
    out = node.output[0]
    low.add_tensor(out, x.qp)
    low.emit("clamp", node.name, [x.tensor], [out], {"lo": lo, "hi": hi}, {}, [node.name])
    low.val[out] = Codes(out, x.qp)


def reference(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``clamp(q_x, lo, hi)``."""
    return np.clip(args[0], op.attrs["lo"], op.attrs["hi"])


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """``Clip`` on stored codes; none when ``[lo, hi]`` holds the input's whole code range ``[qmin, qmax]``
    (the clamp is then the identity: a residual add's Relu on an output grid whose zero point is its qmin)."""
    if op.attrs["lo"] <= args[0].info.qmin and op.attrs["hi"] >= args[0].info.qmax:
        return args[0].name
    return clip_stored(low.b, args[0].name, op.attrs["lo"], op.attrs["hi"], args[0].st)


SPEC = OpSpec(
    module=__name__,
    kinds=(Kind("clamp", reference, lower_ort, "input"),),
    rules=(Rule(CLAMP_OPS, "code", compile_clamp),),
)
