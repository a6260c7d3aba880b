"""Detector metrics: mean IoU and box F1 of another model's boxes against reference boxes.

Boxes come from the *first* output of a model, in one of two forms:

- box rows ``[N, C]`` or ``[1, N, C]`` with ``C`` of 4 (``x0, y0, x1, y1``) to 7 (then column 4 is a
  score and rows with score < ``score_threshold``, 0.5, are dropped);
- a probability map (a DB-style text detector such as PP-OCR det: ``[1, 1, H, W]`` or ``[1, H, W]``):
  pixels >= ``map_threshold`` (0.3, PP-OCR's ``thresh``) form 4-connected regions, and each region of at
  least ``min_pixels`` (4) pixels gives its bounding box ``(x0, y0, x1 + 1, y1 + 1)`` in pixels.

Reference: the sample's ``boxes`` array (``[K, 4]``, ground truth) when the feed has one, else the
float model's boxes (agreement with float; the float model then scores 1 against itself).

``IoU(a, b) = |a n b| / |a u b|``. Matching is greedy: pairs in decreasing IoU, each box used once,
pairs with IoU >= ``iou_threshold`` (0.5) match. Over all samples, ``box-f1 = 2 TP / (R + P)`` with
``TP`` matches, ``R`` reference boxes and ``P`` predicted boxes (1 when both are empty), and
``mean-iou`` is the mean over reference boxes of their best IoU with any predicted box (0 when there
is none; 1 when no sample has a reference box and none predicted one).
"""

from __future__ import annotations

__all__ = ["boxes_from_output", "regions", "iou_matrix", "match", "MeanIoU", "BoxF1"]

import logging
from collections.abc import Mapping

import numpy as np

from zonnx.errors import MetricError

logger = logging.getLogger(__name__)


def _find(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def regions(mask: np.ndarray, min_pixels: int = 4) -> np.ndarray:
    """Bounding boxes ``[N, 4]`` (x0, y0, x1, y1; x1/y1 exclusive) of the 4-connected regions of ``mask``.

    Rule: runs of True pixels per row; runs in adjacent rows whose columns overlap join one region
    (union-find over runs, so the cost follows the number of runs, not of pixels).
    """
    runs: list[tuple[int, int, int]] = []  # (row, start, stop)
    parent: list[int] = []
    prev: list[int] = []
    for y, row in enumerate(np.asarray(mask, dtype=bool)):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], row.view(np.int8), [0]])))
        here = []
        for a, b in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
            k = len(runs)
            runs.append((y, a, b))
            parent.append(k)
            for j in prev:
                _, pa, pb = runs[j]
                if pa < b and a < pb:
                    ra, rb = _find(parent, j), _find(parent, k)
                    if ra != rb:
                        parent[rb] = ra
            here.append(k)
        prev = here
    boxes: dict[int, list[int]] = {}
    for k, (y, a, b) in enumerate(runs):
        r = _find(parent, k)
        box = boxes.setdefault(r, [a, y, b, y + 1, 0])
        box[0], box[1], box[2], box[3] = min(box[0], a), min(box[1], y), max(box[2], b), max(box[3], y + 1)
        box[4] += b - a
    kept = [b[:4] for b in boxes.values() if b[4] >= min_pixels]
    return np.array(kept, dtype=np.float64).reshape(-1, 4)


def boxes_from_output(
    output: np.ndarray, *, score_threshold: float = 0.5, map_threshold: float = 0.3, min_pixels: int = 4
) -> np.ndarray:
    """The ``[N, 4]`` boxes in a detector's output (see the module docstring for the two forms)."""
    x = np.asarray(output, dtype=np.float64)
    if x.ndim in (2, 3) and 4 <= x.shape[-1] <= 7:
        rows = x.reshape(-1, x.shape[-1])
        if rows.shape[1] > 4:
            rows = rows[rows[:, 4] >= score_threshold]
        return rows[:, :4].copy()
    squeezed = x.reshape(x.shape[-2:]) if 2 <= x.ndim <= 4 and int(np.prod(x.shape[:-2])) == 1 else None
    if squeezed is None:
        raise MetricError(
            f"detector metric: the first output is {list(x.shape)}; give box rows [N, 4] / [1, N, 4] (or "
            "5 to 7 columns, column 4 a score) or one probability map [1, 1, H, W]."
        )
    return regions(squeezed >= map_threshold, min_pixels)


