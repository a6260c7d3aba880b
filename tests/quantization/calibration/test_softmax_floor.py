"""Softmax inputs are calibrated on max(x, rowmax - 20): the attention mask's -10000 no longer sets the
grid of the scores, on every path (ORT placement, the targets' rules, any calibration method)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import zonnx
from tests.quantization.test_placement import _block_feeds, _encoder_block
from zonnx.build_npu import target_quantize_kwargs
from zonnx.quantization.calibration.collector import collect
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.calibration.softmax_floor import FLOOR, softmax_axes


def _cosine(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> float:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    f = ort.InferenceSession(_encoder_block().SerializeToString(), so, providers=["CPUExecutionProvider"])
    q = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    a = np.concatenate([f.run(None, x)[0].ravel() for x in feeds])
    b = np.concatenate([q.run(None, x)[0].ravel() for x in feeds])
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_the_masked_scores_are_measured_from_their_rows_maximum() -> None:
    model, feeds = _encoder_block(), _block_feeds(3)
    assert softmax_axes(model.graph, ["sm", "s", "ln"], 17) == {"sm": -1}  # only Softmax reads "sm"
    assert softmax_axes(model.graph, ["sm"], 12) == {}  # before opset 13 Softmax flattens to 2-D
    stats = collect(model, ["sm", "s"], ListReader(feeds))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    model.graph.output.append(onnx.ValueInfoProto(name="sm"))
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    sm = np.stack([sess.run(["sm"], x)[0] for x in feeds])
    floored = np.maximum(sm, sm.max(axis=-1, keepdims=True) - FLOOR)
    assert sm.min() < -9000  # the mask is there
    assert stats["sm"].min == pytest.approx(floored.min(), abs=1e-4)
    assert stats["sm"].max == pytest.approx(sm.max(), abs=1e-4)
    assert stats["s"].min > -100  # the unmasked scores were never floored


@pytest.mark.parametrize("target", ["bm1684x", "zhouyi-x2"])
def test_a_masked_attention_block_keeps_its_output_on_a_target(target: str) -> None:
    """Symmetric int8 over [-10000, 10] gave the scores a step of 78 (measured before the rule: output
    cosine 0.62 on bm1684x, the trained bert_encoder's logits 0.70)."""
    feeds = _block_feeds(6)
    result = zonnx.quantize_static(
        _encoder_block(), None, ListReader(feeds[:4]), **target_quantize_kwargs(target)
    )
    assert _cosine(result.model, feeds[4:]) > 0.99
