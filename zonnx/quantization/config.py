"""Resolve ``quantize_static``'s arguments into one frozen ``QuantConfig``, plus config-file overrides.

Config files (TOML or JSON) follow Compass's per-layer ``opt_config`` idea: global keys, then
per-op-type and per-node overrides that win over the global ones::

    method = "entropy"            # activation calibration method
    weight_method = "minmax"
    activation_type = "uint8"
    weight_type = "int8"
    per_channel = true
    format = "qdq"
    [op_types.Softmax]
    activation_type = "uint16"
    [nodes."Conv_12"]
    exclude = true
"""

from __future__ import annotations

__all__ = [
    "QuantConfig",
    "resolve_format",
    "resolve_method",
    "resolve_type",
    "load_config_file",
    "check_float8",
    "warn_u8s8",
]

import dataclasses
import json
import logging
import tomllib
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from zonnx.errors import OptionError, did_you_mean
from zonnx.quantization.enums import (
    FORMAT_NAMES,
    METHOD_NAMES,
    TYPE_NAMES,
    CalibrationMethod,
    PowerOfTwoMethod,
    QuantFormat,
    QuantType,
    VitisQuantFormat,
    ZonnxCalibrationMethod,
    ZonnxQuantType,
)
from zonnx.quantization.options import ExtraOptions

logger = logging.getLogger(__name__)

_QT_NAMES = {
    QuantType.QInt8: "int8",
    QuantType.QUInt8: "uint8",
    QuantType.QInt16: "int16",
    QuantType.QUInt16: "uint16",
    QuantType.QInt4: "int4",
    QuantType.QUInt4: "uint4",
    ZonnxQuantType.BFloat16: "bfloat16",
    QuantType.QFLOAT8E4M3FN: "float8e4m3fn",
}


def _by_name(value: Any, names: Mapping[str, Enum], what: str) -> Enum:
    if isinstance(value, Enum):
        return value
    if isinstance(value, str) and value.lower().replace("_", "").replace("-", "") in names:
        return names[value.lower().replace("_", "").replace("-", "")]
    raise OptionError(
        f"{what} {value!r} is not known.{did_you_mean(str(value).lower(), names)} "
        f"Use one of: {', '.join(names)}."
    )


def resolve_format(value: Any) -> QuantFormat | VitisQuantFormat:
    fmt = _by_name(value, FORMAT_NAMES, "quant_format")
    if not isinstance(fmt, QuantFormat | VitisQuantFormat):
        raise OptionError(
            f"quant_format {value!r}: use QuantFormat.QDQ/QOperator or VitisQuantFormat.QDQ/FixNeuron."
        )
    return fmt


def resolve_method(value: Any, what: str = "calibrate_method") -> Enum:
    method = _by_name(value, METHOD_NAMES, what)
    if not isinstance(method, CalibrationMethod | PowerOfTwoMethod | ZonnxCalibrationMethod):
        raise OptionError(
            f"{what} {value!r}: use a CalibrationMethod, PowerOfTwoMethod or ZonnxCalibrationMethod."
        )
    return method


#: ``onnx.TensorProto`` element types ORT's call also takes for activation_type / weight_type.
_TENSORPROTO_TYPES = {
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    21: "uint4",
    22: "int4",
    17: "float8e4m3fn",
}
#: Types ORT quantizes to that zonnx refuses (with the reason).
_UNSUPPORTED_TYPES: dict[Any, str] = {}