def _area(z: np.ndarray) -> np.ndarray:
    return np.clip(z[:, 2] - z[:, 0], 0, None) * np.clip(z[:, 3] - z[:, 1], 0, None)


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[len(a), len(b)]`` IoU of boxes (x0, y0, x1, y1); 0 where the union is empty."""
    a, b = np.asarray(a, dtype=np.float64).reshape(-1, 4), np.asarray(b, dtype=np.float64).reshape(-1, 4)
    ix = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
    iy = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None)
    inter = ix * iy
    union = _area(a)[:, None] + _area(b)[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def match(iou: np.ndarray, threshold: float = 0.5) -> int:
    """Greedy matches: pairs by decreasing IoU, each box once, IoU >= ``threshold``; their count."""
    if iou.size == 0:
        return 0
    order = np.argsort(-iou, axis=None, kind="stable")
    used_r, used_p, n = set(), set(), 0
    for flat in order.tolist():
        r, p = divmod(flat, iou.shape[1])
        if iou[r, p] < threshold:
            break
        if r not in used_r and p not in used_p:
            used_r.add(r)
            used_p.add(p)
            n += 1
    return n


class _Boxes:
    """Reference and predicted boxes of one sample, as the module docstring says."""

    higher_is_better = True
    name = "detector"

    def __init__(
        self, iou_threshold: float = 0.5, score_threshold: float = 0.5, map_threshold: float = 0.3
    ) -> None:
        self.iou_threshold, self.score_threshold, self.map_threshold = (
            iou_threshold,
            score_threshold,
            map_threshold,
        )
        self.samples = 0

    def _pair(
        self, float_outputs: list[np.ndarray], quant_outputs: list[np.ndarray], feed: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        if not float_outputs or not quant_outputs:
            raise MetricError(f"metric {self.name}: sample {self.samples}: a model gave no output.")
        kw = {"score_threshold": self.score_threshold, "map_threshold": self.map_threshold}
        if "boxes" in feed:
            ref = np.asarray(feed["boxes"], dtype=np.float64).reshape(-1, 4)
        else:
            ref = boxes_from_output(float_outputs[0], **kw)
        self.samples += 1
        return ref, boxes_from_output(quant_outputs[0], **kw)

    def _check(self) -> None:
        if not self.samples:
            raise MetricError(f"metric {self.name}: no sample was given; feed at least one.")


class MeanIoU(_Boxes):
    """Mean over reference boxes of their best IoU with a predicted box."""

    name = "mean-iou"

    def __init__(self, **kw: float) -> None:
        super().__init__(**kw)
        self.total, self.boxes, self.predicted = 0.0, 0, 0

    def update(
        self, float_outputs: list[np.ndarray], quant_outputs: list[np.ndarray], feed: Mapping[str, np.ndarray]
    ) -> None:
        ref, pred = self._pair(float_outputs, quant_outputs, feed)
        iou = iou_matrix(ref, pred)
        self.total += float(iou.max(axis=1).sum()) if pred.size else 0.0
        self.boxes += len(ref)
        self.predicted += len(pred)

    def result(self) -> float:
        self._check()
        if not self.boxes:
            return 1.0 if not self.predicted else 0.0
        return self.total / self.boxes


class BoxF1(_Boxes):
    """F1 of greedy IoU >= 0.5 matches between predicted and reference boxes over all samples."""

    name = "box-f1"

    def __init__(self, **kw: float) -> None:
        super().__init__(**kw)
        self.tp, self.ref, self.pred = 0, 0, 0

    def update(
        self, float_outputs: list[np.ndarray], quant_outputs: list[np.ndarray], feed: Mapping[str, np.ndarray]
    ) -> None:
        ref, pred = self._pair(float_outputs, quant_outputs, feed)
        self.tp += match(iou_matrix(ref, pred), self.iou_threshold)
        self.ref += len(ref)
        self.pred += len(pred)

    def result(self) -> float:
        self._check()
        return 1.0 if self.ref + self.pred == 0 else 2 * self.tp / (self.ref + self.pred)
