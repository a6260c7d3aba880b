"""Whether the evaluation samples can resolve the accuracy budget, and how many would.

A metric that counts units (characters for char accuracy, class positions for top1) moves in steps of
``1 / units`` on the samples that score the candidates (``Metric.resolution()``). Rule: when the budget
spans fewer than ``MIN_BUDGET_STEPS`` such steps, one or two units decide whether a candidate meets it,
so the search's choice fits those samples and says little about others: warn, and advise the number of
samples that gives ``ADVISED_STEPS`` steps (units grow with samples). Measured on PP-OCRv4 rec for
dpu-b4096: 32 search lines hold 364 characters, 0.27 points a character against a 0.5-point budget
(1.8 steps); the recipe with and without SmoothQuant tied there (0.9890) and differed by 0.7 points on
the bench's 200 test lines (0.9902 and 0.9833).
A continuous metric (no ``resolution()``) and a zero budget are not judged.
"""

from __future__ import annotations

__all__ = ["MIN_BUDGET_STEPS", "ADVISED_STEPS", "coarse_budget_note"]

import math

#: Fewest metric steps the budget should span on the samples that score candidates.
MIN_BUDGET_STEPS = 4
#: Steps the advised number of samples gives.
ADVISED_STEPS = 10


def coarse_budget_note(budget: float, step: float | None, samples: int, metric: str) -> str | None:
    """The warning for a ``budget`` (points) spanning fewer than ``MIN_BUDGET_STEPS`` steps of ``metric``
    on ``samples`` samples, or None when it spans enough (or the metric is continuous, or the budget 0)."""
    if step is None or budget <= 0 or samples < 1:
        return None
    steps = budget / 100.0 / step
    if steps >= MIN_BUDGET_STEPS:
        return None
    advised = math.ceil(samples * ADVISED_STEPS / steps)
    return (
        f"accuracy budget: on the {samples} sample(s) that score candidates, {metric} moves in steps of "
        f"{100.0 * step:.2g} points (one unit in {round(1.0 / step)}), so the {budget:g}-point budget is "
        f"{steps:.1f} step(s): one or two units (a character, a class position) decide whether a candidate "
        f"meets it. Give about {advised} evaluation samples (--eval) for {ADVISED_STEPS} steps."
    )