def resolve_type(value: Any, what: str) -> str:
    """QuantType (ORT's enum), ZonnxQuantType, an onnx.TensorProto type int or a name -> 'int8', ...

    ORT's call takes ``onnx.TensorProto.UINT8`` and the like as well as ``QuantType`` members.
    """
    if isinstance(value, int) and not isinstance(value, bool | Enum):
        if value in _TENSORPROTO_TYPES:
            return _TENSORPROTO_TYPES[value]
        if value in _UNSUPPORTED_TYPES:
            raise OptionError(f"{what} {value}: {_UNSUPPORTED_TYPES[value]}; use an integer type.")
        raise OptionError(
            f"{what} {value} is not an integer onnx.TensorProto type zonnx quantizes to; use one of "
            f"{', '.join(f'{v} ({k})' for k, v in _TENSORPROTO_TYPES.items())} or a QuantType."
        )
    if isinstance(value, Enum) and value.name in _UNSUPPORTED_TYPES:
        raise OptionError(f"{what} {value}: {_UNSUPPORTED_TYPES[value.name]}; use an integer QuantType.")
    qt = _by_name(value, TYPE_NAMES, what)
    if qt not in _QT_NAMES:
        raise OptionError(f"{what} {value!r} is not supported by zonnx; use one of {', '.join(TYPE_NAMES)}.")
    return _QT_NAMES[qt]


@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """Everything the quantizer needs, resolved and validated (see ``quantize_static`` for meanings)."""

    quant_format: QuantFormat | VitisQuantFormat = QuantFormat.QDQ
    activation_type: str = "int8"
    weight_type: str = "int8"
    calibrate_method: Enum = CalibrationMethod.MinMax
    weight_method: str = "minmax"
    per_channel: bool = False
    reduce_range: bool = False
    op_types_to_quantize: tuple[str, ...] = ()
    nodes_to_quantize: tuple[str, ...] = ()
    nodes_to_exclude: tuple[str, ...] = ()
    input_nodes: tuple[str, ...] = ()
    output_nodes: tuple[str, ...] = ()
    use_external_data_format: bool = False
    extra: ExtraOptions = dataclasses.field(default_factory=ExtraOptions)
    op_type_overrides: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    node_overrides: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def power_of_two(self) -> bool:
        return isinstance(self.calibrate_method, PowerOfTwoMethod) or isinstance(
            self.quant_format, VitisQuantFormat
        )

    def __post_init__(self) -> None:
        if self.power_of_two and self.per_channel:
            raise OptionError(
                "per_channel=True cannot be combined with power-of-two quantization "
                f"({self.calibrate_method.name if isinstance(self.calibrate_method, Enum) else self.calibrate_method}, "
                f"{getattr(self.quant_format, 'name', self.quant_format)}): DPU-style targets use one position per "
                "tensor. Use per_channel=False, or a float-scale method such as CalibrationMethod.MinMax."
            )
        if self.quant_format == QuantFormat.QOperator and (self.activation_type, self.weight_type) not in {
            ("uint8", "int8"),
            ("int8", "int8"),
            ("uint8", "uint8"),
            (
                "float8e4m3fn",
                "float8e4m3fn",
            ),  # no float8 integer kernel: ops stay DQ -> op -> Q (check_float8)
        }:
            raise OptionError(
                f"QuantFormat.QOperator supports 8-bit types only (got activations {self.activation_type}, "
                f"weights {self.weight_type}); use QuantFormat.QDQ for 16-bit or 4-bit types."
            )
        if (
            "bfloat16" in (self.activation_type, self.weight_type)
            and self.activation_type != self.weight_type
        ):
            raise OptionError(
                "bfloat16 applies to activations and weights together: set both types to bfloat16."
            )


