"""The budget search's A/B step: keep one configuration change only when it scores at least as well.

Rule: with the search's scorer (its statistics, evaluation samples and metric), score the scorer's base
configuration and the changed one the way the search scores its baseline (on every evaluation sample);
keep the change when its score is at least the base's. The scorer's base is left with the kept
configuration, and the kept side's scored candidate is the next step's starting point, so no step
scores the same configuration twice (the base's score can be handed in from the step before).

Both steps the search takes before raising any layer use it: the searched ranges (``ranges.py``) and
bias correction (``bias_step.py``). Each leaves every layer int8, so each is cheaper than a raised layer.
"""

from __future__ import annotations

__all__ = ["ConfigTrial", "try_config", "log_trial", "trial_note"]

import dataclasses
import logging
from typing import Any

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
