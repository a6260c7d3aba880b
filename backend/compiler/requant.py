"""Integer requantization: float scales to integer multiplier + shift, and rounding right shifts in int64.

A real scale ``r > 0`` (for example ``S_x * S_w / S_y``) is approximated by ``M * 2^-shift`` with an
integer multiplier ``M`` and a right ``shift``; requantizing an integer ``x`` is then
``rshift_round(x * M, shift, mode)``, one exact integer product and one rounding (TPU-MLIR's
``(acc * M) >> rshift``; TFLite's two-step SaturatingRoundingDoublingHighMul is not used).

Multiplier width (``bits``): ``M <= mag_max(bits)`` where the 8-, 16- and 32-bit widths are signed
storage types (TFLite/TPU-MLIR int32 multiplier: ``M < 2^31``; int8: ``M <= 127``) and any other width
counts magnitude bits (Zhouyi's 15-bit ``M <= 32767``). ``quantize_multiplier`` follows TFLite's
``QuantizeMultiplier``: ``r = m * 2^e`` with ``m in [0.5, 1)`` (frexp), ``M = round(m * 2^b)`` (b magnitude
bits; ``M == 2^b`` is renormalized), ``shift = b - e``; a shift outside the target's range is clamped and
``M = round(r * 2^shift)`` re-derived (fewer significant bits), and a scale too large for the widest
multiplier at the smallest shift is an error. Power-of-two scales (``pof2``) give ``M = 1`` and an
exact shift (a negative shift is a left shift).

Rounding of ``x / 2^s`` (``s > 0``; ``s == 0`` returns ``x``; ``s < 0`` is an exact left shift), all in
int64 with no float step:

=============  ========================================  ======================
mode           rule                                      x = -5, -6, 5, 6 (s=2)
=============  ========================================  ======================
half_up        floor(x/2^s + 1/2) = (x + 2^(s-1)) >> s    -1, -1, 1, 2
half_even      nearest, ties to even                      -1, -2, 1, 2
half_away      nearest, ties away from zero               -1, -2, 1, 2
half_down      ceil(x/2^s - 1/2)                          -1, -2, 1, 1
floor          x >> s (arithmetic shift)                  -2, -2, 1, 1
ceil           -((-x) >> s)                               -1, -1, 2, 2
trunc          toward zero                                -1, -1, 1, 1
=============  ========================================  ======================

(-5/4 = -1.25, -6/4 = -1.5, 5/4 = 1.25, 6/4 = 1.5.) Products ``x * M`` must stay below 2^62 in
magnitude; ``requantize`` checks the bound and falls back to exact Python integers when it does not hold.
"""

from __future__ import annotations

__all__ = [
    "ROUND_MODES",
    "canonical_round_mode",
    "mag_max",
    "quantize_multiplier",
    "pof2_exponent",
    "rshift_round",
    "requantize",
    "requantize_op",
    "round_fraction",
]

import logging
import math
from fractions import Fraction
from typing import Any

import numpy as np

from zonnx.errors import OptionError, did_you_mean

logger = logging.getLogger(__name__)

#: Rounding modes of the integer right shift (the target files' five plus TPU-MLIR's half_down and ceil).
ROUND_MODES = ("half_up", "half_even", "half_away", "half_down", "floor", "ceil", "trunc")
_ALIASES = {
    "toward_zero": "trunc",
    "towards_zero": "trunc",
    "std_round": "half_away",
    "half_away_from_zero": "half_away",
    "half_to_even": "half_even",
    "down": "floor",
    "up": "ceil",
}
_SAFE = 1 << 62


def canonical_round_mode(name: str) -> str:
    """The canonical name of a rounding mode or alias; OptionError for an unknown name."""
    key = str(name).lower()
    if key in ROUND_MODES:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    raise OptionError(
        f"unknown rounding mode {name!r}; use one of {', '.join(ROUND_MODES)}."
        + did_you_mean(key, [*ROUND_MODES, *_ALIASES])
    )


def mag_max(bits: int) -> int:
    """Largest multiplier of a ``bits``-wide multiplier: signed storage for 8/16/32/64, magnitude otherwise."""
    if bits < 2:
        raise OptionError(f"multiplier_bits {bits} is too small; use at least 2.")
    return (1 << (bits - 1)) - 1 if bits in (8, 16, 32, 64) else (1 << bits) - 1


def pof2_exponent(scale: float) -> int | None:
    """``k`` with ``scale == 2^k`` exactly, None when the scale is not a power of two."""
    m, e = math.frexp(float(scale))
    return e - 1 if m == 0.5 else None


def quantize_multiplier(
    scale: float, bits: int, shift_range: tuple[int, int] | None = None
) -> tuple[int, int]:
    """``(M, shift)`` with ``M * 2^-shift ~= scale``, ``0 <= M <= mag_max(bits)``, shift in ``shift_range``.

    TFLite QuantizeMultiplier generalized to ``bits``; a zero (or denormal-small) scale gives ``(0, 0)``.
    Computed from the float64 value of ``scale`` with exact integer arithmetic (Fraction), so the result
    is the nearest multiplier (ties to even) of the chosen width.
    """
    scale = float(scale)
    if not math.isfinite(scale) or scale < 0:
        raise OptionError(f"requantization scale {scale!r} must be finite and non-negative.")
    if scale == 0.0:
        return 0, 0
    mmax = mag_max(bits)
    b = mmax.bit_length()  # magnitude bits
    exact = Fraction(scale)
    _, e = math.frexp(scale)
    shift = b - e
    lo, hi = shift_range if shift_range is not None else (-64, 126)
    shift = min(max(shift, lo), hi)
    m = round(exact * (Fraction(2) ** shift))
    if m > mmax and shift == b - e:  # mantissa rounded up to 2^b: renormalize
        m = round(exact * (Fraction(2) ** (shift - 1)))
        shift -= 1
        if shift < lo:
            raise OptionError(f"scale {scale!r} needs a shift below the target's minimum {lo}.")
    if m > mmax:
        raise OptionError(
            f"scale {scale!r} is too large for a {bits}-bit multiplier with shift >= {lo} "
            f"(needs {m} > {mmax}); the target cannot requantize it."
        )
    if m == 0:
        logger.debug("scale %r underflows to multiplier 0 at shift %d", scale, shift)
    return int(m), int(shift)


