"""NPU target descriptions: one TOML data file per target, loaded into one frozen ``Target`` every check reads.

A target file (``backend/targets/<name>.toml`` for bundled targets, or any path) has four parts; every
key is checked (unknown key: error with a suggestion; wrong type or missing required key: error naming
the file and the dotted key):

- top level: ``name`` (required), ``description``, ``family`` ("dpu", "zhouyi", "tpu", ...), ``aliases``.
- ``[quant]`` (``QuantRules``), what the quantizer and the refinement passes must respect: ``scale``
  ("power_of_two" or "float"), activation/weight dtypes, symmetry, granularity, narrow range and
  rounding modes, ``bias_bits``; ``[quant.requant]`` (shift-only or integer multiplier + shift, its bit
  widths, per-channel, rounding, ``bias_effective_bits``); ``[quant.lut]`` (nonlinear ops by lookup
  table, ``items_in_bits``). Optional rule tables, each enabling one refinement pass: ``[quant.align]``
  (Concat and pool ops share one position/scale), ``[quant.shift_cut]``, ``[quant.shift_bias]``,
  ``[quant.eltwise]`` (shift_read/shift_write, equal input scales), ``[quant.sigmoid]``,
  ``[quant.leaky_relu]`` (slopes k/denominator), ``[quant.avgpool]`` (multiply+shift factors).
- ``[ops.<kind>]`` (``OpLimits``), the operator capability table for the partitioner: which ONNX op
  types the kind covers (``onnx``, ``group`` one/depthwise), kernel/stride/dilation/pad/channel limits
  and the fused activations. Limits that depend on the hardware read ``hardware.channel_parallel``,
  ``bank_depth`` and ``bank_num`` (e.g. ``kw*kh*ceil(ic/channel_parallel) <= weight_buffer_depth``).
- ``[hardware]`` (``Hardware``), numbers for the profiler: clock, MACs per cycle and their parallelism,
  on-chip memories, DDR bandwidth; ``assumed`` lists the fields that are assumptions, not documented.

Public API: ``load_target(name_or_path)``, ``known_targets()``, ``Target`` and its parts.
"""

from __future__ import annotations

__all__ = [
    "Target",
    "QuantRules",
    "Requant",
    "Lut",
    "Align",
    "ShiftCut",
    "ShiftBias",
    "Eltwise",
    "SigmoidLimits",
    "LeakyReluSlope",
    "AvgPoolFactor",
    "OpLimits",
    "Hardware",
    "load_target",
    "known_targets",
    "TARGETS_DIR",
]

import dataclasses
import functools
import logging
import math
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from zonnx.errors import OptionError, did_you_mean

from .schema import (
    ROUND_ALIASES,
    ROUND_MODES,
    Align,
    AvgPoolFactor,
    Eltwise,
    Hardware,
    IntRange,
    LeakyReluSlope,
    Lut,
    OpLimits,
    QuantRules,
    Requant,
    RoundMode,
    ShiftBias,
    ShiftCut,
    SigmoidLimits,
    Target,
)

logger = logging.getLogger(__name__)

#: Folder of the bundled target files.
TARGETS_DIR = Path(__file__).resolve().parent


class _Bad(Exception):
    """A schema violation at a dotted key; turned into an OptionError naming the file."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"key {key!r} {message}")


def _type_name(tp: Any) -> str:
    names = {
        int: "an integer",
        float: "a number",
        bool: "true or false",
        str: "a string",
        RoundMode: "a rounding mode",
    }
    if tp in names:
        return names[tp]
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_type_name(args[0]).split(' ', 1)[-1]}s"
        return f"a list of {len(args)} {_type_name(args[0]).split(' ', 1)[-1]}s"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return str(tp)


def _convert(tp: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and return it in the dataclass's form."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(inner[0], value, key)
    if tp is RoundMode:
        if not isinstance(value, str) or (value not in ROUND_MODES and value not in ROUND_ALIASES):
            choices = sorted(ROUND_MODES | set(ROUND_ALIASES))
            raise _Bad(
                key,
                f"must be a rounding mode ({', '.join(sorted(ROUND_MODES))}), got {value!r}."
                + did_you_mean(str(value), choices),
            )
        return RoundMode(ROUND_ALIASES.get(value, value))
    if tp is bool:
        if not isinstance(value, bool):
            raise _Bad(key, f"must be true or false, got {value!r}.")
        return value
    if tp in (int, float, str):
        ok = (
            isinstance(value, str)
            if tp is str
            else (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and (tp is float or isinstance(value, int))
            )
        )
        if not ok:
            raise _Bad(key, f"must be {_type_name(tp)}, got {value!r}.")
        return tp(value)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise _Bad(
                key,
                f"must be {_type_name(tp)}, got {value!r}."
                + did_you_mean(str(value), map(str, typing.get_args(tp))),
            )
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, list):
            raise _Bad(key, f"must be {_type_name(tp)}, got {value!r}.")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise _Bad(key, f"must be {_type_name(tp)}, got {value!r}.")
        items = tuple(_convert(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
        if tp == IntRange and items[0] > items[1]:
            raise _Bad(key, f"is a range [low, high] and needs low <= high, got {value!r}.")
        return items
    if origin is Mapping:
        if not isinstance(value, dict):
            raise _Bad(key, f"must be a table, got {value!r}.")
        item_type = typing.get_args(tp)[1]
        return types.MappingProxyType({k: _convert(item_type, v, f"{key}.{k}") for k, v in value.items()})
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _Bad(key, f"must be a table, got {value!r}.")
        return _build(tp, value, key)
    raise TypeError(f"unsupported annotation {tp!r} at {key}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The resolved field annotations of dataclass ``cls`` (resolving them is most of a target's load time)."""
    return typing.get_type_hints(cls)


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    """Instantiate dataclass ``cls`` from a TOML table, key by key."""
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "path"}
    dot = f"{prefix}." if prefix else ""
    for key in data:
        if key not in fields:
            raise _Bad(
                f"{dot}{key}",
                "is not known here"
                + (f" (known: {', '.join(fields)})." if len(fields) < 12 else ".")
                + did_you_mean(key, fields),
            )
    kwargs = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], f"{dot}{name}")
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise _Bad(f"{dot}{name}", f"is required ({_type_name(hints[name])}).")
    return cls(**kwargs)


