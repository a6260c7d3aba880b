"""``zonnx quantize``'s command-line values turned into ``quantize_static`` options, and their checks."""

from __future__ import annotations

__all__ = [
    "parse_floats",
    "parse_extra",
    "target_defaults",
    "generic_defaults",
    "calib_file",
    "fold_fast_finetune",
    "check_search_flags",
]

import json
from pathlib import Path
from typing import Any

from zonnx.errors import OptionError


def parse_floats(value: str | None, what: str) -> tuple[float, ...] | None:
    """Comma-separated numbers (``--mean``, ``--scale``, ``--size``); None when not given."""
    if value is None:
        return None
    try:
        return tuple(float(v) for v in value.split(","))
    except ValueError:
        raise OptionError(
            f"{what} {value!r}: give comma-separated numbers, e.g. 0.485,0.456,0.406."
        ) from None


def parse_extra(values: list[str] | None) -> dict[str, Any]:
    """``--extra KEY=VALUE`` items as extra_options: VALUE as JSON when it parses, else the string."""
    out: dict[str, Any] = {}
    for item in values or ():
        key, sep, raw = item.partition("=")
        if not sep:
            raise OptionError(f"--extra {item!r}: write it as KEY=VALUE, e.g. ActivationSymmetric=true.")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def target_defaults(target: str | None) -> dict:
    """The scheme a target accepts (``target_quantize_kwargs``) as CLI option values; options given win."""
    if not target:
        return {}
    from zonnx.build_npu import target_quantize_kwargs

    out = dict(target_quantize_kwargs(str(target)))
    for key in ("quant_format", "calibrate_method"):
        if key in out:
            out[key] = out[key].name.lower()
    out["extra_options"] = {k: v for k, v in out.get("extra_options", {}).items() if k != "Target"}
    return out


def generic_defaults(tdef: dict, fmt: str) -> dict[str, Any]:
    """Without a target, the CLI quantizes only what integer kernels read (QDQ output only)."""
    if tdef or str(fmt).lower() != "qdq":
        return {}
    return {"QuantPlacement": "kernels"}


def calib_file(calib: str | None) -> Path | None:
    """The file behind --calib (an array file, or the Python file of FILE.py:FUNC); None for a folder."""
    if not calib:
        return None
    if Path(calib).is_file():
        return Path(calib)
    head = calib.rsplit(":", 1)[0] if ":" in calib else ""
    return Path(head) if head and Path(head).is_file() else None


def fold_fast_finetune(extra_options: dict[str, Any], algorithm: str | None, iters: int | None) -> None:
    """Fold --fast-finetune/--fast-finetune-iters into extra_options (IncludeFastFT, FastFinetune)."""
    if algorithm is None:
        if iters is not None:
            raise OptionError("--fast-finetune-iters needs --fast-finetune adaround or adaquant.")
        return
    if algorithm.lower() not in ("adaround", "adaquant"):
        raise OptionError(f"--fast-finetune {algorithm!r}: use adaround or adaquant.")
    ft = dict(extra_options.get("FastFinetune") or {})
    ft["OptimAlgorithm"] = algorithm.lower()
    if iters is not None:
        ft["NumIterations"] = iters
    extra_options.update(IncludeFastFT=True, FastFinetune=ft)


def check_search_flags(
    accuracy_budget: float | None,
    *,
    eval_data: Any,
    metric: str,
    strict: bool,
    input_shape: Any,
    search_samples: int | None,
    search_order: str,
    range_search: bool,
    search_bias_correction: str,
    search_thresholds: str,
    search_finetune: str,
    search_finetune_seconds: float | None,
) -> None:
    """Rule: the search's flags go with ``--accuracy-budget``, and each try/off flag is try or off."""
    if accuracy_budget is None and (
        eval_data or metric != "cosine" or strict or input_shape or search_samples or search_order != "report"
    ):
        raise OptionError(
            "--metric, --eval, --strict, --input-shape, --search-samples and --search-order go with "
            "--accuracy-budget; add it or drop them."
        )
    if accuracy_budget is None and range_search:
        raise OptionError("--range-search goes with --accuracy-budget; add it or drop --range-search.")
    for flag, value in (
        ("--search-bias-correction", search_bias_correction),
        ("--search-thresholds", search_thresholds),
        ("--search-finetune", search_finetune),
    ):
        if value not in ("try", "off"):
            raise OptionError(f"{flag} {value!r}: use try or off.")
        if accuracy_budget is None and value != "try":
            raise OptionError(f"{flag} goes with --accuracy-budget; add it or drop {flag}.")
    if search_finetune_seconds is not None and (accuracy_budget is None or search_finetune == "off"):
        raise OptionError(
            "--search-finetune-seconds bounds the search's fast finetune: it goes with --accuracy-budget "
            "and --search-finetune try; drop it or add those."
        )