_FILE_KEYS = {
    "method",
    "weight_method",
    "activation_type",
    "weight_type",
    "per_channel",
    "format",
    "reduce_range",
    "op_types",
    "nodes",
    "nodes_to_exclude",
    "extra_options",
    "target",
}
_OVERRIDE_KEYS = {"activation_type", "weight_type", "exclude"}


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML or JSON quantization config and validate its keys."""
    p = Path(path)
    if not p.is_file():
        raise OptionError(f"{p}: config file not found.")
    try:
        data = tomllib.loads(p.read_text()) if p.suffix.lower() == ".toml" else json.loads(p.read_text())
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise OptionError(
            f"{p}: not valid {'TOML' if p.suffix.lower() == '.toml' else 'JSON'} ({e})."
        ) from None
    for key in data:
        if key not in _FILE_KEYS:
            raise OptionError(
                f"{p}: unknown key {key!r}.{did_you_mean(key, _FILE_KEYS)} "
                f"Known keys: {', '.join(sorted(_FILE_KEYS))}."
            )
    for section in ("op_types", "nodes"):
        for name, override in data.get(section, {}).items():
            for key in override:
                if key not in _OVERRIDE_KEYS:
                    raise OptionError(
                        f"{p}: [{section}.{name}] unknown key {key!r}.{did_you_mean(key, _OVERRIDE_KEYS)} "
                        f"Known keys: {', '.join(sorted(_OVERRIDE_KEYS))}."
                    )
    return data


def check_float8(cfg: QuantConfig) -> None:
    """ORT's float8 rules: activations and weights both E4M3FN, calibrated with Distribution; zonnx adds
    what it does not implement for float8 (per-channel, reduce_range, targets, power-of-two formats)."""
    if cfg.extra.calib_scenario not in ("same", "p3"):
        raise OptionError(f"extra_options['scenario'] = {cfg.extra.calib_scenario!r}: use 'same' or 'p3'.")
    if cfg.extra.calib_scenario != "same":
        logger.warning(
            "extra_options['scenario'] = %r: ORT's quantize_static does not pass this key to its calibrator, "
            "so float8 scales come from the 'same' scenario there and here as well.",
            cfg.extra.calib_scenario,
        )
    types = (cfg.activation_type, cfg.weight_type)
    if "float8e4m3fn" not in types:
        return
    if types != ("float8e4m3fn", "float8e4m3fn"):
        raise OptionError(
            f"activation_type {types[0]} with weight_type {types[1]}: float8 needs both to be "
            "QuantType.QFLOAT8E4M3FN (ORT's rule)."
        )
    if cfg.calibrate_method is not CalibrationMethod.Distribution:
        raise OptionError(
            "float8 types are calibrated with calibrate_method=CalibrationMethod.Distribution only (ORT's rule)."
        )
    if not isinstance(cfg.quant_format, QuantFormat):
        raise OptionError(f"float8 types: use quant_format QuantFormat.QDQ (got {cfg.quant_format}).")
    logger.warning(
        "float8 model: ONNX Runtime's CPU provider fuses DequantizeLinear -> MatMul -> QuantizeLinear into "
        "QLinearMatMul, which has no float8 kernel, so the model loads there only with graph optimizations "
        "off (SessionOptions.graph_optimization_level = ORT_DISABLE_ALL); ORT's own float8 model does the same."
    )
    if cfg.quant_format == QuantFormat.QOperator:
        logger.warning(
            "QuantFormat.QOperator with float8 types: ONNX Runtime's CPU provider has no float8 operator "
            "kernels, so the quantized ops are written as DequantizeLinear -> op -> QuantizeLinear."
        )
    for flag, why in (
        (cfg.per_channel, "per_channel=True"),
        (cfg.reduce_range, "reduce_range=True"),
        (bool(cfg.extra.target), "a Target"),
        (bool(cfg.extra.block_size), "BlockSize"),
    ):
        if flag:
            raise OptionError(f"float8 types: {why} is not supported with float8; remove it.")


def warn_u8s8(cfg: QuantConfig) -> None:
    """One line when the output is a u8 x s8 model for ORT's CPU provider (saturating without VNNI)."""
    if cfg.power_of_two or cfg.reduce_range or (cfg.activation_type, cfg.weight_type) != ("uint8", "int8"):
        return
    from zonnx.hostcpu import host_int

    host = host_int()
    here = (
        f"this host ({host.isa}) is one of them" if not host.u8s8_exact else f"this host ({host.isa}) is not"
    )
    logger.warning(
        "uint8 activations with int8 weights: ONNX Runtime's CPU provider runs such models with saturating "
        "16-bit arithmetic on x86 CPUs without VNNI (%s); to avoid it use activation_type int8 "
        "(--activation-type int8) or reduce_range=True (7-bit weights).",
        here,
    )
