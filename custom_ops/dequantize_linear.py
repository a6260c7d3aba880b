"""VitisDequantizeLinear: integer codes back to float32, ``y = q * 2^-pos`` (no clamping, like ONNX's)."""

from __future__ import annotations

__all__ = ["VITIS_DEQUANTIZE_LINEAR", "build_function", "reference"]

import logging

import numpy as np
import onnx

from . import grid
from .functions import Body, emit_pow2, make_function
from .schema import BIT_WIDTH, NARROW, POS, SIGNED, ZONNX_DOMAIN, OpDefinition, check_grid

logger = logging.getLogger(__name__)

_DOC = (
    "VitisDequantizeLinear (zonnx): y = float32(q) * 2^-pos for integer codes q of any storage type; "
    "bit_width, signed and narrow record the grid q was quantized on (the body does not clamp)."
)


def build_function(opset: int, overload: str = "") -> onnx.FunctionProto:
    """The single body: Cast to float32, Mul by 2^-pos."""
    body = Body()
    as_float = body.add("Cast", "x", to=onnx.TensorProto.FLOAT)
    inverse = body.add("Reciprocal", emit_pow2(body, body.attr_float("pos")))
    body.rename(body.add("Mul", as_float, inverse), "y")
    return make_function(
        "VitisDequantizeLinear",
        ZONNX_DOMAIN,
        body,
        inputs=["x"],
        outputs=["y"],
        opset=opset,
        required=["pos"],
        defaults={"bit_width": 8, "signed": 1, "narrow": 0},
        overload=overload,
        doc=_DOC,
    )


def reference(q: np.ndarray, *, pos: int, bit_width: int = 8, signed: int = 1, narrow: int = 0) -> np.ndarray:
    """numpy VitisDequantizeLinear: the exact product q * 2^-pos rounded once to float32."""
    del bit_width, signed, narrow  # recorded on the node, not used: dequantization does not clamp
    return grid.dequantize_reference(q, pos)


VITIS_DEQUANTIZE_LINEAR = OpDefinition(
    name="VitisDequantizeLinear",
    doc=_DOC,
    attributes=(BIT_WIDTH, POS, SIGNED, NARROW),
    build=build_function,
    kernel=reference,
    cross_check=check_grid,
)
