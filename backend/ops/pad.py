"""``pad``: Pad on codes (modes constant, edge, reflect; non-negative constant pads).

Each output code is an input code or, in constant mode, the pad value's code ``Q_x(v)`` (the code the
model's next quantizer gives it on the same grid), so the op is exact. ORT lowering: ONNX ``Pad`` on
stored codes, in the program's layout; the pad code is stored as ``value + offset``.
"""

from __future__ import annotations

__all__ = ["SPEC", "compile_pad", "reference", "lower_ort"]

import logging
from typing import Any

import numpy as np
import onnx

from zonnx.backend.compiler.params import const_ints, node_attrs, quantize_float
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.values import Codes, CompileError, constant_params
from zonnx.backend.runtime.ort_kernels import KernelError, Storage
from zonnx.backend.runtime.ort_values import Val, require_program_layout

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)


def compile_pad(low: Any, node: onnx.NodeProto, x: Codes, ins: list[Any]) -> None:
    """Emit the ``pad`` of a Pad with constant pads (module docstring)."""
    consts, a = constant_params(node, x, ins), node_attrs(node)
    mode = a.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    pads = const_ints(consts[1]) if len(consts) > 1 else const_ints(a.get("pads"))
    if pads is None or min(pads) < 0:
        raise CompileError(f"node {node.name!r}: Pad needs constant, non-negative pads (got {pads}).")
    if mode not in ("constant", "edge", "reflect"):
        raise CompileError(f"node {node.name!r}: pad mode {mode!r} is not supported.")
    value = a.get("value", 0.0)
    if len(ins) > 2 and ins[2] is not None:  # the pad value, dequantized when it is a quantized constant
        v = ins[2]
        value = (
            np.asarray(v.value, np.float64) if v.qp is None else v.qp.scale * (np.asarray(v.value) - v.qp.zp)
        )
    code = int(quantize_float(np.asarray(value, np.float64).reshape(()), x.qp))
    axes = const_ints(consts[3]) if len(consts) > 3 else None
    attrs = {"pads": pads, "axes": axes, "mode": mode, "value": code}
    out = node.output[0]
    low.add_tensor(out, x.qp)
    low.emit("pad", node.name, [x.tensor], [out], attrs, {}, [node.name])
    low.val[out] = Codes(out, x.qp)


def reference(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``np.pad`` with the op's pads (over ``axes``) and mode."""
    x, a = args[0], op.attrs
    axes = [v % x.ndim for v in a["axes"]] if a["axes"] is not None else list(range(x.ndim))
    n = len(axes)
    width = [(0, 0)] * x.ndim
    for i, ax in enumerate(axes):
        width[ax] = (a["pads"][i], a["pads"][i + n])
    if a["mode"] == "constant":
        return np.pad(x, width, mode="constant", constant_values=a["value"])
    return np.pad(x, width, mode=a["mode"])


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """ONNX Pad (constant, edge, reflect); the pad code is stored as ``value + offset``."""
    require_program_layout(args, op)
    (x,), a = args, op.attrs
    pads = list(a["pads"])
    if a["axes"] is not None:
        rank = len(x.info.shape) if x.info.shape is not None else None
        if rank is None:
            raise KernelError(f"op {op.name!r}: Pad with axes needs the input rank.")
        n, full = len(a["axes"]), [0] * (2 * rank)
        for i, ax in enumerate(a["axes"]):
            full[ax % rank], full[ax % rank + rank] = pads[i], pads[i + n]
        pads = full
    ins = [x.name, low.b.const(pads, np.int64, "pads")]
    if a["mode"] == "constant":
        ins.append(low.b.const(a["value"] + x.st.offset, x.st.dtype, "pv"))
    return low.b.op("Pad", ins, mode=a["mode"])


SPEC = OpSpec(
    module=__name__,
    kinds=(Kind("pad", reference, lower_ort),),
    rules=(Rule(frozenset({"Pad"}), "code", compile_pad),),
    const_inputs={"Pad": (1, 2, 3)},
)
