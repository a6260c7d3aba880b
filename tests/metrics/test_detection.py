"""Detector metrics: regions of a probability map, IoU, greedy matching, and PP-OCR det on rendered pages."""

from __future__ import annotations

import numpy as np
import pytest

from zonnx import zoo
from zonnx.errors import MetricError
from zonnx.metrics import BoxF1, MeanIoU, load_metric
from zonnx.metrics.detection import boxes_from_output, iou_matrix, match, regions
from zonnx.verify import ort_session
from zonnx.zoo.text_images import det_samples


def test_regions_are_4_connected_and_small_ones_dropped() -> None:
    m = np.zeros((8, 10), dtype=bool)
    m[1:3, 1:4] = True  # 6 pixels
    m[3, 4] = True  # touches the first only at a corner: its own region, 1 pixel, dropped
    m[4:7, 6:8] = True  # 6 pixels
    m[6, 5] = True  # joins the second through an edge
    np.testing.assert_array_equal(regions(m), [[1, 1, 4, 3], [5, 4, 8, 7]])
    assert regions(m, min_pixels=1).shape == (3, 4)


def test_iou_and_greedy_matching() -> None:
    a = np.array([[0, 0, 10, 10], [20, 0, 30, 10]])
    b = np.array([[5, 0, 15, 10], [20, 0, 30, 10], [100, 100, 110, 110]])
    iou = iou_matrix(a, b)
    np.testing.assert_allclose(iou, [[1 / 3, 0, 0], [0, 1, 0]])
    assert match(iou, 0.5) == 1 and match(iou, 0.3) == 2
    # rows with a score: the low-score row is dropped
    rows = np.array([[[0, 0, 10, 10, 0.9], [5, 0, 15, 10, 0.2]]])
    np.testing.assert_array_equal(boxes_from_output(rows), [[0, 0, 10, 10]])
    f1 = BoxF1()
    f1.update([a], [b], {})
    assert f1.result() == pytest.approx(2 * 1 / (2 + 3))
    with pytest.raises(MetricError, match=r"first output is \[2, 3, 8, 8\]"):
        boxes_from_output(np.zeros((2, 3, 8, 8)))


def test_ppocr_det_against_ground_truth_and_float() -> None:
    sess = ort_session(str(zoo.get("ppocr_det")))
    pages = det_samples(3)
    outs = [sess.run(None, feed) for _, feed in pages]
    # against the float model itself: perfect agreement
    for name in ("mean-iou", "box-f1"):
        metric = load_metric(name)
        for (_, feed), out in zip(pages, outs, strict=True):
            metric.update(out, out, feed)
        assert metric.result() == 1.0
    # against the rendered pages' true boxes: DB maps are shrunk text boxes, so IoU is well below 1
    miou, f1 = MeanIoU(), BoxF1()
    best = []
    for (boxes, feed), out in zip(pages, outs, strict=True):
        labelled = {**feed, "boxes": np.array(boxes)}
        miou.update(out, out, labelled)
        f1.update(out, out, labelled)
        best += list(iou_matrix(np.array(boxes), boxes_from_output(out[0])).max(axis=1))
    assert len(best) == sum(len(b) for b, _ in pages) >= 3
    assert miou.result() == pytest.approx(np.mean(best)) and 0.5 < miou.result() < 0.9
    assert f1.result() == 1.0  # every line found at IoU >= 0.5
    # a page shifted 40 pixels right: the float model's boxes move, agreement drops
    shifted = [sess.run(None, {"x": np.roll(feed["x"], 40, axis=3)}) for _, feed in pages]
    agree = MeanIoU()
    for (_, feed), out, moved in zip(pages, outs, shifted, strict=True):
        agree.update(out, moved, feed)
    assert 0.0 < agree.result() < 0.9
