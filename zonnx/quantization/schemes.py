"""Scale math: from a float range (or a weight tensor) to scale, zero point and power-of-two position.

Conventions (ORT's, which QDQ consumers expect; the Compass and TPU-MLIR documents agree on them):

- asymmetric: the range is widened to include 0; ``scale = (rmax - rmin) / (qmax - qmin)``,
  ``zero_point = round(qmin - rmin / scale)`` clipped to [qmin, qmax].
- symmetric, signed: ``scale = 2 * max(|rmin|, |rmax|) / (qmax - qmin)``, ``zero_point = 0``. With the
  full int8 range that is ``absmax / 127.5`` (Compass "full range"); with the restricted range
  [-127, 127] it is ``absmax / 127`` (Compass "restricted range", TPU-MLIR weights).
- symmetric, unsigned: zero point at the middle, ``(qmin + qmax + 1) // 2`` (ORT's rule).
- power of two (vai_q_onnx): ``scale = 2^-pos``, zero point 0; ``pos = rint(-log2(float scale))``
  when derived from a range, clamped to [-128, 127]. A scale of 0 (all-zero tensor) gives pos 127.
- bias: int32, ``scale = s_input * s_weight`` (per channel when the weight is), zero point 0.
- a zero range gives scale 1 and zero point 0 (quantizes every value to the zero point), as in ORT.
- MinimumRealRange (ORT): after widening to hold 0, ``rmax = max(rmax, rmin + minimum)``.
- ``reduce_range`` (ORT): 8-bit grids [-64, 64] (signed) and [0, 127] (unsigned); 16-bit and 4-bit
  alike (``_REDUCED_RANGES``); the reduced grid sets the scale and zero point, while codes saturate at
  the type's own ends, so a value that rounds one step past the grid keeps it (ORT's rule).
- float8 E4M3FN (ORT's ``QFLOAT8E4M3FN``): zero point 0.0, ``scale = std / std_f8`` where ``std`` is
  the spread of the tensor (``calibration.methods.distribution_std``; a weight's ``np.std``) and
  ``std_f8`` that of every finite E4M3FN value (ORT's rule: both spreads are matched); codes are
  ``x / scale`` rounded to the nearest E4M3FN value (half to even), saturated at +-448. A tensor with a
  range but no spread (a fixed range) maps ``max |x|`` onto 448.
- ActivationRestrictedAsymmetric (ORT, uint8 activations): zero point qmin when rmin >= 0, else the
  middle code m = (qmin + qmax + 1) // 2 with ``scale = max(-rmin / (m - qmin), rmax / (qmax - m))``.
"""

from __future__ import annotations

__all__ = [
    "QDType",
    "QuantSpec",
    "QuantParams",
    "qdtype",
    "params_from_range",
    "float8_params",
    "FLOAT8_MAX",
    "weight_params",
    "bias_params",
    "fit_weight_to_bias",
    "pof2_params",
    "pos_from_scale",
    "quantize",
    "dequantize",
]

import dataclasses

import ml_dtypes
import numpy as np
import onnx

from zonnx.errors import OptionError


@dataclasses.dataclass(frozen=True)
class QDType:
    """An integer storage type: name, bit width and signedness."""

    name: str
    bits: int
    signed: bool

    @property
    def is_float(self) -> bool:
        """A float8 type: codes are float values, the zero point is 0.0."""
        return self.name.startswith("float8")

    def qrange(self, restricted: bool = False) -> tuple[int, int]:
        """[qmin, qmax]; restricted (narrow) signed ranges drop the most negative code; float8: +-448."""
        if self.is_float:
            return -FLOAT8_MAX, FLOAT8_MAX
        if self.signed:
            lo, hi = -(2 ** (self.bits - 1)), 2 ** (self.bits - 1) - 1
            return (lo + 1 if restricted else lo), hi
        return 0, 2**self.bits - 1

    @property
    def onnx_type(self) -> int:
        return {
            "int8": onnx.TensorProto.INT8,
            "uint8": onnx.TensorProto.UINT8,
            "int16": onnx.TensorProto.INT16,
            "uint16": onnx.TensorProto.UINT16,
            "int4": onnx.TensorProto.INT4,
            "uint4": onnx.TensorProto.UINT4,
            "int32": onnx.TensorProto.INT32,
            "float8e4m3fn": onnx.TensorProto.FLOAT8E4M3FN,
        }[self.name]

    @property
    def np_dtype(self) -> np.dtype:
        """numpy dtype used to hold codes (int4 codes are held in int8, uint4 in uint8)."""
        if self.is_float:
            return np.dtype(ml_dtypes.float8_e4m3fn)
        return np.dtype({"int4": "int8", "uint4": "uint8"}.get(self.name, self.name))

    @property
    def min_opset(self) -> int:
        """First default-domain opset whose QuantizeLinear accepts this type."""
        if self.is_float:
            return 19
        return 21 if self.bits in (4, 16) else 13 if self.name == "int32" else 10