#: Allowed range of every ``[hardware]`` number (inclusive); a field not listed here must be > 0.
HARDWARE_RANGES: dict[str, tuple[float, float]] = {
    "clock_mhz": (1.0, 100_000.0),
    "accumulator_bits": (8, 64),
    "ddr_bandwidth_gbps": (0.001, 100_000.0),
}


def _check_hardware(hw: Hardware) -> None:
    """Every hardware number is finite and inside its range (``HARDWARE_RANGES``, else > 0)."""
    for f in dataclasses.fields(Hardware):
        value = getattr(hw, f.name)
        if f.name == "assumed" or value is None:
            continue
        lo, hi = HARDWARE_RANGES.get(f.name, (1 if isinstance(value, int) else 1e-12, math.inf))
        if not math.isfinite(float(value)) or not lo <= value <= hi:
            bounds = f"from {lo:g} to {hi:g}" if math.isfinite(hi) else f"at least {lo:g}"
            raise _Bad(f"hardware.{f.name}", f"is {value!r}; it must be {bounds}.")


def _check_mac_array(hw: Hardware) -> None:
    """A MAC array given by all three parallel factors has ``macs_per_cycle`` equal to their product (the
    profiler then costs layers by the factors; a disagreeing ``macs_per_cycle`` would be silently unused)."""
    factors = (hw.pixel_parallel, hw.input_channel_parallel, hw.output_channel_parallel)
    if all(factors) and math.prod(factors) != hw.macs_per_cycle:
        raise _Bad(
            "hardware.macs_per_cycle",
            f"is {hw.macs_per_cycle}, but pixel x input channel x output channel parallel is "
            f"{' x '.join(map(str, factors))} = {math.prod(factors)}; make them agree.",
        )


def _check(target: Target) -> None:
    """Rules across keys."""
    _check_hardware(target.hardware)
    _check_mac_array(target.hardware)
    known = {f.name for f in dataclasses.fields(Hardware)} - {"assumed"}
    for i, name in enumerate(target.hardware.assumed):
        if name not in known:
            raise _Bad(
                f"hardware.assumed[{i}]",
                f"names {name!r}, which is not a hardware key." + did_you_mean(name, known),
            )
    for kind, limits in target.ops.items():
        if limits.lower_to is not None and limits.lower_to not in target.ops:
            raise _Bad(
                f"ops.{kind}.lower_to",
                f"names {limits.lower_to!r}, which is not in the op table."
                + did_you_mean(limits.lower_to, target.ops),
            )


def known_targets() -> list[str]:
    """Names of the bundled targets (their file stems)."""
    return sorted(p.stem for p in TARGETS_DIR.glob("*.toml"))


def _resolve(name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    as_path = Path(text).expanduser()
    if isinstance(name_or_path, Path) or text.endswith(".toml") or "/" in text or as_path.is_file():
        if not as_path.is_file():
            raise OptionError(
                f"{as_path}: no such target file; give a bundled target name "
                f"({', '.join(known_targets())}) or the path of a .toml file."
            )
        return as_path
    bundled = TARGETS_DIR / f"{text}.toml"
    if bundled.is_file():
        return bundled
    for stem in known_targets():
        if text in _load_file(TARGETS_DIR / f"{stem}.toml").aliases:
            return TARGETS_DIR / f"{stem}.toml"
    raise OptionError(
        f"unknown target {text!r}.{did_you_mean(text, known_targets())} "
        f"Known targets: {', '.join(known_targets())}; or give the path of a .toml file."
    )


@functools.lru_cache(maxsize=32)
def _load_cached(path: Path, mtime_ns: int) -> Target:
    del mtime_ns  # part of the cache key: an edited file is read again
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise OptionError(f"{path}: not valid TOML ({e}); fix the file.") from None
    except (OSError, UnicodeDecodeError) as e:
        raise OptionError(f"{path}: cannot be read ({e}).") from None
    try:
        target = _build(Target, data, "")
        _check(target)
    except _Bad as e:
        raise OptionError(f"{path}: {e}") from None
    target = dataclasses.replace(target, path=path)
    logger.debug("loaded target %s from %s", target.name, path)
    return target


def _load_file(path: Path) -> Target:
    return _load_cached(path.resolve(), path.stat().st_mtime_ns)


def load_target(name_or_path: str | Path | Target) -> Target:
    """Load a bundled target by name (or alias) or a user's ``.toml`` file; a Target is returned as is.

    Errors (OptionError): an unknown name lists the known targets; a malformed file names the file and
    the dotted key (unknown key with a suggestion, wrong type, missing required key).
    """
    if isinstance(name_or_path, Target):
        return name_or_path
    return _load_file(_resolve(name_or_path))
