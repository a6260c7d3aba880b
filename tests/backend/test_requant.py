"""Requantization arithmetic: rounding right shifts and multipliers against exact Python rationals."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from zonnx.backend.compiler.requant import (
    ROUND_MODES,
    mag_max,
    pof2_exponent,
    quantize_multiplier,
    requantize,
    round_fraction,
    rshift_round,
)
from zonnx.errors import OptionError

_TABLE = {  # x / 4 for x = -6, -5, -2, 2, 5, 6 (ties at -1.5, -0.5, 0.5, 1.5)
    "half_up": [-1, -1, 0, 1, 1, 2],
    "half_even": [-2, -1, 0, 0, 1, 2],
    "half_away": [-2, -1, -1, 1, 1, 2],
    "half_down": [-2, -1, -1, 0, 1, 1],
    "floor": [-2, -2, -1, 0, 1, 1],
    "ceil": [-1, -1, 0, 1, 2, 2],
    "trunc": [-1, -1, 0, 0, 1, 1],
}


@pytest.mark.parametrize("mode", ROUND_MODES)
def test_ties_and_negatives_table(mode: str) -> None:
    x = np.array([-6, -5, -2, 2, 5, 6], dtype=np.int64)
    assert rshift_round(x, 2, mode).tolist() == _TABLE[mode]


@pytest.mark.parametrize("mode", ROUND_MODES)
def test_rshift_round_matches_fractions(mode: str) -> None:
    x = np.arange(-700, 701, dtype=np.int64)
    for s in range(0, 11):
        got = rshift_round(x, s, mode)
        want = [round_fraction(Fraction(int(v), 1 << s), mode) for v in x]
        assert got.tolist() == want, (mode, s)


@pytest.mark.parametrize("mode", ROUND_MODES)
def test_per_channel_shifts_and_left_shift(mode: str) -> None:
    x = np.arange(-40, 40, dtype=np.int64).reshape(4, 20)
    shifts = np.array([0, 1, 5, -3]).reshape(4, 1)
    got = rshift_round(x, shifts, mode)
    for c in range(4):
        s = int(shifts[c, 0])
        want = [
            round_fraction(Fraction(int(v) * 2**-s if s < 0 else Fraction(int(v), 1 << s)), mode)
            for v in x[c]
        ]
        assert got[c].tolist() == want
    assert rshift_round(x, -3, mode).tolist() == (x * 8).tolist()


@pytest.mark.parametrize("mode", ["half_up", "half_even", "half_away", "floor"])
def test_large_products_are_exact(mode: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(-(2**40), 2**40, size=200, dtype=np.int64)
    m, s = (1 << 31) - 1, 45  # |x * m| ~ 2^71: beyond int64, the object fallback must be taken
    got = requantize(x, m, s, mode, zero_point=3)
    want = [round_fraction(Fraction(int(v) * m, 1 << s), mode) + 3 for v in x]
    assert got.tolist() == want
    small = rng.integers(-(2**30), 2**30, size=200, dtype=np.int64)
    got = requantize(small, m, 40, mode, lo=-100, hi=100)
    want = [min(100, max(-100, round_fraction(Fraction(int(v) * m, 1 << 40), mode))) for v in small]
    assert got.tolist() == want


def test_tpu_mlir_worked_example() -> None:
    m, s = quantize_multiplier(0.1234, 32)
    assert (m, s) == (2119995857, 34)
    assert requantize(np.array([100, -100]), m, s, "floor").tolist() == [12, -13]
    assert requantize(np.array([100, -100]), m, s, "half_up").tolist() == [12, -12]


@pytest.mark.parametrize("bits", [8, 15, 16, 32])
def test_multiplier_is_nearest_and_in_range(bits: int) -> None:
    rng = np.random.default_rng(bits)
    for r in [*rng.uniform(1e-6, 1.0, 200), *rng.uniform(1.0, 50.0, 50), 0.5, 0.25, 1.0, 1 - 2**-40]:
        m, s = quantize_multiplier(float(r), bits)
        assert 0 < m <= mag_max(bits)
        assert m > mag_max(bits) // 2  # full precision: the top bit is used
        assert abs(Fraction(m, 2**s) - Fraction(float(r))) <= Fraction(1, 2 ** (s + 1))


def test_multiplier_edges() -> None:
    assert mag_max(32) == 2**31 - 1 and mag_max(15) == 32767 and mag_max(8) == 127
    assert quantize_multiplier(1 - 2**-40, 32) == (2**30, 30)  # mantissa rounds up to 2^31: renormalized
    assert quantize_multiplier(0.0, 32) == (0, 0)
    assert quantize_multiplier(1e-12, 15, (0, 31)) == (0, 31)  # clamped shift underflows to 0
    m, s = quantize_multiplier(3e-6, 15, (0, 31))  # wants shift 33: clamped, fewer significant bits
    assert s == 31 and m == round(3e-6 * 2**31) == 6442
    with pytest.raises(OptionError, match="too large"):
        quantize_multiplier(1e6, 8, (0, 31))
    with pytest.raises(OptionError, match="unknown rounding mode"):
        rshift_round(np.array([1]), 1, "banker")
    assert pof2_exponent(0.125) == -3 and pof2_exponent(0.3) is None and pof2_exponent(4.0) == 2
