"""The metric protocol: what a model metric (built-in or plugin) must provide, and the checks on its answer.

A metric is an object with

- ``update(float_outputs, quant_outputs, feed) -> None``, called once per sample with the float model's
  outputs and the other model's outputs (``list[np.ndarray]`` in graph-output order) and the sample's
  feed (``dict[str, np.ndarray]``, the arrays both models were given);
- ``result() -> float``, one real number for all samples seen; **higher is better** unless the object
  has ``higher_is_better = False`` (an error such as a mean squared error).

``result`` must be a real number (Python or numpy int/float; not a bool); NaN is refused, +-inf is
accepted (SQNR of identical outputs is +inf).

Optional: ``resolution() -> float | None``, the smallest step by which one sample can move ``result()``
on the samples seen so far (``1 / reference characters`` for char accuracy, ``1 / positions`` for top1),
or None for a continuous metric (cosine, SQNR). The accuracy search uses it to say when its evaluation
samples are too few to resolve the budget (``zonnx.quantization.search.resolution``). A value that is
not a positive finite number or None is refused, naming the metric.
"""

from __future__ import annotations

__all__ = ["Metric", "as_number", "higher_is_better", "resolution_of", "checked_resolution"]

import logging
import math
import numbers
from typing import Any, Protocol, runtime_checkable

import numpy as np

from zonnx.errors import MetricError

logger = logging.getLogger(__name__)


@runtime_checkable
class Metric(Protocol):
    """A model metric: fed one sample at a time, gives one number (higher is better by default)."""

    def update(
        self, float_outputs: list[np.ndarray], quant_outputs: list[np.ndarray], feed: dict[str, np.ndarray]
    ) -> None: ...

    def result(self) -> float: ...


def higher_is_better(metric: Any) -> bool:
    """The metric's ``higher_is_better`` attribute (True when absent); a non-bool value is refused."""
    value = getattr(metric, "higher_is_better", True)
    if not isinstance(value, bool | np.bool_):
        raise MetricError(
            f"metric {type(metric).__name__}: higher_is_better is {value!r}; set it to True or False."
        )
    return bool(value)


def as_number(value: Any, where: str) -> float:
    """``value`` as a float when it is a real number and not NaN; else MetricError naming ``where``."""
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise MetricError(
            f"{where}: result() returned {shown} ({type(value).__name__}); return one real number (a float)."
        )
    number = float(value)
    if math.isnan(number):
        raise MetricError(f"{where}: result() returned NaN; return a real number (inf is allowed).")
    return number


def checked_resolution(value: Any, where: str) -> float | None:
    """``value`` as a metric step: None, or a positive finite real number; else MetricError naming ``where``."""
    if value is None:
        return None
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if (
        isinstance(value, bool | np.bool_)
        or not isinstance(value, numbers.Real)
        or not 0 < float(value) < math.inf
    ):
        raise MetricError(
            f"{where}: resolution() returned {value!r}; return the smallest step of result() (a positive "
            "number) or None for a continuous metric."
        )
    return float(value)


def resolution_of(metric: Any, where: str) -> float | None:
    """The metric's ``resolution()`` (checked), or None when it has none."""
    fn = getattr(metric, "resolution", None)
    return checked_resolution(fn(), where) if callable(fn) else None
