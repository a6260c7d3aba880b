"""Propagate partly known integer shape vectors through the ops that compute shapes."""

from __future__ import annotations

__all__ = ["Partial", "shape_partial"]

import dataclasses
import math

import numpy as np
import onnx_ir as ir

from zonnx.passes.common.static_info import StaticInfo, constant_array

_INT_TYPES = frozenset({ir.DataType.INT64, ir.DataType.INT32, ir.DataType.INT16, ir.DataType.INT8})


@dataclasses.dataclass(frozen=True)
class Partial:
    """A 1-D (or scalar) integer shape vector whose entries may be unknown (None)."""

    values: tuple[int | None, ...]
    dtype: np.dtype
    scalar: bool = False

    def known(self) -> np.ndarray | None:
        if any(v is None for v in self.values):
            return None
        arr = np.array(self.values, dtype=self.dtype)
        return arr.reshape(()) if self.scalar else arr


def _attr(node: ir.Node, name: str, default=None):
    attr = node.attributes.get(name)
    return default if attr is None or attr.is_ref() else attr.value


def _slice_indices(n: int, start: int, end: int, step: int) -> list[int]:
    """ONNX Slice index semantics on one axis of length n (negatives wrap, then clamp)."""
    start, end = (start + n if start < 0 else start), (end + n if end < 0 else end)
    if step > 0:
        return list(range(min(max(start, 0), n), min(max(end, 0), n), step))
    return list(range(min(max(start, 0), n - 1), min(max(end, -1), n - 1), step))


def _as_partial(value: ir.Value | None, partials: dict[ir.Value, Partial]) -> Partial | None:
    if value in partials:
        return partials[value]
    arr = constant_array(value)
    if arr is None or arr.dtype.kind not in "iu" or arr.ndim > 1:
        return None
    return Partial(tuple(int(v) for v in arr.ravel()), arr.dtype, arr.ndim == 0)


def shape_partial(node: ir.Node, info: StaticInfo, partials: dict[ir.Value, Partial]) -> Partial | None:
    """Propagate known shape entries through Shape, Size, Cast, Gather, Slice, Concat, (Un)Squeeze."""
    op, ins = node.op_type, node.inputs
    if op == "Shape":
        dims = info.dims(ins[0])
        if dims is None:
            return None
        part = dims[slice(_attr(node, "start", 0), _attr(node, "end"))]
        return Partial(tuple(d if isinstance(d, int) else None for d in part), np.dtype(np.int64))
    if op == "Size":
        shape = info.shape(ins[0])
        return None if shape is None else Partial((math.prod(shape),), np.dtype(np.int64), True)
    src = partials.get(ins[0]) if ins and ins[0] is not None else None
    if op == "Concat":
        parts = [_as_partial(v, partials) for v in ins]
        if not any(v in partials for v in ins) or any(p is None or p.scalar for p in parts):
            return None
        return Partial(sum((p.values for p in parts), ()), parts[0].dtype)  # type: ignore[union-attr]
    if src is None:
        return None
    if op == "Identity":
        return src
    if op == "Cast":
        to = ir.DataType(_attr(node, "to"))
        return dataclasses.replace(src, dtype=to.numpy()) if to in _INT_TYPES else None
    if op == "Gather" and not src.scalar and _attr(node, "axis", 0) in (0, -1):
        idx = constant_array(ins[1])
        if idx is None or idx.ndim > 1:
            return None
        n = len(src.values)
        picked = tuple(src.values[int(i) + n if i < 0 else int(i)] for i in idx.ravel() if -n <= i < n)
        return Partial(picked, src.dtype, idx.ndim == 0) if len(picked) == idx.size else None
    if op == "Slice" and not src.scalar:
        if len(ins) > 1:
            args = [None if v is None else constant_array(v) for v in ins[1:5]]
            if len(args) < 2 or any(v is not None and a is None for v, a in zip(ins[1:5], args, strict=True)):
                return None
            starts, ends = args[0].tolist(), args[1].tolist()  # type: ignore[union-attr]
            axes = args[2].tolist() if len(args) > 2 and args[2] is not None else [0]
            steps = args[3].tolist() if len(args) > 3 and args[3] is not None else [1]
        else:
            starts, ends = _attr(node, "starts"), _attr(node, "ends")
            axes, steps = _attr(node, "axes", [0]), [1]
        if len(starts) != 1 or axes not in ([0], [-1]) or steps[0] == 0:
            return None
        idx = _slice_indices(len(src.values), int(starts[0]), int(ends[0]), int(steps[0]))
        return Partial(tuple(src.values[i] for i in idx), src.dtype)
    if op == "Unsqueeze" and src.scalar:
        axes = constant_array(ins[1]) if len(ins) > 1 else np.array(_attr(node, "axes", []))
        return Partial(src.values, src.dtype) if axes is not None and axes.tolist() in ([0], [-1]) else None
    if op == "Squeeze" and not src.scalar and len(src.values) == 1:
        return Partial(src.values, src.dtype, True)
    return None
