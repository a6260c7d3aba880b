"""Enums users pass to ``quantize_static``: ORT's own objects, vai_q_onnx's additions, and zonnx's methods.

ORT's ``QuantFormat``, ``QuantType`` and ``CalibrationMethod`` are re-exported unchanged, so code
that imports them from ``onnxruntime.quantization`` passes the very same objects to zonnx.
"""

from __future__ import annotations

__all__ = [
    "QuantFormat",
    "QuantType",
    "CalibrationMethod",
    "VitisQuantFormat",
    "PowerOfTwoMethod",
    "ZonnxCalibrationMethod",
    "ZonnxQuantType",
    "FORMAT_NAMES",
    "METHOD_NAMES",
    "TYPE_NAMES",
]

from enum import Enum

from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType


class VitisQuantFormat(Enum):
    """vai_q_onnx's formats: ``QDQ`` = separate VitisQuantizeLinear/VitisDequantizeLinear, ``FixNeuron`` = one op."""

    QDQ = 2
    FixNeuron = 3


class PowerOfTwoMethod(Enum):
    """vai_q_onnx's power-of-two calibration: ``NonOverflow`` (no saturation) and ``MinMSE`` (least squared error)."""

    NonOverflow = 0
    MinMSE = 1


class ZonnxCalibrationMethod(Enum):
    """Calibration methods zonnx adds: MSE search, Compass ``mean`` (EMA) and ``Nstd``, TPU-MLIR KLD."""

    MovingAverageMinMax = 10
    MSE = 11
    CompassMean = 12
    NStd = 13
    KLD = 14


class ZonnxQuantType(Enum):
    """Types beyond ORT's QuantType: ``BFloat16`` rounds tensors to bfloat16 (a cast pair, no scale)."""

    BFloat16 = 100


#: Names accepted on the command line and in config files (case-insensitive) -> enum member.
FORMAT_NAMES = {
    "qdq": QuantFormat.QDQ,
    "qoperator": QuantFormat.QOperator,
    "fixneuron": VitisQuantFormat.FixNeuron,
    "vitisqdq": VitisQuantFormat.QDQ,
}
METHOD_NAMES = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
    "distribution": CalibrationMethod.Distribution,
    "nonoverflow": PowerOfTwoMethod.NonOverflow,
    "minmse": PowerOfTwoMethod.MinMSE,
    "movingaverage": ZonnxCalibrationMethod.MovingAverageMinMax,
    "mse": ZonnxCalibrationMethod.MSE,
    "mean": ZonnxCalibrationMethod.CompassMean,
    "nstd": ZonnxCalibrationMethod.NStd,
    "kld": ZonnxCalibrationMethod.KLD,
}
TYPE_NAMES = {
    "int8": QuantType.QInt8,
    "uint8": QuantType.QUInt8,
    "int16": QuantType.QInt16,
    "uint16": QuantType.QUInt16,
    "int4": QuantType.QInt4,
    "uint4": QuantType.QUInt4,
    "bfloat16": ZonnxQuantType.BFloat16,
    "float8e4m3fn": QuantType.QFLOAT8E4M3FN,
}
