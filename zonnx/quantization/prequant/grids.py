"""A source model's quantization grid for one tensor, and the float range it spans.

A grid is (scale s, zero point z, code type [qmin, qmax]); it represents the reals
``(q - z) * s`` for ``q`` in ``[qmin, qmax]``, i.e. the range ``[(qmin - z) s, (qmax - z) s]``. A
per-channel grid (weights) holds one (s, z) per channel along ``axis``. Grids are compared by step
(``s``) and range: keeping a source range on a target grid of the same bit width keeps its step
when the target allows the source's zero point; a symmetric target holding an asymmetric range
``[lo, hi]`` needs ``max(|lo|, |hi|)`` on both sides, i.e. a step up to about twice as large.
"""

from __future__ import annotations

__all__ = ["Grid", "ONNX_CODE_TYPES", "grid_from_arrays"]

import dataclasses

import numpy as np
import onnx

#: ONNX element type -> (name, bits, signed) of the code types a source grid may use.
ONNX_CODE_TYPES: dict[int, tuple[str, int, bool]] = {
    onnx.TensorProto.INT8: ("int8", 8, True),
    onnx.TensorProto.UINT8: ("uint8", 8, False),
    onnx.TensorProto.INT16: ("int16", 16, True),
    onnx.TensorProto.UINT16: ("uint16", 16, False),
    onnx.TensorProto.INT4: ("int4", 4, True),
    onnx.TensorProto.UINT4: ("uint4", 4, False),
    onnx.TensorProto.INT32: ("int32", 32, True),
}


@dataclasses.dataclass(frozen=True)
class Grid:
    """One tensor's grid in the source model: scale(s), zero point(s), code type, per-channel axis."""

    scale: np.ndarray
    zero_point: np.ndarray
    dtype: str
    bits: int
    signed: bool
    axis: int | None = None

    @property
    def qrange(self) -> tuple[int, int]:
        if self.signed:
            return -(2 ** (self.bits - 1)), 2 ** (self.bits - 1) - 1
        return 0, 2**self.bits - 1

    @property
    def per_channel(self) -> bool:
        return self.axis is not None and self.scale.size > 1

    def real_range(self) -> tuple[float, float]:
        """[(qmin - z) s, (qmax - z) s] of a per-tensor grid (the union over channels otherwise)."""
        qmin, qmax = self.qrange
        s = self.scale.astype(np.float64).reshape(-1)
        z = self.zero_point.astype(np.float64).reshape(-1)
        return float(((qmin - z) * s).min()), float(((qmax - z) * s).max())

    def describe(self) -> str:
        """Short text: ``uint8 s=0.0123 z=111`` or ``int8 per-channel(64) s=[a, b] z=0``."""
        s = self.scale.reshape(-1)
        z = self.zero_point.reshape(-1)
        zs = f"z={int(z[0])}" if np.all(z == z[0]) else f"z=[{int(z.min())}, {int(z.max())}]"
        if s.size == 1:
            return f"{self.dtype} s={float(s[0]):.4g} {zs}"
        return f"{self.dtype} per-channel({s.size}) s=[{float(s.min()):.3g}, {float(s.max()):.3g}] {zs}"


def grid_from_arrays(
    scale: np.ndarray, zero_point: np.ndarray | None, elem_type: int, axis: int | None
) -> Grid | None:
    """A Grid from a quantizer's constant parameters; None for a code type grids do not cover."""
    kind = ONNX_CODE_TYPES.get(elem_type)
    if kind is None:
        return None
    name, bits, signed = kind
    zp = (
        np.zeros_like(scale, dtype=np.int64) if zero_point is None else np.asarray(zero_point, dtype=np.int64)
    )
    return Grid(
        np.asarray(scale, dtype=np.float32), zp, name, bits, signed, axis if np.size(scale) > 1 else None
    )
