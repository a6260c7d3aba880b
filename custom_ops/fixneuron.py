"""FixNeuron: power-of-two fake quantization, ``y = round_mode(clamp(x * 2^pos, qmin, qmax)) * 2^-pos``."""

from __future__ import annotations

__all__ = ["FIXNEURON", "build_function", "reference"]

import logging

import numpy as np
import onnx

from . import grid
from .functions import Body, emit_code, emit_inverse, make_function
from .schema import BIT_WIDTH, NARROW, POS, ROUND_MODE, SIGNED, ZONNX_DOMAIN, OpDefinition, check_grid

logger = logging.getLogger(__name__)

_DOC = (
    "FixNeuron (zonnx): y = round_mode(clamp(x * 2^pos, qmin, qmax)) * 2^-pos, float32 in and out; "
    "qmin, qmax = -2^(bw-1) + narrow, 2^(bw-1) - 1 if signed else 0, 2^bw - 1."
)


def build_function(opset: int, overload: str = "half_even") -> onnx.FunctionProto:
    """The body for one rounding mode: Mul, Clip, rounding (1 to 7 ops), Mul by 2^-pos."""
    body = Body()
    code = emit_code(body, "x", overload)
    body.rename(body.add("Mul", code, emit_inverse(body, overload)), "y")
    return make_function(
        "FixNeuron",
        ZONNX_DOMAIN,
        body,
        inputs=["x"],
        outputs=["y"],
        opset=opset,
        required=["pos"],
        defaults={"bit_width": 8, "signed": 1, "narrow": 0, "round_mode": overload},
        overload=overload,
        doc=f"{_DOC} This body: round_mode={overload}.",
    )


def reference(
    x: np.ndarray,
    *,
    pos: int,
    bit_width: int = 8,
    signed: int = 1,
    narrow: int = 0,
    round_mode: str = "half_even",
) -> np.ndarray:
    """numpy FixNeuron: float32 codes of ``grid.code_reference`` times 2^-pos (exact, rounded once)."""
    codes = grid.code_reference(
        x, bit_width=bit_width, pos=pos, signed=signed, narrow=narrow, round_mode=round_mode
    )
    return grid.dequantize_reference(codes, pos)


FIXNEURON = OpDefinition(
    name="FixNeuron",
    doc=_DOC,
    attributes=(BIT_WIDTH, POS, SIGNED, NARROW, ROUND_MODE),
    build=build_function,
    kernel=reference,
    overload_attr="round_mode",
    cross_check=check_grid,
)
