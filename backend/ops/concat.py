"""``concat``: Concat of codes on one grid.

Every input with another grid than the output is rescaled first (``rescale``), then codes are joined::

    q_y = clamp(concat(q_1, ..., q_n, axis), lo, hi)

(``lo``/``hi`` from a fused Relu/Clip). ORT lowering: ``Concat`` of the stored codes (one storage type),
then ``Clip`` when the bounds narrow the inputs' range.
"""

from __future__ import annotations

__all__ = ["SPEC", "compile_concat", "reference", "lower_ort"]

import logging
from typing import Any

import numpy as np

from zonnx.backend.compiler.params import QParams
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.runtime.ort_kernels import KernelError, Storage
from zonnx.backend.runtime.ort_values import Val, clip_stored

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)


def compile_concat(low: Any, p: Any, out: str, qp: QParams, sources: list[str], base: dict) -> None:
    """Emit the ``concat`` of a pending Concat, rescaling inputs on other grids."""
    node = p.node
    names = []
    for i, v in enumerate(p.ins):
        x = low.codes(v, node)
        if x.qp.same(qp):
            names.append(x.tensor)
        else:
            tmp = f"{out}__concat_in{i}"
            low.add_tensor(tmp, qp)
            low.emit_rescale(x.tensor, x.qp, tmp, qp, [node.name])
            names.append(tmp)
    axis = next(a.i for a in node.attribute if a.name == "axis")
    attrs = {"axis": int(axis), "lo": base["lo"], "hi": base["hi"]}
    low.emit("concat", node.name, names, [out], attrs, {}, sources)


def reference(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``clamp(concat(args, axis), lo, hi)``."""
    return np.clip(np.concatenate(args, axis=op.attrs["axis"]), op.attrs["lo"], op.attrs["hi"])


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """``Concat`` of stored codes, then ``Clip`` if the bounds narrow the range."""
    if any(v.st != ost for v in args):
        raise KernelError(f"op {op.name!r}: concat inputs must share the output's dtype.")
    out = low.b.op("Concat", [v.name for v in args], axis=op.attrs["axis"])
    lo, hi = op.attrs["lo"], op.attrs["hi"]
    if lo > min(v.info.qmin for v in args) or hi < max(v.info.qmax for v in args):
        out = clip_stored(low.b, out, lo, hi, ost)
    return out


SPEC = OpSpec(
    module=__name__,
    kinds=(Kind("concat", reference, lower_ort),),
    rules=(Rule(frozenset({"Concat"}), "pending", compile_concat),),
)
