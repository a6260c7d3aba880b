"""VitisQuantizeLinear: power-of-two quantization to integer codes, ``q = round_mode(clamp(x * 2^pos))``."""

from __future__ import annotations

__all__ = ["VITIS_QUANTIZE_LINEAR", "OUTPUT_DTYPE", "build_function", "reference"]

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from zonnx.errors import OptionError

from . import grid
from .functions import Body, emit_code, make_function
from .schema import (
    BIT_WIDTH,
    NARROW,
    POS,
    ROUND_MODE,
    SIGNED,
    ZONNX_DOMAIN,
    AttrSpec,
    OpDefinition,
    check_grid,
)

logger = logging.getLogger(__name__)

_DOC = (
    "VitisQuantizeLinear (zonnx): q = Cast(round_mode(clamp(x * 2^pos, qmin, qmax)), to=output_dtype); "
    "float32 in, integer codes out; output_dtype defaults to (u)int8 up to 8 bits, (u)int16 up to 16, "
    "int32 above."
)

#: The storage type is an attribute the body's Cast reads through ref_attr_name (ORT 1.31, onnx's checker,
#: shape inference and ReferenceEvaluator all resolve it); make_node derives it from bit_width and signed.
OUTPUT_DTYPE = AttrSpec(
    "output_dtype",
    int,
    onnx.TensorProto.INT8,
    "ONNX integer type of the codes: INT8=3, UINT8=2, INT16=5, UINT16=4, INT32=6",
    derive=lambda attrs: grid.default_storage(int(attrs["bit_width"]), int(attrs["signed"])),
)


def _cross_check(attrs: Mapping[str, Any], where: str) -> None:
    """The grid rule plus: the storage type holds every code."""
    check_grid(attrs, where)
    qmin, qmax = grid.qrange(int(attrs["bit_width"]), int(attrs["signed"]), int(attrs["narrow"]))
    dtype = int(attrs["output_dtype"])
    if not grid.storage_holds(dtype, qmin, qmax):
        name = onnx.TensorProto.DataType.Name(dtype) if dtype in onnx.TensorProto.DataType.values() else dtype
        best = onnx.TensorProto.DataType.Name(
            grid.default_storage(int(attrs["bit_width"]), int(attrs["signed"]))
        )
        raise OptionError(
            f"{where}: output_dtype {name} cannot hold codes [{qmin}, {qmax}]; use {best} "
            "(or leave output_dtype out to get it)."
        )


def build_function(opset: int, overload: str = "half_even") -> onnx.FunctionProto:
    """The body for one rounding mode: Mul, Clip, rounding, Cast(to=@output_dtype)."""
    body = Body()
    code = emit_code(body, "x", overload)
    cast = body.add("Cast", code, to=onnx.TensorProto.INT8)
    body.nodes[-1].attribute[0].ref_attr_name = "output_dtype"
    body.rename(cast, "y")
    return make_function(
        "VitisQuantizeLinear",
        ZONNX_DOMAIN,
        body,
        inputs=["x"],
        outputs=["y"],
        opset=opset,
        required=["pos"],
        defaults={
            "bit_width": 8,
            "signed": 1,
            "narrow": 0,
            "round_mode": overload,
            "output_dtype": onnx.TensorProto.INT8,
        },
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
    output_dtype: int | None = None,
) -> np.ndarray:
    """numpy VitisQuantizeLinear: ``grid.code_reference`` stored as output_dtype (NaN gives 0)."""
    codes = grid.code_reference(
        x, bit_width=bit_width, pos=pos, signed=signed, narrow=narrow, round_mode=round_mode
    )
    dtype = grid.default_storage(bit_width, signed) if output_dtype is None else output_dtype
    return np.where(np.isnan(codes), 0.0, codes).astype(grid.STORAGE_TYPES[dtype])


VITIS_QUANTIZE_LINEAR = OpDefinition(
    name="VitisQuantizeLinear",
    doc=_DOC,
    attributes=(BIT_WIDTH, POS, SIGNED, NARROW, ROUND_MODE, OUTPUT_DTYPE),
    build=build_function,
    kernel=reference,
    overload_attr="round_mode",
    cross_check=_cross_check,
)
