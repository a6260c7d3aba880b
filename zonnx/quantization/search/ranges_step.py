"""The budget search's range step around ``ranges.search_ranges``: the searched clipping ranges as a
configuration change, their trial's and re-check's log lines, and the config note.

Rule: searched ranges become ``TensorQuantOverrides`` of the configuration, where the user's own
overrides win; taken out again, only overrides equal to a searched one go. The run's order (ranges, then
bias correction, then the pair re-checked without the ranges) is ``run.py``'s.
"""

from __future__ import annotations

__all__ = ["with_ranges", "without_ranges", "log_ranges_trial", "log_ranges_recheck", "ranges_note"]

import dataclasses
import logging

from zonnx.quantization.config import QuantConfig
from zonnx.quantization.search.config_trial import ConfigTrial
from zonnx.quantization.search.ranges import RangeSearch

logger = logging.getLogger(__name__)


def with_ranges(config: QuantConfig, ranges: RangeSearch) -> QuantConfig:
    """``config`` with the searched ranges as TensorQuantOverrides (the user's own overrides win)."""
    mine = dict(config.extra.tensor_quant_overrides or {})
    merged = {**ranges.overrides, **mine}
    return dataclasses.replace(config, extra=dataclasses.replace(config.extra, tensor_quant_overrides=merged))


def without_ranges(config: QuantConfig, ranges: RangeSearch) -> QuantConfig:
    """``config`` without the searched ranges: an override equal to a searched one goes, the user's own
    TensorQuantOverrides (which won over the searched ones in ``with_ranges``) stay."""
    merged = dict(config.extra.tensor_quant_overrides or {})
    kept = {k: v for k, v in merged.items() if ranges.overrides.get(k) != v}
    return dataclasses.replace(config, extra=dataclasses.replace(config.extra, tensor_quant_overrides=kept))


def log_ranges_recheck(trial: ConfigTrial, metric: str) -> None:
    """Say whether the clipped ranges still help once bias correction joined them: the two were tried one
    after the other, each against the configuration before it, so the pair is scored again without the
    ranges and the ranges stay only when they still score at least as well."""
    if trial.kept:
        logger.warning(
            "range search: with bias correction the clipped ranges no longer help (%s %.5f without them, "
            "%.5f with); the calibrated ranges are kept.",
            metric,
            trial.changed.score,
            trial.plain.score,
        )
    else:
        logger.info(
            "range search: with bias correction the clipped ranges still help (%s %.5f, %.5f without)",
            metric,
            trial.plain.score,
            trial.changed.score,
        )


def log_ranges_trial(trial: ConfigTrial, metric: str) -> None:
    """Say what the ranges' trial found: the searched ranges stay only when the quantized model with them
    (after the target's rules and every algorithm of the config) scores at least as well on ``metric``
    as without them, since the range search judges output noise on a few samples, which can disagree
    with the task metric."""
    if trial.kept:
        logger.info(
            "range search: %s %.5f with the clipped ranges, %.5f without",
            metric,
            trial.changed.score,
            trial.plain.score,
        )
        return
    logger.warning(
        "range search: the clipped ranges lower %s on the search samples (%.5f -> %.5f); the calibrated "
        "ranges are kept. Try more --calib samples, or leave --range-search off.",
        metric,
        trial.plain.score,
        trial.changed.score,
    )


def ranges_note(ranges: RangeSearch | None) -> str:
    """The config note's words on the range search ("" when there was none)."""
    if ranges is None:
        return ""
    return (
        f"; range search clipped {ranges.changed} of {len(ranges.choices)} group(s) "
        f"(output noise {ranges.plain_noise:.4g} -> {ranges.noise:.4g})"
    )
