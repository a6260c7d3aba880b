"""The budget search's A/B step: keep one configuration change only when it scores at least as well.

Rule: with the search's scorer (its statistics, evaluation samples and metric), score the scorer's base
configuration and the changed one the way the search scores its baseline (on every evaluation sample);
keep the change when its score is at least the base's. The scorer's base is left with the kept
configuration, and the kept side's scored candidate is the next step's starting point, so no step
scores the same configuration twice (the base's score can be handed in from the step before).

Every step the search takes before raising any layer uses it: MSE thresholds (``threshold_step.py``),
SmoothQuant (``smooth_step.py``), the searched ranges (``ranges_step.py``) and bias correction
(``bias_step.py``). Each leaves every layer int8, so each is cheaper than a raised layer. The two that
calibrate anew (thresholds, SmoothQuant) quantize the changed baseline once with ``recalibrate``, which
saves its statistics, and score it with ``try_recalibrated``, which loads them.
"""

from __future__ import annotations

__all__ = ["ConfigTrial", "try_config", "recalibrate", "try_recalibrated", "log_trial", "trial_note"]

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

    @property
    def kept(self) -> bool:
        """The change stays when it scores at least as well as the base (ties keep it)."""
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
    trial = ConfigTrial(plain, scorer.score({}, full=scorer.subset))
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
    logger.info(
        "accuracy search: %s %s %s %.5f -> %.5f",
        what,
        verdict,
        metric,
        trial.plain.score,
        trial.changed.score,
    )


def trial_note(
    what: str, trial: Any, kept: str = "added", dropped: str = "tried, not kept", digits: int = 4
) -> str:
    """The config note's words on a trial (anything with ``kept``, ``plain`` and ``changed``): what, the
    verdict and both scores; "" when there was none."""
    if trial is None:
        return ""
    verb = kept if trial.kept else dropped
    return f"; {what} {verb} ({trial.plain.score:.{digits}f} -> {trial.changed.score:.{digits}f})"
