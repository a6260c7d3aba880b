"""The known traps on real models: a detection head's boxes next to sigmoid scores, a BERT residual stream."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import zonnx
from zonnx import zoo
from zonnx.build_npu import target_quantize_kwargs
from zonnx.errors import OptionError
from zonnx.inspection.macs import fix_input_shapes
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.traps import mixed_range_concat, residual_stream_nodes
from zonnx.verify import ort_session

HEAD = """
<ir_version: 8, opset_import: ["" : 13]>
head (float[1, 4, 8] t, float[1, 3, 8] s) => (float[1, 7, 8] y, float[1, 6, 8] z) {
    k = Constant <value = float[1] {16.0}> ()
    box = Mul (t, k)
    score = Sigmoid (s)
    y = Concat <axis = 1> (box, score)
    score2 = Sigmoid (s)
    z = Concat <axis = 1> (score, score2)
}
"""


def _static(name: str, shapes: dict | None = None) -> onnx.ModelProto:
    model = onnx.load(zoo.get(name))
    fix_input_shapes(model, 1, shapes)
    return zonnx.optimize(model)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a.ravel(), b.ravel()) / np.linalg.norm(a) / np.linalg.norm(b))


def test_mixed_range_concat_names_only_the_boxes_next_to_scores() -> None:
    model = ir.from_proto(onnx.parser.parse_model(HEAD))
    reasons = {n.outputs[0].name: mixed_range_concat(n) for n in model.graph if n.op_type == "Concat"}
    assert reasons["y"] is not None and "detection-head trap" in reasons["y"]
    assert reasons["z"] is None  # scores with scores share a grid for free


def test_detector_scores_keep_their_own_grid_on_the_dpu() -> None:
    """yolo_det on dpu-b4096 (power-of-two, concat aligned): the scores Concat stays float, both branches
    keep cosine >= 0.995 (0.85 on the scores when the Concat shared the boxes' grid)."""
    src = _static("yolo_det")
    feeds = zoo.sample_inputs("yolo_det", 16, seed=3)
    result = zonnx.quantize_static(src, None, ListReader(feeds[:8]), **target_quantize_kwargs("dpu-b4096"))
    trapped = [n for n, why in result.plan.skipped.items() if "detection-head trap" in why]
    assert len(trapped) == 1
    ref = np.concatenate([ort_session(src).run(None, f)[0] for f in feeds[8:]])
    got = np.concatenate([ort_session(result.model).run(None, f)[0] for f in feeds[8:]])
    assert _cos(got[..., :4], ref[..., :4]) > 0.999
    assert _cos(got[..., 4:], ref[..., 4:]) > 0.995


@pytest.fixture(scope="module")
def bert() -> onnx.ModelProto:
    return _static("bert_encoder-random", {"input_ids": (1, 128), "attention_mask": (1, 128)})


def test_residual_stream_nodes_are_the_layernorms_and_the_adds_feeding_them(bert: onnx.ModelProto) -> None:
    model = ir.from_proto(bert)
    names = residual_stream_nodes(model)
    ops = {n.name: n.op_type for n in model.graph}
    assert sorted(ops[n] for n in names).count("LayerNormalization") == 13  # embeddings + 2 per layer
    assert [ops[n] for n in names].count("Add") == 12  # the residual Adds (not the mask Add)


def test_residual_stream_16_lifts_bert_on_zhouyi(bert: onnx.ModelProto) -> None:
    """zhouyi-x2 takes int16: the recipe's ResidualStream16 doubles the centered embedding cosine."""
    feeds = zoo.sample_inputs("bert_encoder-random", 12, seed=3)
    ref = np.concatenate([ort_session(bert).run(None, f)[0] for f in feeds[8:]])
    centered = {}
    for stream in (False, True):
        kwargs = target_quantize_kwargs("zhouyi-x2")
        assert kwargs["extra_options"]["ResidualStream16"] is True
        kwargs["extra_options"]["ResidualStream16"] = stream
        model = zonnx.quantize_static(bert, None, ListReader(feeds[:8]), **kwargs).model
        got = np.concatenate([ort_session(model).run(None, f)[0] for f in feeds[8:]])
        a, b = got - ref.mean(0), ref - ref.mean(0)
        centered[stream] = float(
            np.mean(np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))
        )
    assert centered[True] > centered[False] + 0.15, centered


def test_residual_stream_16_is_refused_for_an_int8_only_target() -> None:
    kwargs = target_quantize_kwargs("bm1684x")
    assert "ResidualStream16" not in kwargs["extra_options"]
    kwargs["extra_options"]["ResidualStream16"] = True
    model = onnx.parser.parse_model(HEAD)
    feeds = [{"t": np.ones((1, 4, 8), np.float32), "s": np.zeros((1, 3, 8), np.float32)}]
    with pytest.raises(OptionError, match="ResidualStream16.*bm1684x"):
        zonnx.quantize_static(model, None, ListReader(feeds), **kwargs)
