"""Built-in metrics on the outputs of a float model (x) and another model (q) over N samples.

- ``cosine``: per sample, every floating-point output flattened and concatenated into one vector each;
  ``mean_s cos(x_s, q_s)`` with ``cos = x.q / (|x| |q|)`` (1 when both are zero, 0 when one is).
- ``sqnr``: ``10 log10(sum_s |x_s|^2 / sum_s |x_s - q_s|^2)`` dB over all floating-point outputs of all
  samples (+inf when the outputs are equal, -inf when the float outputs are all zero and the others are
  not).
- ``top1``: agreement of ``argmax`` over the last axis of the *first* output: the fraction of positions
  (batch rows, and every leading index) where ``argmax q == argmax x``. It measures agreement with
  the float model, not accuracy against labels (none are read).
- ``top5``: the same positions; the fraction where float's ``argmax`` is among the other model's 5
  largest scores (ties broken by index, as ``argsort``; all classes count when there are fewer than 5).

``cosine`` and ``sqnr`` leave integer and boolean outputs out (an ArgMax index, a detection count, a
mask): an index that moves by one is not a small error, so it would only distort a measure of
closeness; bias correction's own output SQNR leaves them out the same way. A model with no
floating-point output is refused by these two (score it with a metric plugin).
"""

from __future__ import annotations

__all__ = ["Cosine", "Sqnr", "Top1", "TopK", "paired"]

import logging
import math

import numpy as np

from zonnx.errors import MetricError
from zonnx.verify import cosine

logger = logging.getLogger(__name__)


def paired(
    name: str,
    float_outputs: list[np.ndarray],
    quant_outputs: list[np.ndarray],
    count: int,
    real_only: bool = False,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Output pairs (float, other) as float64; MetricError when their number or shapes differ.

    ``count`` is the sample's index, for the message. ``real_only``: only the outputs the float model
    gives as floating point, and MetricError when it gives none.
    """
    if len(float_outputs) != len(quant_outputs):
        raise MetricError(
            f"metric {name}: sample {count}: the float model gives {len(float_outputs)} output(s), the "
            f"other model {len(quant_outputs)}; compare models with the same outputs."
        )
    pairs = []
    for i, (x, q) in enumerate(zip(float_outputs, quant_outputs, strict=True)):
        x, q = np.asarray(x), np.asarray(q)
        if x.shape != q.shape:
            raise MetricError(
                f"metric {name}: sample {count}: output {i} has shape {list(x.shape)} in the float model "
                f"and {list(q.shape)} in the other; compare models with the same outputs."
            )
        if real_only and x.dtype.kind != "f":
            continue
        pairs.append((x.astype(np.float64), q.astype(np.float64)))
    if real_only and not pairs:
        kinds = ", ".join(sorted({str(np.asarray(x).dtype) for x in float_outputs})) or "none"
        raise MetricError(
            f"metric {name}: the model has no floating-point output (its outputs: {kinds}); {name} measures "
            "how close real values are, so score integer outputs with a metric plugin (--metric FILE.py:Class)."
        )
    return pairs


class Cosine:
    """Mean over samples of the cosine between the floating-point outputs of both models, flattened."""

    higher_is_better = True

    def __init__(self) -> None:
        self.total = 0.0
        self.samples = 0

    def update(
        self, float_outputs: list[np.ndarray], quant_outputs: list[np.ndarray], feed: dict[str, np.ndarray]
    ) -> None:
        pairs = paired("cosine", float_outputs, quant_outputs, self.samples, real_only=True)
        x = np.concatenate([a.ravel() for a, _ in pairs]) if pairs else np.zeros(0)
        q = np.concatenate([b.ravel() for _, b in pairs]) if pairs else np.zeros(0)
        self.total += cosine(x, q)
        self.samples += 1

    def result(self) -> float:
        if not self.samples:
            raise MetricError("metric cosine: no sample was given; feed at least one.")
        return self.total / self.samples


class Sqnr:
    """Signal-to-quantization-noise ratio in dB over all floating-point outputs of all samples."""

    higher_is_better = True

    def __init__(self) -> None:
        self.signal = 0.0
        self.noise = 0.0
        self.samples = 0

    def update(
        self, float_outputs: list[np.ndarray], quant_outputs: list[np.ndarray], feed: dict[str, np.ndarray]
    ) -> None:
        for x, q in paired("sqnr", float_outputs, quant_outputs, self.samples, real_only=True):
            self.signal += float(np.sum(x * x))
            self.noise += float(np.sum((x - q) ** 2))
        self.samples += 1

    def result(self) -> float:
        if not self.samples:
            raise MetricError("metric sqnr: no sample was given; feed at least one.")
        if self.noise == 0:
            return math.inf
        return 10 * math.log10(self.signal / self.noise) if self.signal > 0 else -math.inf


class Top1:
    """Fraction of positions where argmax over the last axis of the first output agrees with float's."""

    higher_is_better = True

    def __init__(self) -> None:
        self.agree = 0
        self.positions = 0
        self.samples = 0

    def update(
        self, float_outputs: list[np.ndarray], quant_outputs: list[np.ndarray], feed: dict[str, np.ndarray]
    ) -> None:
        pairs = paired("top1", float_outputs[:1], quant_outputs[:1], self.samples)
        if not pairs or pairs[0][0].ndim == 0 or pairs[0][0].shape[-1] == 0:
            shape = list(pairs[0][0].shape) if pairs else "no output"
            raise MetricError(
                f"metric top1: the first output is {shape}; top1 needs class scores on the last axis."
            )
        x, q = pairs[0]
        same = x.argmax(axis=-1) == q.argmax(axis=-1)
        self.agree += int(np.count_nonzero(same))
        self.positions += int(same.size)
        self.samples += 1

    def result(self) -> float:
        if not self.positions:
            raise MetricError("metric top1: no sample was given; feed at least one.")
        return self.agree / self.positions

    def resolution(self) -> float | None:
        """One position: ``1 / positions`` seen (None before any)."""
        return 1.0 / self.positions if self.positions else None


class TopK:
    """Fraction of positions where float's argmax class is among the other model's ``k`` largest (default 5)."""

    higher_is_better = True

    def __init__(self, k: int = 5) -> None:
        if k < 1:
            raise MetricError(f"metric top{k}: k must be at least 1.")
        self.k, self.hits, self.positions, self.samples = k, 0, 0, 0

    def update(
        self, float_outputs: list[np.ndarray], quant_outputs: list[np.ndarray], feed: dict[str, np.ndarray]
    ) -> None:
        name = f"top{self.k}"
        pairs = paired(name, float_outputs[:1], quant_outputs[:1], self.samples)
        if not pairs or pairs[0][0].ndim == 0 or pairs[0][0].shape[-1] == 0:
            shape = list(pairs[0][0].shape) if pairs else "no output"
            raise MetricError(
                f"metric {name}: the first output is {shape}; it needs class scores on the last axis."
            )
        x, q = pairs[0]
        want = x.argmax(axis=-1)[..., None]
        top = np.argsort(-q, axis=-1, kind="stable")[..., : self.k]
        self.hits += int(np.count_nonzero((top == want).any(axis=-1)))
        self.positions += int(want.size)
        self.samples += 1

    def result(self) -> float:
        if not self.positions:
            raise MetricError(f"metric top{self.k}: no sample was given; feed at least one.")
        return self.hits / self.positions

    def resolution(self) -> float | None:
        """One position: ``1 / positions`` seen (None before any)."""
        return 1.0 / self.positions if self.positions else None
