"""When ORT's QLinearConv and QLinearAdd compute a program op exactly, and the parameters that make them.

QLinearConv. MLAS adds the int32 bias to the exact int32 accumulator ``n`` and requantizes with
``z = round_ne(clamp(f32(f32(n) * sigma), -Y, 255 - Y)) + Y`` (``sigma = x_scale * w_scale / y_scale`` in
float32, ``Y`` the uint8 output zero point; ``_mm_cvtps_epi32`` rounds half to even). With ``x_scale =
y_scale = 1`` ``sigma`` is the per-channel ``w_scale`` itself. A program conv with a power-of-two
multiplier (``M = 2^j``, shift ``s = shift - j``, ``0 <= s <= 15``) stores
``y = clamp(R((acc + A) / 2^s) + zs, lo, hi)`` (``acc`` includes the program bias, ``zs`` the stored zero
point). Both sides saturate monotonically, so the two agree everywhere once they agree on the finite
window of ``n`` where the output is not saturated (``|n| < 2^s * 260``, float32-exact as ``2^15 * 260 <
2^24``); ``plan_conv_requant`` checks that window exhaustively in float32 numpy, which rounds like
SSE/AVX ``mulps``:

- floor-type modes (floor, ceil, half_up, half_down): ``R(u) = floor(u + A / 2^s)`` with ``A`` an integer.
  With ``Y = 0`` and the bias raised by ``A - 2^(s-1) + zs 2^s``, ``floor((acc + A)/2^s) + zs =
  floor(n / 2^s + 1/2)``; round-half-even gives the same once every tie ``k + 1/2`` is pushed up and
  nothing else crosses a boundary, which ``sigma = 2^-s (1 + eps)`` does for a small ``eps`` (ties lie
  exactly on boundaries, other values at least ``2^-s`` from one).
- half_even: ``Y = zs mod 2``, bias raised by ``(zs - Y) 2^s`` (rounding commutes with even shifts),
  ``sigma = 2^-s`` exactly.

Sign-dependent modes (half_away, trunc) do not commute with the zero-point shift and are refused.
The storage clamp ``[lo, hi]`` narrower than ``[0, 255]`` (a fused ReLU) is one uint8 ``Clip`` after.

QLinearAdd (com.microsoft) computes ``r_a (a - z_a) + r_b (b - z_b)`` and rounds; when both
``r_i = M_i / 2^s`` are powers of two ``>= 1`` the sum is an exact integer (float32 and MLAS's fixed-point
path both represent it exactly), so no rounding happens and the result is the program's.
"""

from __future__ import annotations

__all__ = ["ConvRequant", "FLOOR_TYPE", "alpha_int", "plan_conv_requant", "add_ratios", "int32_safe"]

import dataclasses
import functools
import logging

import numpy as np

logger = logging.getLogger(__name__)

FLOOR_TYPE = ("floor", "ceil", "half_up", "half_down")
_MAX_SHIFT = 15
_EPS_EXPONENTS = (22, 21, 20, 23, 19, 18)
_I31 = (1 << 31) - 1


@dataclasses.dataclass(frozen=True)
class ConvRequant:
    """QLinearConv parameters: per-channel ``w_scale`` (sigma), int64 bias raise, output zero point ``Y``."""

    sigma: np.ndarray
    bias_raise: np.ndarray
    y_zp: int


def alpha_int(mode: str, s: int) -> int:
    """``A`` of a floor-type mode: ``R(u) = floor((x + A) / 2^s)`` for ``u = x / 2^s``."""
    if s == 0:
        return 0
    return {"floor": 0, "ceil": (1 << s) - 1, "half_up": 1 << (s - 1), "half_down": (1 << (s - 1)) - 1}[mode]


def _ort_requant(n: np.ndarray, sigma: np.float32, y: int) -> np.ndarray:
    f = np.float32(n.astype(np.float32) * sigma)
    f = np.clip(f, np.float32(-y), np.float32(255 - y))
    return np.rint(f).astype(np.int64) + y  # np.rint rounds half to even, like cvtps2dq


@functools.lru_cache(maxsize=64)
def _sigma_for(s: int, half_even: bool, y: int) -> float | None:
    """A float32 sigma for which ORT's requantization equals the exact rounding on the whole window."""
    n = np.arange(-(2 << s) - 2, (258 << s) + 2, dtype=np.int64)
    if half_even:
        exact = np.clip(_round_half_even(n, s), -y, 255 - y) + y
        candidates = [np.float32(np.ldexp(1.0, -s))]
    else:
        exact = np.clip((n + (1 << s >> 1)) >> s, 0, 255)  # floor(n / 2^s + 1/2)
        if s == 0:
            candidates = [np.float32(1.0)]
        else:
            candidates = [np.float32(np.ldexp(1.0 + np.ldexp(1.0, -k), -s)) for k in _EPS_EXPONENTS]
    for sigma in candidates:
        if np.array_equal(_ort_requant(n, sigma, y), exact):
            return float(sigma)
    return None


def _round_half_even(n: np.ndarray, s: int) -> np.ndarray:
    if s == 0:
        return n
    q, r = n >> s, n & ((1 << s) - 1)
    half = 1 << (s - 1)
    return q + ((r > half) | ((r == half) & (q & 1 == 1)))


def _pof2_shift(multiplier: np.ndarray, shift: np.ndarray) -> np.ndarray | None:
    m = np.asarray(multiplier, dtype=np.int64).reshape(-1)
    if np.any(m <= 0) or np.any(m & (m - 1)):
        return None
    s = np.broadcast_to(np.asarray(shift, dtype=np.int64).reshape(-1), m.shape) - np.log2(m).astype(np.int64)
    if np.any(s < 0) or np.any(s > _MAX_SHIFT):
        return None
    return s


def plan_conv_requant(
    multiplier: np.ndarray, shift: np.ndarray, mode: str, zs: int, channels: int
) -> ConvRequant | None:
    """QLinearConv parameters reproducing ``clamp(R(acc M / 2^shift) + zs)``, or None when not provably exact.

    ``zs`` is the stored output zero point (code zero point + storage offset, in [0, 255]).
    """
    if mode not in FLOOR_TYPE and mode != "half_even":
        return None
    s = _pof2_shift(np.broadcast_to(np.asarray(multiplier).reshape(-1), (channels,)), shift)
    if s is None or not 0 <= zs <= 255:
        return None
    s = np.broadcast_to(s, (channels,))
    half_even = mode == "half_even"
    y = zs % 2 if half_even else 0
    sig, raise_ = [], []
    for sc in s.tolist():
        sigma = _sigma_for(int(sc), half_even, y)
        if sigma is None:
            logger.info("no exact QLinearConv scale for shift %d (%s)", sc, mode)
            return None
        sig.append(sigma)
        if half_even:
            raise_.append((zs - y) << sc)
        else:
            raise_.append(alpha_int(mode, sc) - (1 << sc >> 1) + (zs << sc))
    return ConvRequant(np.array(sig, dtype=np.float32), np.array(raise_, dtype=np.int64), y)


def int32_safe(bound: float) -> bool:
    """Whether an accumulator bound (including the bias) fits MLAS's int32 accumulation."""
    return bound < _I31


def add_ratios(multipliers: list[int], shift: int) -> list[float] | None:
    """``[r_a, r_b]`` when both ``M_i / 2^s`` are powers of two in ``[1, 256)`` (QLinearAdd exact), else None."""
    out = []
    for m in multipliers:
        if m <= 0 or m & (m - 1):
            return None
        e = int(m).bit_length() - 1 - int(shift)
        if not 0 <= e < 8:
            return None
        out.append(float(1 << e))
    return out
