"""Integer lowering of Slice, Split, Gather and Pad: they select or repeat codes, so they run on codes.

Each output code is one input code (or, for Pad's constant mode, the pad value's code), so the integer
op is exact: ``q_y[i] = q_x[index(i)]`` on the input's grid; a following quantizer with another grid
adds a ``rescale`` as for the other code ops. Index rules are ONNX's, with every parameter a constant:

- ``slice``: per axis ``a`` the indices ``range(start_a, end_a, step_a)`` after ONNX's clamping
  (negative starts/ends count from the end; starts clamp to ``[0, d]`` and ends to ``[0, d]`` for
  positive steps, ``[0, d - 1]`` and ``[-1, d - 1]`` for negative ones).
- ``Split`` becomes one ``slice`` per output (sizes from the ``split`` input/attribute, else equal parts).
- ``gather``: ``np.take(q_x, indices, axis)`` with constant indices (negative ones count from the end).
- ``pad``: modes constant (the pad value ``v`` becomes ``Q_x(v)``, the code the model's next quantizer
  gives it on the same grid), edge and reflect (copies of codes); pads must not be negative.

Public API: ``CODE_OPS``, ``code_op``.
"""

from __future__ import annotations

__all__ = ["CODE_OPS", "code_op"]

import logging
from typing import Any

import numpy as np
import onnx

from . import params as om

logger = logging.getLogger(__name__)

CODE_OPS = frozenset({"Slice", "Split", "Gather", "Pad"})


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _ints(v: Any) -> list[int] | None:
    return None if v is None or np.size(v) == 0 else [int(x) for x in np.asarray(v).reshape(-1)]


def code_op(low: Any, node: onnx.NodeProto, x: Any, ins: list[Any]) -> None:
    """Emit the code op(s) of ``node`` reading codes ``x``; ``ins`` are the lowering's input values."""
    from .lower import CompileError, _Codes

    consts = [None if v is None or isinstance(v, _Codes) else np.asarray(v.value) for v in ins]
    if any(isinstance(v, _Codes) for v in ins[1:]):
        raise CompileError(f"node {node.name!r} ({node.op_type}): its parameters must be constants.")
    if x.qp.axis is not None:
        raise CompileError(f"node {node.name!r}: per-channel activations cannot go through {node.op_type}.")
    a = _attrs(node)
    if node.op_type == "Split":
        _split(low, node, x, consts, a, CompileError, _Codes)
        return
    if node.op_type == "Slice":
        starts, ends = _ints(consts[1]), _ints(consts[2])
        if starts is None or ends is None:
            raise CompileError(f"node {node.name!r}: Slice needs constant starts and ends.")
        axes = _ints(consts[3]) if len(consts) > 3 else None
        steps = _ints(consts[4]) if len(consts) > 4 else None
        kind, attrs = "slice", {"starts": starts, "ends": ends, "axes": axes, "steps": steps}
    elif node.op_type == "Gather":
        if consts[1] is None:
            raise CompileError(f"node {node.name!r}: Gather needs constant indices.")
        idx = np.asarray(consts[1], np.int64)
        kind, attrs = "gather", {"axis": int(a.get("axis", 0)), "indices": idx.tolist()}
    else:  # Pad
        mode = a.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        pads = _ints(consts[1]) if len(consts) > 1 else _ints(a.get("pads"))
        if pads is None or min(pads) < 0:
            raise CompileError(f"node {node.name!r}: Pad needs constant, non-negative pads (got {pads}).")
        if mode not in ("constant", "edge", "reflect"):
            raise CompileError(f"node {node.name!r}: pad mode {mode!r} is not supported.")
        value = a.get("value", 0.0)
        if len(ins) > 2 and ins[2] is not None:  # the pad value, dequantized when it is a quantized constant
            v = ins[2]
            value = (
                np.asarray(v.value, np.float64)
                if v.qp is None
                else v.qp.scale * (np.asarray(v.value) - v.qp.zp)
            )
        code = int(om.quantize_float(np.asarray(value, np.float64).reshape(()), x.qp))
        axes = _ints(consts[3]) if len(consts) > 3 else None
        kind, attrs = "pad", {"pads": pads, "axes": axes, "mode": mode, "value": code}
    out = node.output[0]
    low.add_tensor(out, x.qp)
    low.emit(kind, node.name, [x.tensor], [out], attrs, {}, [node.name])
    low.val[out] = _Codes(out, x.qp)


def _split(low: Any, node: onnx.NodeProto, x: Any, consts: list, a: dict, err: type, codes: type) -> None:
    axis = int(a.get("axis", 0))
    sizes = _ints(consts[1]) if len(consts) > 1 else _ints(a.get("split"))
    outs = list(node.output)
    if sizes is None:
        shape = low.shapes.get(node.input[0])
        dim = shape[axis] if shape is not None and -len(shape) <= axis < len(shape) else None
        if not isinstance(dim, int) or dim <= 0:
            raise err(f"node {node.name!r}: Split into equal parts needs a known input shape.")
        n = len(outs)
        part = -(-dim // n)  # ONNX: ceil(d / n), the last part takes the rest
        sizes = [min(part, dim - i * part) for i in range(n)]
    if len(sizes) != len(outs):
        raise err(f"node {node.name!r}: {len(sizes)} split sizes for {len(outs)} outputs.")
    start = 0
    for out, size in zip(outs, sizes, strict=True):
        if out:
            attrs = {"starts": [start], "ends": [start + size], "axes": [axis], "steps": [1]}
            low.add_tensor(out, x.qp)
            low.emit("slice", f"{node.name}/{out}", [x.tensor], [out], attrs, {}, [node.name])
            low.val[out] = codes(out, x.qp)
        start += size