_QDTYPES = {
    t.name: t
    for t in [
        QDType("int8", 8, True),
        QDType("uint8", 8, False),
        QDType("int16", 16, True),
        QDType("uint16", 16, False),
        QDType("int4", 4, True),
        QDType("uint4", 4, False),
        QDType("int32", 32, True),
        QDType("float8e4m3fn", 8, True),
    ]
}


#: ORT's ``reduce_range`` grids: one bit less of magnitude, and for signed 8/16-bit both ends reachable.
_REDUCED_RANGES = {
    "int8": (-64, 64),
    "uint8": (0, 127),
    "int16": (-16384, 16384),
    "uint16": (0, 32767),
    "int4": (-4, 3),
    "uint4": (0, 7),
}


def qdtype(name: str) -> QDType:
    if name not in _QDTYPES:
        raise OptionError(f"unknown quantized type {name!r}; use one of {', '.join(_QDTYPES)}.")
    return _QDTYPES[name]


@dataclasses.dataclass(frozen=True)
class QuantSpec:
    """How to quantize one tensor (activation or weight).

    Attributes:
        dtype: storage type (default int8).
        symmetric: zero point 0 (or mid-range for unsigned) (default False).
        restricted: drop the most negative code, e.g. [-127, 127] (default False).
        axis: per-channel axis, None for per-tensor (default None).
        power_of_two: scale is 2^-pos (default False).
        reduce_range: ORT's 7-bit weights option (default False).
    """

    dtype: QDType = _QDTYPES["int8"]
    symmetric: bool = False
    restricted: bool = False
    axis: int | None = None
    power_of_two: bool = False
    reduce_range: bool = False
    snap_zero_point: bool = False  # ORT's ActivationRestrictedAsymmetric (asymmetric uint8 only)
    min_real_range: float | None = None  # ORT's MinimumRealRange: rmax >= rmin + this (after holding 0)

    def qrange(self) -> tuple[int, int]:
        if self.reduce_range and self.dtype.name in _REDUCED_RANGES:
            return _REDUCED_RANGES[self.dtype.name]
        return self.dtype.qrange(self.restricted)


@dataclasses.dataclass
class QuantParams:
    """Scale and zero point (scalars or per-channel arrays) plus the power-of-two position if any."""

    scale: np.ndarray  # float32, shape () or (C,)
    zero_point: np.ndarray  # spec.dtype codes, same shape as scale
    dtype: QDType
    axis: int | None = None
    pos: np.ndarray | None = None  # int, same shape as scale, when the scale is 2^-pos
    qmin: int = -128
    qmax: int = 127
    block_size: int = 0  # > 0: one scale per block of this many values along ``axis`` (blocked.py)

    @property
    def per_channel(self) -> bool:
        return self.axis is not None


def pos_from_scale(scale: np.ndarray | float) -> np.ndarray:
    """pos = rint(-log2(scale)) clamped to [-128, 127]; a zero scale gives 127."""
    s = np.asarray(scale, dtype=np.float64)
    with np.errstate(divide="ignore"):
        pos = np.where(s > 0, np.rint(-np.log2(np.where(s > 0, s, 1.0))), 127)
    return np.clip(pos, -128, 127).astype(np.int32)


def pof2_params(pos: np.ndarray | int, spec: QuantSpec, axis: int | None = None) -> QuantParams:
    """Symmetric power-of-two parameters for a given position."""
    pos = np.asarray(pos, dtype=np.int32)
    qmin, qmax = spec.qrange()
    zp = np.zeros(pos.shape, dtype=spec.dtype.np_dtype)
    if not spec.dtype.signed:
        zp[...] = 0
    return QuantParams(
        np.ldexp(np.float32(1), -pos).astype(np.float32), zp, spec.dtype, axis, pos, qmin, qmax
    )


