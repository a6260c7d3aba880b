"""The budget search's A/B step: keep one configuration change only when it scores at least as well.

Rule: with the search's scorer (its statistics, evaluation samples and metric), score the scorer's base
configuration and the changed one the way the search scores its baseline (on every evaluation sample);
keep the change when its score is at least the base's. On a metric with a step (``char-accuracy``,
``top1``: one character or one class position on these samples), two scores at most one step apart are
a tie the samples cannot separate, and the output SQNR against float (from the same runs) decides: the
change stays when its SQNR is at least the base's. On PP-OCRv4 rec for dpu-b4096 (32 search lines, one
character 0.27 points) SmoothQuant read one character lower (0.9863 -> 0.9835) while its output SQNR rose
7.9 -> 11.1 dB and its frames' agreement with float's argmax 0.885 -> 0.943; on 1000 other lines it
raised char accuracy 0.9880 -> 0.9921. The scorer's base is left with the kept
configuration, and the kept side's scored candidate is the next step's starting point, so no step
scores the same configuration twice (the base's score can be handed in from the step before).

Every step the search takes before raising any layer uses it: MSE thresholds (``threshold_step.py``),
SmoothQuant (``smooth_step.py``), the searched ranges (``ranges_step.py``) and bias correction
(``bias_step.py``). Each leaves every layer int8, so each is cheaper than a raised layer. The two that
calibrate anew (thresholds, SmoothQuant) quantize the changed baseline once with ``recalibrate``, which
saves its statistics, and score it with ``try_recalibrated``, which loads them.
"""

from __future__ import annotations

__all__ = [
    "ConfigTrial",
    "try_config",
    "recalibrate",
    "try_recalibrated",
    "log_trial",
    "trial_note",
    "sqnr_words",
    "step_words",
]

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.config import QuantConfig
from zonnx.quantization.search.scorer import Candidate

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ConfigTrial:
    """The base configuration's and the changed configuration's scored candidates."""

    plain: Candidate
    changed: Candidate
    #: the metric's step on the samples both were scored on (None: a continuous metric)
    resolution: float | None = None

    @property
    def tied(self) -> bool:
        """The two scores are at most one step of the metric apart, and both have an output SQNR."""
        step = self.resolution
        return (
            step is not None
            and abs(self.changed.score - self.plain.score) <= step * (1 + 1e-9)
            and self.plain.output_sqnr is not None
            and self.changed.output_sqnr is not None
        )

    @property
    def kept(self) -> bool:
        """The change stays when it scores at least as well as the base; within one step of the metric,
        when its output SQNR is at least the base's (module docstring). Ties keep it."""
        if self.tied:
            return self.changed.output_sqnr >= self.plain.output_sqnr  # type: ignore[operator]
        return self.changed.score >= self.plain.score

    @property
    def chosen(self) -> Candidate:
        """The kept configuration's scored candidate."""
        return self.changed if self.kept else self.plain


def try_config(scorer: Any, changed: QuantConfig, plain: Candidate | None = None) -> ConfigTrial:
    """Score ``scorer.base`` (unless ``plain``, its candidate, is given) and ``changed`` on every
    evaluation sample; ``scorer.base`` ends as the kept one (module docstring)."""
    base = scorer.base
    if plain is None:
        plain = scorer.score({}, full=scorer.subset)
    scorer.base = changed
    trial = ConfigTrial(plain, scorer.score({}, full=scorer.subset), scorer.full_resolution)
    if not trial.kept:
        scorer.base = base
    return trial


def _stats(config: QuantConfig, **paths: str | None) -> QuantConfig:
    return dataclasses.replace(config, extra=dataclasses.replace(config.extra, **paths))


def recalibrate(
    model_input: str | Path,
    calib: Sequence[dict[str, np.ndarray]],
    baseline_config: QuantConfig,
    change: Callable[[QuantConfig], QuantConfig],
    stats_path: Path,
    calibration_executor: Any = None,
) -> Any:
    """Quantize as the search's baseline was (``baseline_config``) with ``change`` applied, calibrating
    anew and saving the statistics in ``stats_path``; the ``QuantizeResult`` (with its report)."""
    from zonnx.quantization.api import quantize_static

    config = change(_stats(baseline_config, load_stats=None, save_stats=str(stats_path)))
    return quantize_static(
        model_input, None, ListReader(list(calib)), config=config, calibration_executor=calibration_executor
    )


def try_recalibrated(
    scorer: Any,
    change: Callable[[QuantConfig], QuantConfig],
    stats_path: Path,
    plain: Candidate | None = None,
) -> ConfigTrial:
    """``try_config`` of ``scorer.base`` with ``change`` applied and the statistics ``recalibrate`` saved
    in ``stats_path`` loaded."""
    return try_config(scorer, change(_stats(scorer.base, load_stats=str(stats_path))), plain)


def log_trial(what: str, trial: ConfigTrial, metric: str) -> None:
    """Log a trial's verdict and both scores."""
    verdict = "kept:" if trial.kept else "not kept (lower score):"
    if trial.tied:
        verdict = (
            "kept (within one step, higher output SQNR):"
            if trial.kept
            else "not kept (within one step, lower output SQNR):"
        )
    logger.info(
        "accuracy search: %s %s %s %.5f -> %.5f%s",
        what,
        verdict,
        metric,
        trial.plain.score,
        trial.changed.score,
        sqnr_words(trial),
    )


def sqnr_words(trial: Any) -> str:
    """The note's words on the two output SQNRs (", output SQNR a -> b dB"), or "" unless both sides have one."""
    a, b = getattr(trial.plain, "output_sqnr", None), getattr(trial.changed, "output_sqnr", None)
    return "" if a is None or b is None else f", output SQNR {a:.2f} -> {b:.2f} dB"


def trial_note(
    what: str, trial: Any, kept: str = "added", dropped: str = "tried, not kept", digits: int = 4
) -> str:
    """The config note's words on a trial (anything with ``kept``, ``plain`` and ``changed``): what, the
    verdict and both scores; "" when there was none."""
    if trial is None:
        return ""
    verb = kept if trial.kept else dropped
    return (
        f"; {what} {verb} ({trial.plain.score:.{digits}f} -> {trial.changed.score:.{digits}f}"
        f"{sqnr_words(trial)}{step_words(trial)})"
    )


def step_words(trial: Any) -> str:
    """The words on a verdict the metric's step decided: a configuration trial's tie settled by output
    SQNR, or fast finetune's gain too small to keep; "" otherwise."""
    if getattr(trial, "tied", False):
        return "; within one step, so by output SQNR"
    if getattr(trial, "within_step", False):
        return "; a gain within one step does not keep it"
    return ""
