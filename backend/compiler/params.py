"""Shared integer parameters of the NPU ops: tensor grids, quantization of floats, multipliers and shifts.

The formulas that use them are stated in each op module (``zonnx.backend.ops``); every real-valued
quantity is computed in float64 from the model's float32 scales (exact for power-of-two scales), every
integer in int64.
"""

from __future__ import annotations

__all__ = [
    "QParams",
    "quantize_float",
    "multipliers",
    "broadcast_channels",
    "node_attrs",
    "clamp_bounds",
    "const_ints",
    "narrow_ints",
]

import dataclasses
import logging
from typing import Any

import numpy as np
import onnx

from zonnx.backend.targets import Target
from zonnx.custom_ops import grid
from zonnx.errors import OptionError

from .program import TensorInfo
from .requant import pof2_exponent, quantize_multiplier
from .values import CompileError

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class QParams:
    """A tensor's grid: ``real = scale * (q - zp)`` (per-channel along ``axis``), codes in [qmin, qmax]."""

    scale: np.ndarray  # float64, shape () or (C,)
    zp: np.ndarray  # int64, same shape
    axis: int | None
    qmin: int
    qmax: int
    dtype: str
    round_mode: str  # rounding of the quantizer that writes this grid
    pos: int | None = None  # scale == 2^-pos (power-of-two grids)

    @classmethod
    def from_qdq(cls, scale: np.ndarray, zp: np.ndarray, axis: int) -> QParams:
        s = np.asarray(scale, dtype=np.float64)
        z = np.asarray(zp)
        info = np.iinfo(z.dtype)
        exps = {pof2_exponent(v) for v in s.reshape(-1)}
        pos = -next(iter(exps)) if len(exps) == 1 and None not in exps and s.ndim == 0 else None
        return cls(
            s,
            z.astype(np.int64),
            axis if s.ndim else None,
            int(info.min),
            int(info.max),
            str(z.dtype),
            "half_even",
            pos,
        )

    @classmethod
    def from_pos(cls, pos: int, bits: int, signed: int, narrow: int, round_mode: str) -> QParams:
        qmin, qmax = grid.qrange(bits, signed, narrow)
        dtype = np.dtype(grid.STORAGE_TYPES[grid.default_storage(bits, signed)]).name
        mode = grid.canonical_round_mode(round_mode) or "half_even"
        return cls(np.array(2.0**-pos), np.zeros((), np.int64), None, qmin, qmax, dtype, mode, pos)

    def same(self, other: QParams) -> bool:
        return (
            self.scale.shape == other.scale.shape
            and bool(np.all(self.scale == other.scale))
            and bool(np.all(self.zp == other.zp))
            and (self.qmin, self.qmax) == (other.qmin, other.qmax)
        )

    def per_tensor(self, what: str) -> tuple[float, int]:
        if self.scale.size != 1:
            raise CompileError(f"{what}: needs a per-tensor quantized activation.")
        return float(self.scale.reshape(-1)[0]), int(self.zp.reshape(-1)[0])

    def info(self, name: str, shape: list | None) -> TensorInfo:
        return TensorInfo(
            name,
            self.dtype,
            self.qmin,
            self.qmax,
            [float(v) for v in self.scale.reshape(-1)],
            [int(v) for v in self.zp.reshape(-1)],
            self.axis,
            shape,
        )


def broadcast_channels(a: np.ndarray, ndim: int, axis: int | None) -> np.ndarray:
    """A per-tensor value as a scalar, a per-channel one shaped to broadcast along ``axis`` of ``ndim`` dims."""
    if a.ndim == 0 or axis is None:
        return a.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return a.reshape(shape)


