"""Character accuracy of a CTC text recognizer (PP-OCR rec): decode both models' first output, count edits.

Decoding is rapidocr's greedy CTC (``zonnx.zoo.text_images.ctc_greedy_decode``): argmax over the classes
of each time step of the ``[N, T, C]`` output, repeats merged, index 0 (blank) dropped. Class ``i`` is
entry ``i`` of the model's character list: the blank, the lines of its ``character`` metadata, then a
space (PP-OCR's ``use_space_char``), so ``C`` must equal the list's length.

With ``d`` the Levenshtein distance, over every decoded line of every sample:
``strict = max(0, 1 - sum d(pred, ref) / sum len(ref))``; ``stripped`` is the same with leading and
trailing spaces removed from both (the crop's margins are often read as spaces). When the references
hold no character at all the score is 1 if no edit is needed, else 0. ``result()`` is ``strict``.
``ref`` is the label of the line when labels are given (one string per batch row, in sample order),
else the float model's own decoded text: without labels the metric measures agreement with float.
"""

from __future__ import annotations

__all__ = ["CharAccuracy", "model_characters"]

import logging
import os
from collections.abc import Sequence

import numpy as np
import onnx

from zonnx.errors import MetricError
from zonnx.zoo.text_images import ctc_greedy_decode, edit_distance

logger = logging.getLogger(__name__)


def model_characters(model_path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The CTC character list of a rec model: blank, its ``character`` metadata lines, a space."""
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf and OS errors alike become one line
        raise MetricError(f"metric char-accuracy: cannot read {model_path} ({type(e).__name__}).") from None
    meta = {p.key: p.value for p in model.metadata_props}
    if "character" not in meta:
        raise MetricError(
            f"metric char-accuracy: {model_path} has no 'character' metadata (the CTC character list "
            "PP-OCR rec models carry); use another metric or a model that has it."
        )
    return ("blank", *meta["character"].splitlines(), " ")


def _score(errors: int, total: int) -> float:
    if total == 0:
        return 1.0 if errors == 0 else 0.0
    return max(0.0, 1.0 - errors / total)


class CharAccuracy:
    """Character accuracy (strict; ``scores`` also gives spaces-stripped) of CTC-decoded text lines."""

    higher_is_better = True

    def __init__(
        self, characters: Sequence[str], labels: Sequence[str] | None = None, *, score: str = "strict"
    ) -> None:
        if score not in ("strict", "stripped"):
            raise MetricError(f"metric char-accuracy: score {score!r}: use 'strict' or 'stripped'.")
        self.score = score
        if len(characters) < 2:
            raise MetricError("metric char-accuracy: the character list needs the blank and at least one.")
        self.characters = tuple(characters)
        self.labels = None if labels is None else list(labels)
        self.errors = {"strict": 0, "stripped": 0}
        self.totals = {"strict": 0, "stripped": 0}
        self.lines = 0
        self.samples = 0

    def _decode(self, output: np.ndarray, which: str) -> list[str]:
        out = np.asarray(output)
        if out.ndim != 3 or out.shape[2] != len(self.characters):
            raise MetricError(
                f"metric char-accuracy: sample {self.samples}: the {which} model's first output is "
                f"{list(out.shape)}; expected [N, T, {len(self.characters)}] (one score per character)."
            )
        return ctc_greedy_decode(out, self.characters)

    def _references(self, count: int, float_outputs: list[np.ndarray]) -> list[str]:
        if self.labels is None:
            return self._decode(float_outputs[0], "float")
        if self.lines + count > len(self.labels):
            raise MetricError(
                f"metric char-accuracy: {len(self.labels)} label(s) given, but sample {self.samples} "
                f"brings line {self.lines + count}; give one label per text line."
            )
        return [str(t) for t in self.labels[self.lines : self.lines + count]]

    def update(
        self, float_outputs: list[np.ndarray], quant_outputs: list[np.ndarray], feed: dict[str, np.ndarray]
    ) -> None:
        if not float_outputs or not quant_outputs:
            raise MetricError("metric char-accuracy: a model gave no output; it needs the CTC scores.")
        predicted = self._decode(quant_outputs[0], "other")
        references = self._references(len(predicted), float_outputs)
        if len(references) != len(predicted):
            raise MetricError(
                f"metric char-accuracy: sample {self.samples}: {len(references)} float line(s) and "
                f"{len(predicted)} other; compare models with the same outputs."
            )
        for pred, ref in zip(predicted, references, strict=True):
            self.errors["strict"] += edit_distance(pred, ref)
            self.totals["strict"] += len(ref)
            self.errors["stripped"] += edit_distance(pred.strip(), ref.strip())
            self.totals["stripped"] += len(ref.strip())
        self.lines += len(predicted)
        self.samples += 1

    @property
    def scores(self) -> dict[str, float]:
        """``{"strict": ..., "stripped": ...}`` over every line seen."""
        return {k: _score(self.errors[k], self.totals[k]) for k in self.errors}

    def result(self) -> float:
        if not self.samples:
            raise MetricError("metric char-accuracy: no sample was given; feed at least one.")
        return self.scores[self.score]

    def resolution(self) -> float | None:
        """One character: ``1 / reference characters`` of the score (None while there are none)."""
        total = self.totals[self.score]
        return 1.0 / total if total else None
