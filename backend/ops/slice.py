"""``slice``: Slice and Split on codes (ONNX index rules, every parameter a constant).

Each output code is one input code on the same grid, ``q_y[i] = q_x[index(i)]``, so the op is exact. Per
axis ``a`` the indices are ``range(start_a, end_a, step_a)`` after ONNX's clamping (negative starts/ends
count from the end; starts clamp to ``[0, d]`` and ends to ``[0, d]`` for positive steps, ``[0, d - 1]``
and ``[-1, d - 1]`` for negative ones). ``Split`` becomes one ``slice`` per output (sizes from the
``split`` input/attribute, else equal parts ``ceil(d / n)``, the last taking the rest).
ORT lowering: ONNX ``Slice`` on stored codes, in the program's layout.
"""

from __future__ import annotations

__all__ = ["SPEC", "compile_slice", "compile_split", "slice_indices", "reference", "lower_ort"]

import logging
from typing import Any

import numpy as np
import onnx

from zonnx.backend.compiler.params import const_ints, node_attrs
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.values import Codes, CompileError, constant_params
from zonnx.backend.runtime.ort_kernels import Storage
from zonnx.backend.runtime.ort_values import Val, require_program_layout

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)


def compile_slice(low: Any, node: onnx.NodeProto, x: Codes, ins: list[Any]) -> None:
    """Emit the ``slice`` of a Slice with constant starts, ends, axes and steps."""
    consts = constant_params(node, x, ins)
    starts, ends = const_ints(consts[1]), const_ints(consts[2])
    if starts is None or ends is None:
        raise CompileError(f"node {node.name!r}: Slice needs constant starts and ends.")
    axes = const_ints(consts[3]) if len(consts) > 3 else None
    steps = const_ints(consts[4]) if len(consts) > 4 else None
    attrs = {"starts": starts, "ends": ends, "axes": axes, "steps": steps}
    out = node.output[0]
    low.add_tensor(out, x.qp)
    low.emit("slice", node.name, [x.tensor], [out], attrs, {}, [node.name])
    low.val[out] = Codes(out, x.qp)


def compile_split(low: Any, node: onnx.NodeProto, x: Codes, ins: list[Any]) -> None:
    """Emit one ``slice`` per output of a Split."""
    consts, a = constant_params(node, x, ins), node_attrs(node)
    axis = int(a.get("axis", 0))
    sizes = const_ints(consts[1]) if len(consts) > 1 else const_ints(a.get("split"))
    outs = list(node.output)
    if sizes is None:
        shape = low.shapes.get(node.input[0])
        dim = shape[axis] if shape is not None and -len(shape) <= axis < len(shape) else None
        if not isinstance(dim, int) or dim <= 0:
            raise CompileError(f"node {node.name!r}: Split into equal parts needs a known input shape.")
        n = len(outs)
        part = -(-dim // n)  # ONNX: ceil(d / n), the last part takes the rest
        sizes = [min(part, dim - i * part) for i in range(n)]
    if len(sizes) != len(outs):
        raise CompileError(f"node {node.name!r}: {len(sizes)} split sizes for {len(outs)} outputs.")
    start = 0
    for out, size in zip(outs, sizes, strict=True):
        if out:
            attrs = {"starts": [start], "ends": [start + size], "axes": [axis], "steps": [1]}
            low.add_tensor(out, x.qp)
            low.emit("slice", f"{node.name}/{out}", [x.tensor], [out], attrs, {}, [node.name])
            low.val[out] = Codes(out, x.qp)
        start += size


def slice_indices(dim: int, start: int, end: int, step: int) -> np.ndarray:
    """The indices ONNX Slice takes along an axis of size ``dim``."""
    if step == 0:
        raise ValueError("slice step 0")
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return np.arange(start, end, step, dtype=np.int64)


def reference(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``np.take`` of ``slice_indices`` axis by axis."""
    x, a = args[0], op.attrs
    axes = a["axes"] if a["axes"] is not None else list(range(len(a["starts"])))
    steps = a["steps"] if a["steps"] is not None else [1] * len(axes)
    for axis, s, e, st in zip(axes, a["starts"], a["ends"], steps, strict=True):
        ax = axis % x.ndim
        x = np.take(x, slice_indices(x.shape[ax], s, e, st), axis=ax)
    return x


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """ONNX Slice with the op's constant starts, ends, axes and steps."""
    require_program_layout(args, op)
    a = op.attrs
    ins = [
        args[0].name,
        low.b.const(a["starts"], np.int64, "starts"),
        low.b.const(a["ends"], np.int64, "ends"),
    ]
    if a["axes"] is not None or a["steps"] is not None:
        axes = a["axes"] if a["axes"] is not None else list(range(len(a["starts"])))
        ins.append(low.b.const(axes, np.int64, "axes"))
    if a["steps"] is not None:
        ins.append(low.b.const(a["steps"], np.int64, "steps"))
    return low.b.op("Slice", ins)


SPEC = OpSpec(
    module=__name__,
    kinds=(Kind("slice", reference, lower_ort),),
    rules=(
        Rule(frozenset({"Slice"}), "code", compile_slice),
        Rule(frozenset({"Split"}), "code", compile_split),
    ),
    const_inputs={"Slice": (1, 2, 3, 4), "Split": (1,)},
)