def quantize_float(x: np.ndarray, qp: QParams) -> np.ndarray:
    """Codes of float values as the model's quantizer computes them (FixNeuron grid or QuantizeLinear)."""
    x = np.asarray(x, dtype=np.float64)
    if qp.pos is not None and qp.zp.ndim == 0 and int(qp.zp) == 0:
        bits = int(np.log2(qp.qmax - qp.qmin + 1))
        codes = grid.code_reference(
            x,
            bit_width=bits,
            pos=qp.pos,
            signed=int(qp.qmin < 0),
            narrow=int(qp.qmin == -qp.qmax),
            round_mode=qp.round_mode,
        )
        return codes.astype(np.int64)
    s = broadcast_channels(qp.scale, x.ndim, qp.axis).astype(np.float32)
    v = (x.astype(np.float32) / s).astype(np.float64)
    q = grid.round_reference(v, qp.round_mode) + broadcast_channels(qp.zp, x.ndim, qp.axis)
    return np.clip(q, qp.qmin, qp.qmax).astype(np.int64)


def multipliers(
    ratios: np.ndarray, target: Target, where: str, *, eltwise: bool = False, common_shift: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Integer (M, shift) per ratio with ``M / 2^shift ~= ratio`` as the target requantizes.

    ``common_shift``: one shift for all ratios (Add). Power-of-two targets need exact powers of two.
    """
    r = np.atleast_1d(np.asarray(ratios, dtype=np.float64))
    rq = target.quant.requant
    if rq.mode == "shift":
        exps = [pof2_exponent(v) for v in r]
        if None in exps:
            raise CompileError(
                f"node {where!r}: target {target.name} requantizes with shifts only and needs power-of-two "
                f"scales, but a scale ratio is {r[[e is None for e in exps]][0]!r}; quantize with power-of-two scales (FixNeuron)."
            )
        ks = np.array(exps, dtype=np.int64)
        if common_shift:
            s = max(0, int(-ks.min()))
            return (np.left_shift(1, ks + s)).astype(np.int64), np.array([s], np.int64)
        return np.left_shift(1, np.maximum(ks, 0)).astype(np.int64), np.maximum(-ks, 0).astype(np.int64)
    rng = tuple(rq.shift) if rq.shift is not None else None
    try:
        if common_shift:
            _, s = quantize_multiplier(float(r.max()), rq.multiplier_bits, rng)
            m = np.array([round(v * 2.0**s) for v in r], dtype=np.int64)
            return m, np.array([s], np.int64)
        pairs = [quantize_multiplier(float(v), rq.multiplier_bits, rng) for v in r]
    except OptionError as e:  # the ratio's words, with the node that needs it and what to change
        raise CompileError(
            f"node {where!r} on {target.name}: {e} Its input and output scales are too far apart for the "
            "target's multiplier: quantize it with other ranges, or keep this node off the NPU."
        ) from None
    if not eltwise and not rq.per_channel and len(set(pairs)) > 1:
        raise CompileError(
            f"node {where!r}: target {target.name} has no per-channel multipliers; quantize weights per tensor."
        )
    return np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64)


def node_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """The attributes of ``node`` as Python values."""
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def const_ints(v: Any) -> list[int] | None:
    """A constant operand as a list of ints (None when absent or empty)."""
    return None if v is None or np.size(v) == 0 else [int(x) for x in np.asarray(v).reshape(-1)]


def clamp_bounds(acts: list[tuple[str, float, float]], qp: QParams) -> tuple[int, int]:
    """``[lo, hi]`` on grid ``qp`` of fused clamps ``(a, b)``: ``Q(a)``/``Q(b)`` (exact: Q is monotone)."""
    lo, hi = qp.qmin, qp.qmax
    for _, a, b in acts:
        if np.isfinite(a):
            lo = max(lo, int(quantize_float(np.array(a), qp)))
        if np.isfinite(b):
            hi = min(hi, int(quantize_float(np.array(b), qp)))
    return lo, hi


def narrow_ints(a: np.ndarray) -> np.ndarray:
    """An integer array in the narrowest of int16 / int32 / int64 that holds it."""
    a = np.asarray(a, np.int64)
    for dt in (np.int16, np.int32):
        if a.size == 0 or (a.min() >= np.iinfo(dt).min and a.max() <= np.iinfo(dt).max):
            return a.astype(dt)
    return a