def params_from_range(
    rmin: np.ndarray | float, rmax: np.ndarray | float, spec: QuantSpec, axis: int | None = None
) -> QuantParams:
    """Scale and zero point for the range [rmin, rmax] (arrays for per-channel), per the module rules."""
    rmin = np.minimum(np.asarray(rmin, dtype=np.float64), 0.0)
    rmax = np.maximum(np.asarray(rmax, dtype=np.float64), 0.0)
    if spec.dtype.is_float:  # a range without a spread: max |x| onto the largest float8 value
        absmax = np.maximum(np.abs(rmin), np.abs(rmax))
        scale = np.where(absmax > 0, absmax / FLOAT8_MAX, 1.0).astype(np.float32)
        zp = np.zeros(scale.shape, dtype=spec.dtype.np_dtype)
        return QuantParams(scale, zp, spec.dtype, axis, None, -FLOAT8_MAX, FLOAT8_MAX)
    if spec.min_real_range is not None:
        rmax = np.maximum(rmax, rmin + spec.min_real_range)
    qmin, qmax = spec.qrange()
    if spec.snap_zero_point and not spec.symmetric and spec.dtype.name == "uint8" and rmin.ndim == 0:
        return _snapped_params(float(rmin), float(rmax), spec, qmin, qmax)
    if spec.symmetric:
        absmax = np.maximum(np.abs(rmin), np.abs(rmax))
        rmin, rmax = -absmax, absmax
    scale = (rmax - rmin) / float(qmax - qmin)
    if spec.symmetric:
        zp = np.full(scale.shape, 0 if spec.dtype.signed else (qmin + qmax + 1) // 2, dtype=np.float64)
    else:
        safe = np.where(scale > 0, scale, 1.0)
        zp = np.clip(np.round(qmin - rmin / safe), qmin, qmax)
    zero = ~(scale > np.finfo(np.float32).tiny)
    scale = np.where(zero, 1.0, scale)
    zp = np.where(zero, 0 if spec.symmetric and spec.dtype.signed else zp, zp)
    if spec.power_of_two:
        pos = pos_from_scale(np.where(zero, 0.0, scale))
        return pof2_params(pos, spec, axis)
    if spec.reduce_range:  # ORT: the reduced grid sets the scale, codes saturate at the type's own ends
        qmin, qmax = spec.dtype.qrange()
    return QuantParams(
        scale.astype(np.float32), zp.astype(spec.dtype.np_dtype), spec.dtype, axis, None, qmin, qmax
    )


#: Largest finite float8 E4M3FN value; codes saturate there (QuantizeLinear's saturate=1).
FLOAT8_MAX = 448


def _float8_spread() -> float:
    """Standard deviation of every finite float8 E4M3FN value (ORT's reference spread)."""
    values = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return float(np.std(values[np.isfinite(values)]))


def float8_params(std: float, spec: QuantSpec) -> QuantParams:
    """float8 parameters from a tensor's spread: ``scale = std / std_f8``, zero point 0.0 (ORT's rule);
    a zero spread gives scale 1."""
    scale = float(std) / _float8_spread() if std > 0 else 1.0
    qmin, qmax = spec.dtype.qrange()
    zp = np.zeros((), dtype=spec.dtype.np_dtype)
    return QuantParams(np.asarray(scale, np.float32), zp, spec.dtype, None, None, qmin, qmax)


def _snapped_params(rmin: float, rmax: float, spec: QuantSpec, qmin: int, qmax: int) -> QuantParams:
    """ActivationRestrictedAsymmetric: zero point at qmin for a range with no negative part, else at
    the middle code; the scale is the smallest that still holds [rmin, rmax] from that zero point."""
    mid = (qmin + qmax + 1) // 2
    if rmax <= rmin:  # all zero
        zp, scale = qmin, 1.0 / (qmax - qmin)
    elif rmin >= 0.0:
        zp, scale = qmin, rmax / (qmax - qmin)
    else:
        zp, scale = mid, max(-rmin / (mid - qmin), rmax / (qmax - mid))
    return QuantParams(
        np.asarray(scale, np.float32), np.asarray(zp, spec.dtype.np_dtype), spec.dtype, None, None, qmin, qmax
    )


def weight_params(w: np.ndarray, spec: QuantSpec) -> QuantParams:
    """Parameters from the weight's own min/max, per tensor or per channel along ``spec.axis``."""
    w = np.asarray(w, dtype=np.float32)
    if spec.axis is None:
        return params_from_range(float(w.min(initial=0.0)), float(w.max(initial=0.0)), spec)
    axis = spec.axis % w.ndim
    reduce_axes = tuple(i for i in range(w.ndim) if i != axis)
    return params_from_range(
        w.min(axis=reduce_axes, initial=0.0), w.max(axis=reduce_axes, initial=0.0), spec, axis
    )


def bias_params(input_scale: np.ndarray, weight: QuantParams) -> QuantParams:
    """int32 bias at scale s_input * s_weight (per channel when the weight is), zero point 0."""
    scale = (np.asarray(input_scale, np.float64) * weight.scale.astype(np.float64)).astype(np.float32)
    int32 = _QDTYPES["int32"]
    lo, hi = int32.qrange()
    # a bias is 1-D: its channel axis is 0 whatever the weight's channel axis is (Gemm's B is [K, N])
    return QuantParams(scale, np.zeros(scale.shape, np.int32), int32, 0 if scale.ndim else None, None, lo, hi)


def fit_weight_to_bias(
    bias: np.ndarray, input_scale: np.ndarray, weight: QuantParams
) -> tuple[QuantParams, int]:
    """Raise the weight scale of every channel whose int32 bias code would overflow; returns the new
    parameters and the number of channels raised.

    A channel whose weights are (nearly) all zero has a tiny weight scale, so ``b / (s_x s_w)`` exceeds
    the int32 range and the bias saturates to a meaningless value (ORT adjusts the weight scale the same
    way unless ``QDQDisableWeightAdjustForInt32Bias``). Rule: ``s_w >= |b| / (s_x * (2^31 - 1))``, doubled
    for headroom; a raised scale only coarsens weights that are below one code of the old one anyway.
    """
    b = np.abs(np.asarray(bias, np.float64)).reshape(-1)
    s_w = np.asarray(weight.scale, np.float64)
    need = b / (float(np.asarray(input_scale, np.float64).reshape(-1)[0]) * (2.0**31 - 1)) * 2.0
    if s_w.ndim == 0:
        need_w = np.float64(need.max(initial=0.0))
        raised = int(need_w > s_w)
        new = np.maximum(s_w, need_w)
    else:
        raised = int(np.count_nonzero(need > s_w))
        new = np.maximum(s_w, need)
    if not raised:
        return weight, 0
    return dataclasses.replace(weight, scale=new.astype(np.float32)), raised


def _broadcast(p: np.ndarray, x: np.ndarray, axis: int | None) -> np.ndarray:
    if axis is None or p.ndim == 0:
        return p
    shape = [1] * x.ndim
    shape[axis % x.ndim] = -1
    return p.reshape(shape)


def _expand(p: np.ndarray, params: QuantParams, x: np.ndarray) -> np.ndarray:
    """Block-wise parameters repeated over their blocks (same rank as x), else the per-axis broadcast."""
    if params.block_size:
        axis = (params.axis or 0) % x.ndim
        return np.repeat(p, params.block_size, axis=axis).take(range(x.shape[axis]), axis=axis)
    return _broadcast(p, x, params.axis)


def quantize(x: np.ndarray, params: QuantParams) -> np.ndarray:
    """Codes as QuantizeLinear computes them: round half to even of x / scale, plus zero point, saturated."""
    scale = _expand(params.scale.astype(np.float32), params, np.asarray(x))
    if params.dtype.is_float:  # zero point 0.0; round to the nearest float8 value, saturate at +-448
        y = np.clip(np.asarray(x, np.float32) / scale, -FLOAT8_MAX, FLOAT8_MAX)
        return y.astype(params.dtype.np_dtype)
    zp = _expand(params.zero_point.astype(np.int64), params, np.asarray(x))
    q = np.rint(np.asarray(x, np.float32) / scale).astype(np.int64) + zp
    return np.clip(q, params.qmin, params.qmax).astype(params.dtype.np_dtype)


def dequantize(q: np.ndarray, params: QuantParams) -> np.ndarray:
    """(q - zero_point) * scale in float32."""
    scale = _expand(params.scale.astype(np.float32), params, q)
    if params.dtype.is_float:
        return (q.astype(np.float32) * scale).astype(np.float32)
    zp = _expand(params.zero_point.astype(np.int64), params, q)
    return ((q.astype(np.int64) - zp).astype(np.float32) * scale).astype(np.float32)
