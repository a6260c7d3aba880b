"""Run a float model and another model (quantized or compiled) on the same samples and score them with a metric.

Both models run once per sample; each gets the sample's arrays named as its inputs (other arrays, such as
labels a plugin reads, only reach the metric). Float and quantized models run in ONNX Runtime as written
(``zonnx.verify.ort_session``: graph optimizations off, integer ops in the form this host computes
exactly); a compiled model (NpuSubgraph nodes) runs in ``zonnx.InferenceSession`` on the NPU provider.
"""

from __future__ import annotations

__all__ = ["evaluate", "Runner", "FloatReference"]

import itertools
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from zonnx.errors import MetricError, OptionError, VerificationError, first_line
from zonnx.ir.io import ModelLike, to_proto
from zonnx.metrics.builtin import Sqnr
from zonnx.metrics.plugins import guard, load_metric
from zonnx.metrics.protocol import Metric, as_number, higher_is_better, resolution_of
from zonnx.verify import ort_session

logger = logging.getLogger(__name__)

Runner = Callable[[Mapping[str, np.ndarray], int], list[np.ndarray]]


def _runner(model: ModelLike, what: str) -> Runner:
    """A function running one sample through ``model`` (outputs in graph order)."""
    from zonnx.backend.compiled import is_compiled

    proto = to_proto(model)
    if is_compiled(proto):
        from zonnx.backend.session import CPU_PROVIDER, NPU_PROVIDER, InferenceSession

        sess: Any = InferenceSession(proto, providers=[NPU_PROVIDER, CPU_PROVIDER])
    else:
        sess = ort_session(proto)
    inputs = [i.name for i in sess.get_inputs()]

    def run(sample: Mapping[str, np.ndarray], index: int) -> list[np.ndarray]:
        missing = [n for n in inputs if n not in sample]
        if missing:
            raise OptionError(
                f"sample {index}: no array for input {missing[0]!r} of the {what}; "
                f"the sample has {sorted(sample)}."
            )
        try:
            return list(sess.run(None, {n: np.asarray(sample[n]) for n in inputs}))
        except Exception as e:  # ORT's exception classes share no public base
            first = first_line(e)
            raise VerificationError(f"sample {index}: the {what} failed to run ({first}).") from None

    return run


def _samples(feeds: Any) -> Iterable[Mapping[str, np.ndarray]]:
    if hasattr(feeds, "get_next"):  # a CalibrationDataReader
        return iter(feeds.get_next, None)
    if isinstance(feeds, Mapping):
        return [feeds]
    return feeds


def evaluate(
    float_model: ModelLike,
    quant_model: ModelLike,
    feeds: Any,
    metric: Metric | str,
    *,
    max_samples: int | None = None,
) -> float:
    """Score ``quant_model`` against ``float_model`` on ``feeds`` with ``metric``; returns ``result()``.

    ``feeds``: one input dict, an iterable of them, or a CalibrationDataReader; at most ``max_samples``
    are used. ``metric``: an object following the protocol (``zonnx.metrics.protocol``) or a spec for
    ``load_metric`` (the float model's path is passed along when it is a path). Errors a metric raises
    become one MetricError line naming its file and line; a result that is not a number is refused.
    """
    if isinstance(metric, str):
        path = float_model if isinstance(float_model, str | os.PathLike) else None
        metric = load_metric(metric, path)
    checked = guard(metric)
    run_float, run_other = _runner(float_model, "float model"), _runner(quant_model, "other model")
    if max_samples is not None and max_samples < 1:
        raise OptionError(f"max_samples={max_samples}: evaluate at least 1 sample.")
    count = 0
    for index, sample in enumerate(itertools.islice(_samples(feeds), max_samples)):
        feed = {k: np.asarray(v) for k, v in sample.items()}
        checked.update(run_float(feed, index), run_other(feed, index), feed)
        count += 1
    if not count:
        raise OptionError("feeds gave no sample; pass at least one input dict.")
    value = as_number(checked.result(), f"metric {type(metric).__name__}")
    logger.info("metric %s over %d sample(s): %.6g", type(metric).__name__, count, value)
    return value


