"""QLinearConv / QLinearAdd / float32 adds lowered from power-of-two programs equal the reference on every value.

The convolution test feeds every accumulator of the non-saturated window (and beyond, both sides) through
the real ORT kernel; the add tests feed every pair of input codes. Each also checks that the fused path
was really taken, so a silent fallback to the general lowering cannot pass unnoticed.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.backend.test_ort_lowering import _assert_exact, _info, _program
from zonnx.backend.compiler import Op
from zonnx.backend.runtime.ort_lowering import lower_program
from zonnx.backend.runtime.qlinear_exact import plan_conv_requant

#: Bit-exactness on this CPU: CI also runs these under emulated AVX2 and SSE4.1 CPUs (tools/exactness.sh).
pytestmark = pytest.mark.exactness


def _kinds(prog) -> list[str]:
    return [n.op_type for n in lower_program(prog, name="p").nodes]


def _conv(name: str, w: np.ndarray, bias: np.ndarray, shift: int, mode: str, **attrs: object) -> Op:
    base = {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1, "pad_value": 0}
    base.update(zp_out=0, lo=-128, hi=127, round_mode=mode)
    base.update(attrs)
    o = w.shape[0]
    params = {
        "w": w.astype(np.int8),
        "bias": bias,
        "multiplier": np.ones(o, np.int64),
        "shift": np.full(o, shift),
    }
    return Op("conv", name, ["x"], ["y"], base, params)


@pytest.mark.parametrize(
    ("mode", "shift", "zp_out", "lo", "dt_out"),
    [
        ("half_up", 13, 0, -128, "int8"),
        ("half_even", 15, 0, -128, "int8"),
        ("half_up", 9, 0, 0, "int8"),  # fused ReLU: Clip after
        ("half_up", 0, 3, -128, "int8"),
        ("floor", 7, -3, -128, "int8"),
        ("ceil", 12, 1, -20, "int8"),
        ("half_down", 5, 0, 0, "int8"),
        ("half_even", 9, 3, -128, "int8"),  # odd stored zero point: Y = 1
        ("half_even", 14, 0, 0, "int8"),
        ("half_even", 1, -1, -128, "int8"),
        ("half_up", 10, 131, 0, "uint8"),
    ],
)
def test_conv_every_accumulator(mode: str, shift: int, zp_out: int, lo: int, dt_out: str) -> None:
    """Channel c adds bias ``base + 256 c`` to the 256 input codes: every accumulator from -3 * 2^s
    to 262 * 2^s occurs once."""
    lo_acc, hi_acc = -(3 << shift) - 256, (262 << shift) + 256
    o = (hi_acc - lo_acc) // 256 + 1
    bias = lo_acc + 128 + 256 * np.arange(o)
    op = _conv(
        "c",
        np.ones((o, 1, 1, 1)),
        bias,
        shift,
        mode,
        zp_out=zp_out,
        lo=lo,
        hi=127 if dt_out == "int8" else 255,
    )
    prog = _program([op], [_info("x", "int8"), _info("y", dt_out, zp_out)])
    assert "QLinearConv" in _kinds(prog)
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 1, 1, 256)
    assert _assert_exact(prog, {"x": x}) == 1


@pytest.mark.parametrize(("group", "pads", "strides"), [(1, [1, 1, 1, 1], [1, 1]), (8, [0, 1, 2, 1], [2, 2])])
def test_conv_random_weights_and_padding(group: int, pads: list[int], strides: list[int]) -> None:
    """3x3 convolutions (dense and depthwise) with a nonzero pad value, per-channel shifts and ReLU."""
    rng = np.random.default_rng(group)
    w = rng.integers(-128, 128, size=(8, 8 // group, 3, 3))
    op = _conv("c", w, rng.integers(-3000, 3000, 8), 0, "half_up", pads=pads, strides=strides, group=group)
    op.params["shift"] = rng.integers(4, 12, 8)
    op.attrs.update(pad_value=-5, lo=0, zp_out=2)
    prog = _program([op], [_info("x", "int8", -5), _info("y", "int8", 2)])
    assert "QLinearConv" in _kinds(prog)
    x = rng.integers(-128, 128, size=(2, 8, 11, 13)).astype(np.int8)
    x[0, :, :4] = 127
    assert _assert_exact(prog, {"x": x}) == 1


def test_refused_modes_and_multipliers_stay_exact() -> None:
    """Sign-dependent rounding and non-power-of-two multipliers are refused (general lowering instead)."""
    assert plan_conv_requant(np.array([1]), np.array([4]), "half_away", 128, 1) is None
    assert plan_conv_requant(np.array([1]), np.array([4]), "trunc", 128, 1) is None
    assert plan_conv_requant(np.array([3]), np.array([4]), "half_up", 128, 1) is None
    assert plan_conv_requant(np.array([1]), np.array([16]), "half_up", 128, 1) is None  # beyond 2^15
    # at shift 15 a multiplicative tie-break moves values 2^-15 from a boundary too: no exact sigma
    assert plan_conv_requant(np.array([1]), np.array([15]), "half_up", 128, 1) is None
    plan = plan_conv_requant(np.array([4, 1]), np.array([6, 4]), "half_up", 128, 2)
    assert (
        plan is not None and np.all(plan.sigma > np.float32(2.0**-4)) and np.all(plan.sigma < 2.0**-4 * 1.001)
    )
    rng = np.random.default_rng(0)
    op = _conv("c", rng.integers(-128, 128, size=(4, 4, 1, 1)), rng.integers(-500, 500, 4), 6, "half_away")
    prog = _program([op], [_info("x", "int8"), _info("y", "int8")])
    assert "QLinearConv" not in _kinds(prog)
    assert _assert_exact(prog, {"x": rng.integers(-128, 128, size=(1, 4, 5, 5)).astype(np.int8)}) == 1


@pytest.mark.parametrize(
    ("mults", "shift", "mode", "zp_out", "lo", "fused"),
    [
        ([1, 1], 0, "half_up", 0, 0, "QLinearAdd"),  # integer result: no rounding
        ([4, 1], 0, "half_up", 3, -128, "QLinearAdd"),
        ([2, 1], 1, "half_up", 0, 0, "QuantizeLinear"),  # DPU shift_write: rounds
        ([1, 4], 3, "half_up", -7, -128, "QuantizeLinear"),
        ([8, 1], 2, "floor", 1, -128, "QuantizeLinear"),
        ([1, 1], 1, "ceil", 0, -50, "QuantizeLinear"),
        ([1, 2], 2, "half_down", 0, 0, "QuantizeLinear"),
        ([1, 1], 1, "half_even", 3, -128, "QuantizeLinear"),  # odd zero point
        ([1, 2], 1, "half_even", 0, -128, "QuantizeLinear"),
    ],
)
def test_add_every_code_pair(
    mults: list[int], shift: int, mode: str, zp_out: int, lo: int, fused: str
) -> None:
    a = np.arange(-128, 128).reshape(1, 256, 1).repeat(256, axis=2)
    b = a.transpose(0, 2, 1).copy()
    add = Op(
        "add",
        "add",
        ["a", "b"],
        ["y"],
        {"zp_a": 0, "zp_b": -1, "zp_out": zp_out, "lo": lo, "hi": 127, "round_mode": mode},
        {"multiplier": np.array(mults), "shift": np.array([shift])},
    )
    prog = _program([add], [_info("a", "int8"), _info("b", "int8", -1), _info("y", "int8", zp_out)], 2)
    assert fused in _kinds(prog)
    assert _assert_exact(prog, {"a": a.astype(np.int8), "b": b.astype(np.int8)}) == 1