def _as_i64(x: np.ndarray | int) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


def rshift_round(x: np.ndarray, shift: np.ndarray | int, mode: str) -> np.ndarray:
    """Round ``x / 2^shift`` to an integer with ``mode`` (int64 in, int64 out; shift broadcasts).

    ``shift <= 0`` is exact (a left shift). Exact for every int64 ``x`` (no intermediate overflow beyond
    ``x + 2^(shift-1)``, so keep ``|x| < 2^62``); object arrays of Python ints are handled too.
    """
    mode = canonical_round_mode(mode)
    if np.asarray(x).dtype == object:
        return _rshift_round_object(np.asarray(x), shift, mode)
    x = _as_i64(x)
    s = _as_i64(shift)
    left = np.maximum(-s, 0)
    s = np.maximum(s, 0)
    out = np.left_shift(x, left) if np.any(left) else x
    if not np.any(s):
        return np.broadcast_to(out, np.broadcast_shapes(x.shape, s.shape)).copy()
    one = np.int64(1)
    half = np.where(s > 0, np.left_shift(one, np.maximum(s - 1, 0)), 0)
    q = np.right_shift(out, s)  # floor
    if mode == "floor":
        return q
    r = out - np.left_shift(q, s)  # remainder in [0, 2^s)
    if mode == "ceil":
        return q + (r > 0)
    if mode == "half_up":
        return q + ((r >= half) & (s > 0))
    if mode == "half_down":
        return q + (r > half)
    if mode == "half_even":
        return q + ((r > half) | ((r == half) & (s > 0) & ((q & 1) == 1)))
    neg = out < 0
    if mode == "trunc":
        return q + (neg & (r > 0))
    if mode == "half_away":
        return q + ((r > half) | ((r == half) & (s > 0) & ~neg))
    raise AssertionError(mode)


def _rshift_round_object(x: np.ndarray, shift: np.ndarray | int, mode: str) -> np.ndarray:
    s_arr = np.broadcast_to(np.asarray(shift), np.broadcast_shapes(x.shape, np.shape(shift)))
    xb = np.broadcast_to(x, s_arr.shape)
    flat = [
        round_fraction(Fraction(int(v), 1 << int(s)) if s >= 0 else Fraction(int(v) << int(-s)), mode)
        for v, s in zip(xb.ravel(), s_arr.ravel(), strict=True)
    ]
    return np.array(flat, dtype=object).reshape(s_arr.shape)


def round_fraction(v: Fraction, mode: str) -> int:
    """Round an exact rational with ``mode``: the definition the integer shifts are tested against."""
    mode = canonical_round_mode(mode)
    fl = math.floor(v)
    frac = v - fl
    half = Fraction(1, 2)
    if mode == "floor":
        return fl
    if mode == "ceil":
        return fl + (frac > 0)
    if mode == "trunc":
        return fl + (frac > 0 and v < 0)
    if frac != half:
        return fl + (frac > half)
    return {
        "half_up": fl + 1,
        "half_down": fl,
        "half_even": fl + (fl % 2),
        "half_away": fl + (v > 0),
    }[mode]


def requantize(
    x: np.ndarray,
    multiplier: np.ndarray | int,
    shift: np.ndarray | int,
    mode: str,
    *,
    zero_point: int = 0,
    lo: int | None = None,
    hi: int | None = None,
) -> np.ndarray:
    """``clamp(rshift_round(x * M, shift, mode) + zero_point, lo, hi)`` exactly, as int64.

    ``multiplier`` and ``shift`` broadcast against ``x`` (per-channel: shape ``(C, 1, 1)``). When
    ``max|x| * max|M|`` may reach 2^62 the product is taken in Python integers (slow but exact).
    """
    x = _as_i64(x)
    m = _as_i64(multiplier)
    big = x.size and m.size and int(np.max(np.abs(x))) * int(np.max(np.abs(m))) >= _SAFE
    if big:
        logger.debug("requantize: product may exceed 2^62, using Python integers")
        prod = x.astype(object) * m.astype(object)
        y = np.asarray(rshift_round(prod, shift, mode), dtype=np.int64)
    else:
        y = rshift_round(x * m, shift, mode)
    y = y + np.int64(zero_point)
    if lo is not None or hi is not None:
        y = np.clip(y, lo, hi)
    return y


def requantize_op(acc: np.ndarray, op: Any) -> np.ndarray:
    """A program op's requantization of ``acc`` with its single (per-tensor) multiplier and shift."""
    a = op.attrs
    return requantize(
        acc,
        op.params["multiplier"][0],
        op.params["shift"][0],
        a["round_mode"],
        zero_point=a["zp_out"],
        lo=a["lo"],
        hi=a["hi"],
    )
