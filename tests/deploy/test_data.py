"""Datasets and the label metric of the config build: built-ins, plugins, and the errors they give."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from zonnx import zoo
from zonnx.deploy.data import LabelAccuracy, calibration_samples, eval_samples, make_metric
from zonnx.errors import MetricError, OptionError


def test_label_accuracy_counts_rows() -> None:
    m = LabelAccuracy()
    logits = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]], np.float32)
    m.update([logits], [logits], {"label": np.array([1, 1, 1])})
    assert m.result() == pytest.approx(2 / 3)
    with pytest.raises(MetricError, match="no 'label' array"):
        LabelAccuracy().update([logits], [logits], {})


def test_label_accuracy_top5_on_the_digits_cnn() -> None:
    from zonnx.verify import ort_session

    sess = ort_session(str(zoo.get("digits_cnn")))
    samples = eval_samples("digits", "digits_cnn", str(zoo.get("digits_cnn")), 64)
    top1, top5 = make_metric("accuracy", None), make_metric("accuracy-top5", None)
    worst = LabelAccuracy(10)  # every class: always right
    for s in samples:
        out = sess.run(None, {"input": s["input"]})
        for m in (top1, top5, worst):
            m.update(out, out, s)
    assert 0.9 <= top1.result() <= top5.result() and worst.result() == 1.0
    logits = np.array([[9.0, 8, 7, 6, 5, 4, 3, 2, 1, 0]])  # class 4 ranked 5th, class 5 6th
    five = LabelAccuracy(5)
    for label in (4, 5):
        five.update([logits], [logits], {"label": np.array([label])})
    assert five.result() == 0.5


def test_digits_samples_carry_labels_and_calibration_never_uses_them() -> None:
    model = str(zoo.get("digits_cnn"))
    samples = eval_samples("digits", "digits_cnn", model, 20)
    assert len(samples) == 20 and set(samples[0]) == {"input", "label"}
    calib = calibration_samples("", "digits", "digits_cnn", model, 8)
    assert len(calib) == 8 and set(calib[0]) == {"input"}
    assert not any(np.array_equal(c["input"], s["input"]) for c in calib for s in samples)
    metric = make_metric("accuracy", model)
    assert isinstance(metric, LabelAccuracy)


def test_a_dataset_plugin_and_its_errors_name_the_file_and_line(tmp_path: Path) -> None:
    model = str(zoo.get("digits_cnn"))
    plugin = tmp_path / "data.py"
    plugin.write_text(
        "import numpy as np\n"
        "def good(model_path, n):\n"
        "    return [{'input': np.zeros((1, 1, 8, 8), np.float32)} for _ in range(n)]\n"
        "def bad(model_path, n):\n"
        "    raise ValueError('no images here')\n"
        "def wrong(model_path, n):\n"
        "    return [{'image': np.zeros((1, 8, 8), np.float32)}]\n"
    )
    assert len(eval_samples(f"{tmp_path}/data.py:good", "x", model, 3)) == 3
    with pytest.raises(OptionError, match=rf"dataset plugin {plugin}:5: raised ValueError: no images here"):
        eval_samples(f"{tmp_path}/data.py:bad", "x", model, 3)
    with pytest.raises(OptionError, match="no array for model input 'input'"):
        eval_samples(f"{tmp_path}/data.py:wrong", "x", model, 3)
    with pytest.raises(OptionError, match="has no 'missing'"):
        eval_samples(f"{tmp_path}/data.py:missing", "x", model, 3)


def test_text_lines_fit_a_model_with_a_static_width(tmp_path: Path) -> None:
    """PP-OCR rec with its width fixed to 320: evaluation and calibration lines are resized to height 48
    and zero-padded (or squeezed) to 320; with the dynamic width each line keeps its own width."""
    import onnx

    from zonnx.converters.from_onnx import set_input_dims

    dynamic = str(zoo.get("ppocr_rec"))
    fixed = tmp_path / "rec_320.onnx"
    onnx.save(set_input_dims(onnx.load(dynamic), {"x": (1, 3, 48, 320)}), fixed)
    own = eval_samples("text-lines", "ppocr_rec", dynamic, 24)
    widths = [s["x"].shape[-1] for s in own]
    assert min(widths) == 320 and max(widths) > 320  # some lines are longer than 320 at height 48
    lines = eval_samples("text-lines", "ppocr_rec", str(fixed), 24)
    assert {s["x"].shape for s in lines} == {(1, 3, 48, 320)}
    calib = calibration_samples("", "text-lines", "ppocr_rec", str(fixed), 8)
    assert {s["x"].shape for s in calib} == {(1, 3, 48, 320)}
    for a, b in zip(own, lines, strict=True):
        if a["x"].shape[-1] == 320:
            np.testing.assert_array_equal(a["x"], b["x"])  # a short line: the same padded array
        else:  # a long line, squeezed: ink reaches the right edge instead of zero padding
            assert np.abs(b["x"][..., -4:]).max() > 0
