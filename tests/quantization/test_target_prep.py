"""Quantizing for a target folds PP-LCNetV3's affine blocks into the convolutions and fuses paddle2onnx's
four-node hard-swish (``prepare.TARGET_PREP_PASSES``), on the PP-OCRv4 rec model of the rapidocr wheel."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import zonnx
from zonnx import zoo
from zonnx.build_npu import target_quantize_kwargs
from zonnx.compare import compare_models
from zonnx.quantization import prepare
from zonnx.quantization.api import QuantizeResult
from zonnx.quantization.calibration.readers import ListReader
from zonnx.tools.quantize_summary import summary_table
from zonnx.zoo.text_images import char_accuracy, ctc_greedy_decode, rec_samples

#: rapidocr's width for lines up to 6.7:1, so every line has the same shape (one calibration shape)
_SHAPE = (1, 3, 48, 320)


def _lines(n: int, seed: int) -> list[tuple[str, dict[str, np.ndarray]]]:
    return [(t, f) for t, f in rec_samples(3 * n, seed=seed) if f["x"].shape == _SHAPE][:n]


def _accuracy(model: onnx.ModelProto | str, lines: list[tuple[str, dict[str, np.ndarray]]]) -> float:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    preds = [p for _, f in lines for p in ctc_greedy_decode(sess.run(None, f)[0])]
    return char_accuracy(preds, [t for t, _ in lines])


@pytest.fixture(scope="module")
def data() -> dict[str, list]:
    return {"calib": [f for _, f in _lines(16, seed=11)], "test": _lines(40, seed=12)}


def _quantize(calib: list, target: str | None, bias_correction: bool | None = None) -> QuantizeResult:
    """The ``zonnx quantize [--target T]`` recipe (``bias_correction``: its BiasCorrection set so)."""
    kwargs = target_quantize_kwargs(target) if target else {"per_channel": True}
    if bias_correction is not None:
        kwargs["extra_options"]["BiasCorrection"] = bias_correction
    return zonnx.quantize_static(zoo.get("ppocr_rec"), None, ListReader(calib), **kwargs)


def test_zhouyi_quantization_fuses_and_gains_accuracy(data, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        result = _quantize(data["calib"], "zhouyi-x2")
    # the model ships at opset 12: one line says it went to 14, and why
    upgrades = [r.getMessage() for r in caplog.records if "upgrading the model" in r.getMessage()]
    assert upgrades == [
        "upgrading the model from opset 12 to 14 for quantization (14 for its hard-swish, one NPU operation)"
    ]
    fused = result.model
    ops = Counter(n.op_type for n in fused.graph.node)
    opset = next(o.version for o in fused.opset_import if o.domain in ("", "ai.onnx"))
    # 28 hard-swishes (opset 14 for HardSwish), no Clip/Div left of them; the 28 affine blocks after the
    # convolutions are folded, the 13 before a padded convolution keep one Add each
    assert ops["HardSwish"] == 28 and ops["Clip"] == 0 and opset >= 14
    # the summary says what the preparation changed
    assert result.target_prep["fused HardSwish"] == 28 and result.target_prep["folded Mul after Conv"] == 28
    rows = dict(
        zip(*[list(c.cells) for c in summary_table(result, 1.0, Path("q.onnx")).columns], strict=True)
    )
    assert "fused HardSwish x28" in rows["target preparation"]
    # the recipe's bias correction lowered the output SQNR on these 16 lines (13.06 -> 12.36 dB), so it
    # was undone and said so; kept, it read 0.974 on the test lines
    record = result.recovery["bias_correction"]
    assert record.undone and record.sqnr_after < record.sqnr_before
    assert any("so it was undone" in r.getMessage() for r in caplog.records)
    uncorrected = _quantize(data["calib"], "zhouyi-x2", bias_correction=False).model
    assert fused.graph.SerializeToString() == uncorrected.graph.SerializeToString()
    with monkeypatch.context() as m:  # the same call with the preparation of an untargeted quantization
        m.setattr(prepare, "prep_passes", lambda target: prepare.PREP_PASSES)
        pieces = _quantize(data["calib"], "zhouyi-x2", bias_correction=False).model
    assert Counter(n.op_type for n in pieces.graph.node)["HardSwish"] == 0
    float_acc = _accuracy(zoo.get("ppocr_rec"), data["test"])
    acc, acc_pieces = _accuracy(fused, data["test"]), _accuracy(pieces, data["test"])
    # measured: float 1.0, fused 0.996, pieces 0.894 (40 lines, 16 calibration lines; without bias
    # correction for both: with it the pieces read 0.994, which hides what fusing buys)
    assert acc >= acc_pieces + 0.03 and acc >= float_acc - 0.02, (float_acc, acc, acc_pieces)


def test_untargeted_quantization_keeps_the_model_as_exported(data) -> None:
    result = _quantize(data["calib"][:4], None)
    ops = Counter(n.op_type for n in result.model.graph.node)
    assert ops["HardSwish"] == 0 and ops["Div"] >= 28 and result.target_prep is None


def test_folded_tensors_pair_with_the_float_tensors_they_equal(data, tmp_path: Path) -> None:
    """A folded convolution output keeps the name of the Add it absorbed, a fused hard-swish that of the
    Div it ends with, so comparing with the float model as exported pairs tensors of the same meaning."""
    onnx.save(_quantize(data["calib"][:4], "dpu-b4096").model, tmp_path / "q.onnx")
    result = compare_models(zoo.get("ppocr_rec"), tmp_path / "q.onnx", data["test"][0][1])
    rows = {r.tensor: r for r in result.rows}
    producers = {o: n.op_type for n in onnx.load(zoo.get("ppocr_rec")).graph.node for o in n.output}
    # the first block: Conv -> Mul -> Add (folded), then the hard-swish ending in Div (fused)
    assert producers["p2o.Add.3"] == "Add" and producers["hardswish_30.tmp_0"] == "Div"
    assert rows["p2o.Add.3"].cosine > 0.99 and rows["hardswish_30.tmp_0"].cosine > 0.99
    hardswish_outputs = [t for t, op in producers.items() if op == "Div" and t.startswith("hardswish_")]
    assert len(hardswish_outputs) == 28 and all(t in rows for t in hardswish_outputs)
