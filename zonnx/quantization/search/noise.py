"""Whether one candidate scores higher than another beyond the noise of the samples that scored both.

Rule: on the same n samples, d = score(A) - score(B). Its standard error is estimated by the delete-a-group
jackknife over g = min(n, ``MAX_GROUPS``) contiguous groups of samples::

    se = sqrt((g - 1) / g * sum_i (d_(i) - mean(d_(.)))^2)

where d_(i) is the difference with group i left out (both models scored by the metric on the same
remaining samples, so the pairing cancels what the samples share). A beats B **beyond the noise** when
``d > Z * se`` with ``Z = 2`` (about 98% one-sided under a normal approximation); a difference no larger is
**within the noise**. The jackknife needs no per-sample score, so it works for any metric (a ratio over
samples such as char accuracy included) at the cost of g re-evaluations of the metric on stored outputs,
not of the models.

Why: a search that picks among candidates by a metric with steps on few samples fits the noise of those
samples. On PP-OCRv4 rec for dpu-b4096 (32 search lines, char accuracy against float), leaving its 135
MAC-free layers float read 2 characters higher (+0.55 points, jackknife se 0.77) and 0.36 points lower on
1000 other lines; every layer allowed float read +0.55 too (se 0.55) and 0.15 lower on those lines.
"""

from __future__ import annotations

__all__ = ["MAX_GROUPS", "Z", "PairedDifference", "paired_difference"]

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from zonnx.metrics.evaluate import FloatReference

#: at most this many jackknife groups (each one metric evaluation per model over the rest of the samples)
MAX_GROUPS = 32
#: a difference beyond ``Z`` standard errors is taken as real
Z = 2.0


@dataclasses.dataclass(frozen=True)
class PairedDifference:
    """score(A) - score(B) on the same samples and its jackknife standard error."""

    difference: float
    standard_error: float
    groups: int

    @property
    def beyond_noise(self) -> bool:
        """True when A scores higher than B by more than ``Z`` standard errors."""
        return self.difference > 0 and self.difference > Z * self.standard_error


def paired_difference(
    reference: FloatReference, a_outputs: Sequence[list[np.ndarray]], b_outputs: Sequence[list[np.ndarray]]
) -> PairedDifference:
    """``score(a) - score(b)`` against ``reference``'s float outputs and its delete-a-group jackknife
    standard error (module docstring); ``a_outputs`` and ``b_outputs`` hold one output list per sample of
    ``reference``, in order."""
    n = len(reference.feeds)
    if len(a_outputs) != n or len(b_outputs) != n:
        raise ValueError(f"outputs for {len(a_outputs)} and {len(b_outputs)} samples, the reference has {n}")
    difference = reference.score_outputs(a_outputs) - reference.score_outputs(b_outputs)
    groups = min(n, MAX_GROUPS)
    if groups < 2:
        return PairedDifference(difference, math.inf, groups)
    bounds = np.linspace(0, n, groups + 1).round().astype(int)
    left_out = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        kept = [i for i in range(n) if not lo <= i < hi]
        rest = reference.subset(kept)
        left_out.append(
            rest.score_outputs([a_outputs[i] for i in kept])
            - rest.score_outputs([b_outputs[i] for i in kept])
        )
    values = np.asarray(left_out, dtype=np.float64)
    se = math.sqrt((groups - 1) / groups * float(np.square(values - values.mean()).sum()))
    return PairedDifference(difference, se, groups)
