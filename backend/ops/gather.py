"""``gather``: Gather with constant indices on codes.

``q_y = np.take(q_x, indices, axis)`` on the input's grid (negative indices count from the end), exact.
ORT lowering: ONNX ``Gather`` on stored codes, in the program's layout.
"""

from __future__ import annotations

__all__ = ["SPEC", "compile_gather", "reference", "lower_ort"]

import logging
from typing import Any

import numpy as np
import onnx

from zonnx.backend.compiler.params import node_attrs
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.values import Codes, CompileError, constant_params
from zonnx.backend.runtime.ort_kernels import Storage
from zonnx.backend.runtime.ort_values import Val, require_program_layout

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)


def compile_gather(low: Any, node: onnx.NodeProto, x: Codes, ins: list[Any]) -> None:
    """Emit the ``gather`` of a Gather with constant indices."""
    consts, a = constant_params(node, x, ins), node_attrs(node)
    if consts[1] is None:
        raise CompileError(f"node {node.name!r}: Gather needs constant indices.")
    idx = np.asarray(consts[1], np.int64)
    attrs = {"axis": int(a.get("axis", 0)), "indices": idx.tolist()}
    out = node.output[0]
    low.add_tensor(out, x.qp)
    low.emit("gather", node.name, [x.tensor], [out], attrs, {}, [node.name])
    low.val[out] = Codes(out, x.qp)


def reference(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``np.take(q_x, indices, axis)``."""
    x = args[0]
    axis = op.attrs["axis"] % x.ndim
    idx = np.asarray(op.attrs["indices"], np.int64)
    return np.take(x, np.where(idx < 0, idx + x.shape[axis], idx), axis=axis)


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """ONNX Gather with constant indices."""
    require_program_layout(args, op)
    idx = low.b.const(np.asarray(op.attrs["indices"], np.int64), np.int64, "indices")
    return low.b.op("Gather", [args[0].name, idx], axis=op.attrs["axis"])


SPEC = OpSpec(
    module=__name__,
    kinds=(Kind("gather", reference, lower_ort),),
    rules=(Rule(frozenset({"Gather"}), "code", compile_gather),),
    const_inputs={"Gather": (1,)},
)
