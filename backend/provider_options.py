"""The NPU provider's options: strict parsing of ORT-style provider options, VOE spellings, config files.

Options (ORT passes strings; VOE spellings ``cacheDir``, ``cacheKey``, ``configFile`` accepted):
``target`` ("dpu-b4096"), ``cache_dir``, ``cache_key``, ``config_file`` (a JSON object of these options;
keys given directly win), ``executor`` ("auto" | "ort" | "reference"), ``fallback`` ("none" | "cpu"),
``min_nodes`` (2), ``min_macs`` (1000000: a smaller group still goes to the NPU when it has this many
MACs), ``enable_cache`` ("1"), ``strict`` ("0"; "1" makes low NPU coverage an error instead of a warning),
``input_shapes`` ("" or "x:1,3,224,224;y:1,10": fixed input dims, shape arithmetic folded), ``ort_log_level``
("3": ORT's own log severity for the session, 3 = errors only; 2 shows ORT's warnings), ``kernels`` ("auto" |
"native" | "onnx": the native kernel library or the pure-ONNX lowering, ``zonnx.backend.native.loader``).
"""

from __future__ import annotations

__all__ = ["NPU_PROVIDER", "CPU_PROVIDER", "NpuOptions", "parse_provider_options", "provider_table"]

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zonnx.errors import OptionError, did_you_mean

logger = logging.getLogger(__name__)

NPU_PROVIDER = "ZonnxNPUExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
_ALIASES = {"cacheDir": "cache_dir", "cacheKey": "cache_key", "configFile": "config_file"}


@dataclasses.dataclass(frozen=True)
class NpuOptions:
    """The NPU provider's options, parsed strictly (see the module docstring for meanings and defaults)."""

    target: str = "dpu-b4096"
    cache_dir: str = ""
    cache_key: str = ""
    config_file: str = ""
    executor: str = "auto"
    fallback: str = "none"
    min_nodes: int = 2
    min_macs: int = 1_000_000
    enable_cache: bool = True
    strict: bool = False
    input_shapes: str = ""
    ort_log_level: int = 3
    kernels: str = "auto"
    #: The keys the user gave (directly or in config_file); not an option.
    explicit: frozenset[str] = dataclasses.field(default=frozenset(), compare=False)

    def as_strings(self) -> dict[str, str]:
        return {
            k: (str(int(v)) if isinstance(v, bool) else str(v))
            for k, v in dataclasses.asdict(self).items()
            if k != "explicit"
        }

    def shapes(self) -> dict[str, list[int]]:
        """``input_shapes`` as {name: dims} ("x:1,3,224,224;y:1,10")."""
        out: dict[str, list[int]] = {}
        for item in filter(None, (p.strip() for p in self.input_shapes.replace(" ", ";").split(";"))):
            name, sep, dims = item.rpartition(":")
            try:
                out[name] = [int(d) for d in dims.split(",")]
            except ValueError:
                sep = ""
            if not sep or not name:
                raise OptionError(
                    f"provider option input_shapes: {item!r} is not NAME:D1,D2,...; e.g. 'x:1,3,224,224'."
                )
        return out


_CHOICES = {
    "executor": ("auto", "ort", "reference"),
    "fallback": ("none", "cpu"),
    "kernels": ("auto", "native", "onnx"),
}


def _value(key: str, value: Any) -> Any:
    if key in ("min_nodes", "min_macs", "ort_log_level"):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise OptionError(f"provider option {key}: must be an integer, got {value!r}.") from None
    if key in ("enable_cache", "strict"):
        text = str(value).strip().lower()
        if text not in ("0", "1", "true", "false"):
            raise OptionError(f"provider option {key}: must be 0/1/true/false, got {value!r}.")
        return text in ("1", "true")
    text = str(value)
    if key in _CHOICES and text not in _CHOICES[key]:
        raise OptionError(
            f"provider option {key}: must be one of {', '.join(_CHOICES[key])}, got {text!r}."
            + did_you_mean(text, _CHOICES[key])
        )
    return text


def parse_provider_options(options: Mapping[str, Any] | None) -> NpuOptions:
    """Strict parse: unknown keys get a "did you mean"; ``config_file`` entries fill keys not given."""
    known = {f.name for f in dataclasses.fields(NpuOptions)} - {"explicit"}
    given: dict[str, Any] = {}
    for raw, value in (options or {}).items():
        key = _ALIASES.get(raw, raw)
        if key not in known:
            raise OptionError(
                f"unknown {NPU_PROVIDER} option {raw!r}.{did_you_mean(raw, [*known, *_ALIASES])} "
                f"Known options: {', '.join(sorted(known))} (VOE spellings cacheDir, cacheKey accepted)."
            )
        given[key] = _value(key, value)
    if given.get("config_file"):
        path = Path(given["config_file"]).expanduser()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise OptionError(
                f"config_file {path}: cannot be read as JSON ({e}); fix the path or the file."
            ) from None
        if not isinstance(data, dict):
            raise OptionError(f"config_file {path}: must hold a JSON object of provider options.")
        for raw, value in data.items():
            key = _ALIASES.get(raw, raw)
            if key in known and key != "config_file" and key not in given:
                given[key] = _value(key, value)
            elif key not in known:
                logger.debug("config_file %s: key %r is not a zonnx option; ignored", path, raw)
    opts = NpuOptions(**given, explicit=frozenset(given))
    opts.shapes()  # refuse a malformed input_shapes now
    return opts


def provider_table(
    providers: Sequence[Any] | None, options: Sequence[Mapping[str, Any]] | None
) -> dict[str, dict]:
    """Provider name -> its options, in order (ORT's forms: names + parallel options, or (name, dict) pairs)."""
    providers = list(providers) if providers is not None else [NPU_PROVIDER, CPU_PROVIDER]
    options = list(options) if options is not None else []
    if options and len(options) != len(providers):
        raise OptionError(
            f"provider_options has {len(options)} entries for {len(providers)} providers; give one dict per provider."
        )
    out: dict[str, dict] = {}
    for i, p in enumerate(providers):
        name, opts = (p[0], dict(p[1])) if isinstance(p, tuple | list) else (p, {})
        if options:
            opts.update(options[i] or {})
        if name not in (NPU_PROVIDER, CPU_PROVIDER):
            choices = [NPU_PROVIDER, CPU_PROVIDER]
            raise OptionError(
                f"unknown provider {name!r}.{did_you_mean(str(name), choices)} Available: {', '.join(choices)}."
            )
        out[name] = opts
    return out