class FloatReference:
    """The float model's outputs on fixed samples, run once; ``score`` runs another model on the same
    samples and applies a fresh ``metric`` (a spec for ``load_metric``) against those outputs."""

    def __init__(
        self,
        float_model: ModelLike,
        feeds: Iterable[Mapping[str, np.ndarray]],
        metric: str,
        model_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.metric_spec, self.model_path = metric, model_path
        self.feeds = [dict(f) for f in feeds]
        sess = ort_session(float_model)
        self.outputs = [list(sess.run(None, f)) for f in self.feeds]

    def require_higher_is_better(self, what: str) -> None:
        """Refuse a metric whose lower values are better: ``what`` (a search or triage against a threshold
        below float's score) reads every score as higher-is-better."""
        metric = guard(load_metric(self.metric_spec, self.model_path))
        if not higher_is_better(metric):
            raise MetricError(
                f"metric {self.metric_spec!r}: lower is better (higher_is_better = False), but {what} counts "
                "scores below float's as losses; give a metric where higher is better (for an error, "
                "return its negative)."
            )

    def subset(self, indices: Iterable[int]) -> FloatReference:
        """The same reference on the samples at ``indices`` (in that order), the float outputs shared,
        nothing run again."""
        part = object.__new__(FloatReference)
        part.metric_spec, part.model_path = self.metric_spec, self.model_path
        chosen = list(indices)
        part.feeds = [self.feeds[i] for i in chosen]
        part.outputs = [self.outputs[i] for i in chosen]
        return part

    def run(self, model: ModelLike) -> list[list[np.ndarray]]:
        """``model``'s outputs on the samples (graph optimizations off, exact integer form), one list each."""
        sess = ort_session(model)
        return [list(sess.run(None, dict(f))) for f in self.feeds]

    def _fed(self, outputs: Iterable[list[np.ndarray]]) -> Metric:
        """A fresh metric fed ``outputs`` (one list per sample, in order) against the float outputs."""
        metric = guard(load_metric(self.metric_spec, self.model_path))
        for ref, out, feed in zip(self.outputs, outputs, self.feeds, strict=True):
            metric.update(ref, out, feed)
        return metric

    def score_outputs(self, outputs: Iterable[list[np.ndarray]]) -> float:
        """The metric of ``outputs`` (one list per sample, in order) against the float outputs."""
        return float(self._fed(outputs).result())

    def self_score(self) -> tuple[float, float | None]:
        """The float model against itself, from one pass: the metric's score and its step on these samples
        (``resolution()``; None for a metric without one)."""
        metric = self._fed(self.outputs)
        return float(metric.result()), resolution_of(metric, f"metric {self.metric_spec}")

    def score(self, model: ModelLike) -> float:
        """Run ``model`` on the samples (graph optimizations off, exact integer form) and score it."""
        return self.score_with_sqnr(model)[0]

    def score_with_sqnr(self, model: ModelLike) -> tuple[float, float | None]:
        """``score`` and, from the same run, the SQNR (dB) of ``model``'s floating-point outputs against the
        float outputs over all samples (the ``sqnr`` metric): a continuous measure beside a metric with
        steps; None when the model has no floating-point output."""
        return self.score_outputs_with_sqnr(self.run(model))

    def score_outputs_with_sqnr(self, outputs: list[list[np.ndarray]]) -> tuple[float, float | None]:
        """``score_with_sqnr`` of outputs already computed (one list per sample, in order)."""
        score = self.score_outputs(outputs)
        if not self.outputs or not any(np.asarray(x).dtype.kind == "f" for x in self.outputs[0]):
            return score, None
        sqnr = Sqnr()
        for ref, out, feed in zip(self.outputs, outputs, self.feeds, strict=True):
            sqnr.update(ref, out, feed)
        return score, float(sqnr.result())
