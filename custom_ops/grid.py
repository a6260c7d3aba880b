"""The power-of-two fixed-point grid of the zonnx ops: ranges, storage types, rounding modes, numpy reference.

The reference is written independently of the ONNX function bodies: the scaled value is one float32
multiply (``v = fl32(x * 2^pos)``, as every fake-quantizer computes it), everything after that is
exact float64 arithmetic with numpy's own rounding functions. The function bodies reach the same
bits with float32 ONNX ops (see ``functions.py``); the tests compare the two bit for bit.

Rounding (``q = round_mode(clamp(v, qmin, qmax))``; clamping first or last gives the same code):

=============  ===================================  =============================
mode           rule                                 examples
=============  ===================================  =============================
half_even      nearest, ties to even (np.rint)      0.5->0, 1.5->2, 2.5->2, -2.5->-2
half_up        floor(v + 0.5) (DPU activations)     0.5->1, -0.5->0, -1.5->-1
half_away      nearest, ties away (C round)         2.5->3, -2.5->-3, -1.5->-2
floor          floor(v)                             -0.5->-1, 0.7->0
trunc          toward zero (C trunc)                -1.7->-1, 1.7->1
=============  ===================================  =============================

Signed zero: a zero code carries the sign of ``v`` (as IEEE roundToIntegral and C's rint, round, trunc
and floor do, and as the clamp does: an unsigned grid clamps at ``qmin = -0.0``), so the output of
FixNeuron always has the sign bit of its input: -0.3 * 2^-pos, -0.0 and, on an unsigned grid, every
negative x give -0.0; +0.0 and 0.3 * 2^-pos give +0.0. Integer codes have no signed zero.
NaN: clamping and rounding keep NaN, so FixNeuron gives NaN; the integer code of a NaN is not defined
by ONNX's Cast (ORT on x86 gives 0 for 8- and 16-bit storage and -2^31 for int32); the reference gives 0.
"""

from __future__ import annotations

__all__ = [
    "ROUND_MODES",
    "ROUND_MODE_ALIASES",
    "MIN_BIT_WIDTH",
    "MAX_BIT_WIDTH",
    "MIN_POS",
    "MAX_POS",
    "STORAGE_TYPES",
    "canonical_round_mode",
    "qrange",
    "default_storage",
    "storage_holds",
    "round_reference",
    "code_reference",
    "dequantize_reference",
]

import logging

import numpy as np
import onnx

logger = logging.getLogger(__name__)

#: Canonical rounding-mode names; each is also the ``overload`` of its function body.
ROUND_MODES: tuple[str, ...] = ("half_even", "half_up", "half_away", "floor", "trunc")
#: Other names accepted for the same modes (Vitis AI tools use several spellings).
ROUND_MODE_ALIASES: dict[str, str] = {
    "toward_zero": "trunc",
    "std_round": "half_away",
    "half_away_from_zero": "half_away",
    "half_to_even": "half_even",
}
#: Every code of a grid up to 24 bits is an exact float32 integer; wider grids are refused.
MIN_BIT_WIDTH, MAX_BIT_WIDTH = 2, 24
#: 2^pos, 2^(pos+1) and 2^-pos must all be finite non-zero float32 numbers.
MIN_POS, MAX_POS = -127, 126
#: Integer types VitisQuantizeLinear may write and VitisDequantizeLinear may read.
STORAGE_TYPES: dict[int, type[np.integer]] = {
    onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.INT16: np.int16,
    onnx.TensorProto.UINT16: np.uint16,
    onnx.TensorProto.INT32: np.int32,
}


def canonical_round_mode(name: str) -> str | None:
    """Return the canonical name of a rounding mode or alias, None when unknown."""
    if name in ROUND_MODES:
        return name
    return ROUND_MODE_ALIASES.get(name)


def qrange(bit_width: int, signed: int, narrow: int = 0) -> tuple[int, int]:
    """Code range: [-2^(bw-1) + narrow, 2^(bw-1) - 1] when signed, else [0, 2^bw - 1]."""
    if signed:
        return -(1 << (bit_width - 1)) + narrow, (1 << (bit_width - 1)) - 1
    return 0, (1 << bit_width) - 1


def default_storage(bit_width: int, signed: int) -> int:
    """Storage type of the codes: (u)int8 up to 8 bits, (u)int16 up to 16, int32 above."""
    if bit_width <= 8:
        return onnx.TensorProto.INT8 if signed else onnx.TensorProto.UINT8
    if bit_width <= 16:
        return onnx.TensorProto.INT16 if signed else onnx.TensorProto.UINT16
    return onnx.TensorProto.INT32


def storage_holds(dtype: int, qmin: int, qmax: int) -> bool:
    """Whether the ONNX integer type ``dtype`` can hold every code in [qmin, qmax]."""
    np_type = STORAGE_TYPES.get(dtype)
    if np_type is None:
        return False
    info = np.iinfo(np_type)
    return info.min <= qmin and qmax <= info.max


def round_reference(c: np.ndarray, mode: str) -> np.ndarray:
    """Round float64 values (|c| <= 2^23, so c + 0.5 is exact) to integers; a zero takes c's sign."""
    if mode == "half_even":
        r = np.rint(c)
    elif mode == "half_up":
        r = np.floor(c + 0.5)
    elif mode == "half_away":
        r = np.floor(np.abs(c) + 0.5)
    elif mode == "floor":
        r = np.floor(c)
    elif mode == "trunc":
        r = np.trunc(c)
    else:
        raise ValueError(f"unknown rounding mode {mode!r}")
    # A non-zero result already has c's sign; this fixes the sign of zeros (and half_away's sign).
    return np.copysign(r, c)


def code_reference(
    x: np.ndarray, *, bit_width: int, pos: int, signed: int, narrow: int, round_mode: str
) -> np.ndarray:
    """Integer codes as float64: round_mode(clamp(fl32(x * 2^pos), qmin, qmax)); NaN stays NaN."""
    qmin, qmax = qrange(bit_width, signed, narrow)
    x32 = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", under="ignore"):
        v = x32 * np.float32(2.0**pos)
    lo, hi = np.float32(qmin if qmin else -0.0), np.float32(qmax)
    # Clamp rule: v is kept unless v < lo or v > hi (NaN is kept); an unsigned grid's lo is -0.0.
    c = np.where(v < lo, lo, np.where(v > hi, hi, v)).astype(np.float64)
    return round_reference(c, round_mode)


def dequantize_reference(codes: np.ndarray, pos: int) -> np.ndarray:
    """float32(codes * 2^-pos), the product taken exactly in float64 and rounded once."""
    with np.errstate(over="ignore", invalid="ignore"):
        return (np.asarray(codes, dtype=np.float64) * 2.0 ** (-pos)).astype(np.float32)
