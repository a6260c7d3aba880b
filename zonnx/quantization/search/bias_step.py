"""The budget search's first step on an all-int8 configuration: try bias correction.

Rule: with the search's scorer (same statistics, evaluation samples and metric), score the configuration
as it is and with ``BiasCorrection`` on; keep bias correction when its score is at least the plain one.
Either way every layer stays int8, so this costs no NPU time, and a kept correction shifts the whole
search's starting point. The scorer's base configuration is left with the choice. A configuration bias
correction cannot run on (``check_recovery_options``: QOperator, bfloat16) is not tried.
"""

from __future__ import annotations

__all__ = ["BiasTrial", "try_bias_correction", "bias_correction_note"]

import dataclasses
import logging
from typing import Any

from zonnx.errors import OptionError
from zonnx.quantization.recovery.steps import check_recovery_options

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BiasTrial:
    """The two scores of the trial and whether bias correction was kept; ``chosen`` is the kept
    configuration's scored candidate, which the search takes as its baseline instead of scoring it again."""

    plain: float
    corrected: float
    kept: bool
    chosen: Any = None


def try_bias_correction(scorer: Any, metric: str) -> BiasTrial | None:
    """Score ``scorer.base`` without and with bias correction (module docstring); the kept one stays.
    None when the configuration cannot take bias correction (QOperator, bfloat16: the reason is logged)."""
    plain_base = scorer.base
    corrected_base = dataclasses.replace(
        plain_base, extra=dataclasses.replace(plain_base.extra, bias_correction=True)
    )
    try:
        check_recovery_options(corrected_base, has_reader=True)
    except OptionError as e:
        logger.info("accuracy search: bias correction not tried (%s)", e)
        return None
    # scored as the search scores its baseline (every evaluation sample when candidates use a subset)
    plain_cand = scorer.score({}, full=scorer.subset)
    scorer.base = corrected_base
    corrected_cand = scorer.score({}, full=scorer.subset)
    plain, corrected = plain_cand.score, corrected_cand.score
    kept = corrected >= plain
    if not kept:
        scorer.base = plain_base
    logger.info(
        "accuracy search: bias correction %s %s %.5f -> %.5f",
        "kept:" if kept else "not kept (lower score):",
        metric,
        plain,
        corrected,
    )
    return BiasTrial(plain, corrected, kept, corrected_cand if kept else plain_cand)


def bias_correction_note(trial: BiasTrial | None) -> str:
    """The config note's words on the trial ("" when there was none)."""
    if trial is None:
        return ""
    verb = "added" if trial.kept else "tried, not kept"
    return f"; bias correction {verb} ({trial.plain:.4f} -> {trial.corrected:.4f})"
