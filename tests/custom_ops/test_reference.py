"""The numpy reference kernels against hand-computed tables and an exact rational-arithmetic oracle."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from onnx import TensorProto

from zonnx.custom_ops import reference_run
from zonnx.custom_ops.grid import ROUND_MODES, canonical_round_mode, default_storage, qrange, storage_holds

F32 = np.float32

# Vitis AI's rounding tables (UG1414 summary, section 9), at pos = 0.
TIES = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5]
TABLES = {
    "half_up": [1, 2, 3, 0, -1, -2],
    "half_even": [0, 2, 2, 0, -2, -2],
    "half_away": [1, 2, 3, -1, -2, -3],
    "floor": [0, 1, 2, -1, -2, -3],
    "trunc": [0, 1, 2, 0, -1, -2],
}


@pytest.mark.parametrize("mode", ROUND_MODES)
def test_rounding_tables(mode: str) -> None:
    q = reference_run("VitisQuantizeLinear", np.array(TIES, F32), pos=0, round_mode=mode)
    assert q.dtype == np.int8 and q.tolist() == TABLES[mode]
    # The same ties at pos 3 are (k + 0.5) / 8; FixNeuron returns the code times 1/8.
    y = reference_run("FixNeuron", np.array(TIES, F32) / 8, pos=3, round_mode=mode)
    assert y.tolist() == [v / 8 for v in TABLES[mode]]


def test_just_below_a_tie_rounds_down_in_every_nearest_mode() -> None:
    """0.5 - 2^-25 is where float32 floor(v + 0.5) goes wrong (the sum rounds up to 1.0)."""
    below = np.nextafter(F32(0.5), F32(0))
    assert float(below) == 0.5 - 2.0**-25
    for mode in ("half_up", "half_away", "half_even"):
        for pos in (0, 4, -3):
            x = np.array([below * F32(2.0**-pos), -below * F32(2.0**-pos)], F32)
            q = reference_run("VitisQuantizeLinear", x, pos=pos, round_mode=mode)
            assert q.tolist() == [0, 0], (mode, pos)


def test_fix_point_7_on_8_bits() -> None:
    """Q0.7: step 2^-7, largest value 127/128, smallest -1 (or -127/128 with the narrow range)."""
    x = np.array([1.0, -1.0, 2.0**-8, 3 * 2.0**-8, -5.0], F32)
    assert reference_run("FixNeuron", x, pos=7).tolist() == [0.9921875, -1.0, 0.0, 2 * 2.0**-7, -1.0]
    assert reference_run("FixNeuron", x, pos=7, narrow=1).tolist()[-1] == -0.9921875
    assert reference_run("FixNeuron", x, pos=7, round_mode="half_up").tolist()[2:4] == [2.0**-7, 2 * 2.0**-7]


def test_grid_ranges_and_storage() -> None:
    assert qrange(8, 1) == (-128, 127) and qrange(8, 1, 1) == (-127, 127) and qrange(8, 0) == (0, 255)
    assert qrange(4, 1) == (-8, 7) and qrange(16, 0) == (0, 65535) and qrange(24, 1) == (-(2**23), 2**23 - 1)
    assert default_storage(4, 1) == TensorProto.INT8 and default_storage(8, 0) == TensorProto.UINT8
    assert default_storage(12, 1) == TensorProto.INT16 and default_storage(16, 0) == TensorProto.UINT16
    assert default_storage(17, 0) == TensorProto.INT32 and default_storage(24, 1) == TensorProto.INT32
    assert storage_holds(TensorProto.INT16, -128, 127) and not storage_holds(TensorProto.INT8, 0, 255)
    assert not storage_holds(TensorProto.FLOAT, 0, 1)
    for bw in (4, 12, 20):
        for signed in (0, 1):
            q = reference_run(
                "VitisQuantizeLinear", np.array([1e9, -1e9], F32), pos=0, bit_width=bw, signed=signed
            )
            assert q.tolist() == list(qrange(bw, signed)[::-1]), (bw, signed, q.dtype)


def test_aliases() -> None:
    assert canonical_round_mode("toward_zero") == "trunc" and canonical_round_mode("std_round") == "half_away"
    assert canonical_round_mode("nearest") is None
    x = np.array([-2.5, -1.7, 1.7, 2.5], F32)
    assert (reference_run("FixNeuron", x, pos=0, round_mode="toward_zero") == [-2, -1, 1, 2]).all()
    assert (reference_run("FixNeuron", x, pos=0, round_mode="std_round") == [-3, -2, 2, 3]).all()


def test_signed_zero_nan_and_saturation() -> None:
    x = np.array([-0.0, 0.0, -0.2, 0.2, -7.0, np.nan, np.inf, -np.inf], F32)
    signed = reference_run("FixNeuron", x, pos=0, bit_width=4)
    assert np.signbit(signed).tolist() == [True, False, True, False, True, False, False, True]
    assert signed[4] == -7 and np.isnan(signed[5]) and signed[6] == 7 and signed[7] == -8
    unsigned = reference_run("FixNeuron", x, pos=0, bit_width=4, signed=0)
    assert unsigned[[0, 2, 4, 7]].tolist() == [0, 0, 0, 0] and np.signbit(unsigned[[0, 2, 4, 7]]).all()
    assert unsigned[6] == 15
    q = reference_run("VitisQuantizeLinear", x, pos=0, bit_width=4)
    assert q.tolist() == [0, 0, 0, 0, -7, 0, 7, -8]


def test_dequantize_rounds_once() -> None:
    q = np.array([2**24 + 1, -(2**31), 2**31 - 1, 3], np.int32)
    y = reference_run("VitisDequantizeLinear", q, pos=1, bit_width=24)
    assert y.dtype == np.float32
    assert y.tolist() == [float(F32((2**24 + 1) / 2)), -(2.0**30), 2.0**30, 1.5]
    assert reference_run("VitisDequantizeLinear", np.array([100], np.int8), pos=-127).tolist() == [math.inf]


def _oracle(x: float, pos: int, bw: int, signed: int, narrow: int, mode: str) -> Fraction:
    """Exact rational FixNeuron for a normal float32 x whose scaled value is also normal."""
    v = Fraction(x) * Fraction(2) ** pos
    lo, hi = qrange(bw, signed, narrow)
    v = min(max(v, Fraction(lo)), Fraction(hi))
    floor = math.floor(v)
    frac = v - floor
    if mode == "floor":
        q = floor
    elif mode == "trunc":
        q = math.trunc(v)
    elif mode == "half_up":
        q = floor + (frac >= Fraction(1, 2))
    elif mode == "half_away":
        q = floor + (frac > Fraction(1, 2) or (frac == Fraction(1, 2) and v > 0))
    else:
        q = floor + (frac > Fraction(1, 2) or (frac == Fraction(1, 2) and floor % 2 == 1))
    return Fraction(q) * Fraction(2) ** -pos


@pytest.mark.parametrize("mode", ROUND_MODES)
def test_reference_matches_exact_rational_oracle(mode: str) -> None:
    rng = np.random.default_rng(7)
    for bw, signed, narrow in ((4, 1, 0), (8, 1, 1), (8, 0, 0), (16, 1, 0)):
        for pos in (-8, 0, 3, 11, 24):
            ties = ((rng.integers(-(2**bw), 2**bw, 200) + 0.5) * 2.0**-pos).astype(F32)
            near = np.nextafter(ties, np.where(rng.random(200) < 0.5, F32(-np.inf), F32(np.inf)))
            rand = (rng.standard_normal(200) * 2.0 ** (bw - 1 - pos)).astype(F32)
            x = np.concatenate([ties, near, rand])
            x = x[(np.abs(x) > 2.0**-100) & np.isfinite(x)]
            got = reference_run(
                "FixNeuron", x, pos=pos, bit_width=bw, signed=signed, narrow=narrow, round_mode=mode
            )
            for xi, gi in zip(x.tolist(), got.tolist(), strict=True):
                assert Fraction(gi) == _oracle(xi, pos, bw, signed, narrow, mode), (xi, pos, bw, signed, mode)
