"""Built-in metrics on real ORT runs: the digits CNN vs its quantized form, PP-OCR rec vs a Conv-quantized copy."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import zonnx
from zonnx import zoo
from zonnx.errors import MetricError, OptionError
from zonnx.metrics import CharAccuracy, evaluate, load_metric, model_characters
from zonnx.metrics.evaluate import FloatReference
from zonnx.quantization.calibration.readers import ListReader
from zonnx.verify import cosine, run_ort
from zonnx.zoo.digits import digits_data
from zonnx.zoo.text_images import ctc_greedy_decode, rec_samples


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Float digits CNN, its int8 QDQ form (zonnx.quantize_static), 4 test batches of 16 and both outputs."""
    d = tmp_path_factory.mktemp("metrics")
    flt = str(zoo.get("digits_cnn"))
    calib, _ = digits_data("calib")
    quant = str(d / "q.onnx")
    zonnx.quantize_static(flt, quant, ListReader([{"input": calib[i : i + 1]} for i in range(16)]))
    test, _ = digits_data("test")
    feeds = [{"input": test[16 * i : 16 * (i + 1)]} for i in range(4)]
    fx = [run_ort(flt, f)["logits"].astype(np.float64) for f in feeds]
    qx = [run_ort(quant, f)["logits"].astype(np.float64) for f in feeds]
    return {"float": flt, "quant": quant, "feeds": feeds, "fx": fx, "qx": qx}


def test_cosine_is_the_mean_per_sample_cosine(digits) -> None:
    f, q, feeds = digits["float"], digits["quant"], digits["feeds"]
    assert evaluate(f, f, feeds, "cosine") == pytest.approx(1.0, abs=1e-12)
    got = evaluate(f, q, feeds, "cosine")
    expected = np.mean([cosine(a, b) for a, b in zip(digits["fx"], digits["qx"], strict=True)])
    assert got == pytest.approx(expected, rel=1e-12)
    assert 0.99 < got < 1.0


def test_sqnr_in_db_over_all_samples(digits) -> None:
    f, q, feeds = digits["float"], digits["quant"], digits["feeds"]
    assert evaluate(f, f, feeds, "sqnr") == math.inf
    signal = sum(float(np.sum(a * a)) for a in digits["fx"])
    noise = sum(float(np.sum((a - b) ** 2)) for a, b in zip(digits["fx"], digits["qx"], strict=True))
    got = evaluate(f, q, feeds, "sqnr")
    assert got == pytest.approx(10 * math.log10(signal / noise), rel=1e-9)
    assert 20 < got < 60


def test_top1_agreement_with_float(digits) -> None:
    f, q, feeds = digits["float"], digits["quant"], digits["feeds"]
    assert evaluate(f, f, feeds, "top1") == 1.0
    agree = sum(
        int(np.sum(a.argmax(-1) == b.argmax(-1))) for a, b in zip(digits["fx"], digits["qx"], strict=True)
    )
    got = evaluate(f, q, feeds, load_metric("top1"))
    assert got == agree / 64 and got >= 0.9
    # a model whose logits are reversed disagrees: argmin of float's logits is never its argmax
    metric = load_metric("top1")
    for x, fl in zip(feeds, digits["fx"], strict=True):
        metric.update([fl], [-fl], x)
    assert metric.result() == 0.0


def test_top5_agreement_with_float(digits) -> None:
    f, q, feeds = digits["float"], digits["quant"], digits["feeds"]
    assert evaluate(f, f, feeds, "top5") == 1.0
    assert evaluate(f, q, feeds, "top5") >= evaluate(f, q, feeds, "top1")
    # float's class ranked 3rd by the other model counts for top5, not top1; reversed logits never count
    metric, top1 = load_metric("top5"), load_metric("top1")
    for x, fl in zip(feeds, digits["fx"], strict=True):
        other = fl.copy()
        rows = np.arange(len(fl))
        other[rows, fl.argmax(-1)] = np.sort(fl, axis=-1)[:, -3]  # now tied 2nd/3rd: still in the top 5
        metric.update([fl], [other], x)
        top1.update([fl], [other], x)
    assert metric.result() == 1.0 and top1.result() < 0.5
    reversed_top5 = load_metric("top5")
    for x, fl in zip(feeds, digits["fx"], strict=True):
        reversed_top5.update([fl], [-fl], x)
    assert reversed_top5.result() == 0.0


def test_builtins_refuse_outputs_that_do_not_pair(digits) -> None:
    metric = load_metric("cosine")
    with pytest.raises(MetricError, match=r"output 0 has shape \[16, 10\] in the float model and \[16, 9\]"):
        metric.update([digits["fx"][0]], [digits["qx"][0][:, :9]], {})
    with pytest.raises(MetricError, match="metric sqnr: no sample was given"):
        load_metric("sqnr").result()
    with pytest.raises(OptionError, match="no array for input 'input' of the float model"):
        evaluate(digits["float"], digits["quant"], [{"x": np.zeros((1, 1, 8, 8), np.float32)}], "cosine")


def test_cosine_and_sqnr_leave_integer_outputs_out(digits, tmp_path: Path) -> None:
    """A model that also gives its ArgMax index: cosine and sqnr measure only the logits (an index one off
    is not a small error), the search's trials get the same SQNR, and an index-only model is refused."""
    import onnx
    from onnx import helper

    fx, qx = digits["fx"][0], digits["qx"][0]
    index = np.argmax(fx, axis=1)[:, None]
    moved = (index + 1) % 10  # every index off: would swamp the logits' closeness if it counted
    for name in ("cosine", "sqnr"):
        both, logits_only = load_metric(name), load_metric(name)
        both.update([fx, index], [qx, moved], {})
        logits_only.update([fx], [qx], {})
        assert both.result() == pytest.approx(logits_only.result(), rel=1e-12)
        with pytest.raises(
            MetricError, match=f"metric {name}: the model has no floating-point output .*int64"
        ):
            load_metric(name).update([index], [moved], {})
    # FloatReference.score_with_sqnr: the trials' SQNR is the sqnr metric's
    model = onnx.load(digits["float"])
    graph = model.graph
    graph.node.append(helper.make_node("ArgMax", ["logits"], ["label"], axis=1, name="label_argmax"))
    graph.output.append(helper.make_tensor_value_info("label", onnx.TensorProto.INT64, None))
    path = tmp_path / "with_label.onnx"
    onnx.save(model, path)
    ref = FloatReference(str(path), digits["feeds"], "cosine", str(path))
    _, sqnr = ref.score_with_sqnr(str(path))
    assert sqnr == math.inf
    del graph.output[0]  # the index alone
    only = tmp_path / "label_only.onnx"
    onnx.save(model, only)
    assert FloatReference(str(only), digits["feeds"], "top1", str(only)).score_with_sqnr(str(only))[1] is None


def test_unknown_builtin_suggests_the_name() -> None:
    with pytest.raises(MetricError, match="not a built-in metric. Did you mean 'cosine'?"):
        load_metric("cosin")


@pytest.fixture(scope="module")
def rec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """PP-OCRv4 rec, a copy with its Conv layers quantized per channel, 4 rendered lines with their text."""
    flt = str(zoo.get("ppocr_rec"))
    quant = str(tmp_path_factory.mktemp("rec") / "rec_conv_int8.onnx")
    calib = [feed for _, feed in rec_samples(2, seed=1)]
    zonnx.quantize_static(flt, quant, ListReader(calib), op_types_to_quantize=["Conv"], per_channel=True)
    samples = rec_samples(4)
    return {"float": flt, "quant": quant, "labels": [t for t, _ in samples], "feeds": [f for _, f in samples]}


def test_char_accuracy_of_float_vs_itself_is_one(rec) -> None:
    metric = load_metric("char-accuracy", rec["float"])
    assert evaluate(rec["float"], rec["float"], rec["feeds"], metric) == 1.0
    assert metric.scores == {"strict": 1.0, "stripped": 1.0}


def test_char_accuracy_of_quantized_rec(rec) -> None:
    metric = load_metric("char-accuracy", rec["float"])
    strict = evaluate(rec["float"], rec["quant"], rec["feeds"], metric)
    assert 0.5 < strict <= metric.scores["stripped"] <= 1.0 and strict == metric.scores["strict"]
    # the same score by hand: decode both models, edit distance over the float text's length
    chars = model_characters(rec["float"])
    ref = [ctc_greedy_decode(next(iter(run_ort(rec["float"], f).values())), chars)[0] for f in rec["feeds"]]
    got = [ctc_greedy_decode(next(iter(run_ort(rec["quant"], f).values())), chars)[0] for f in rec["feeds"]]
    from zonnx.zoo.text_images import edit_distance

    edits = sum(edit_distance(g, r) for g, r in zip(got, ref, strict=True))
    assert strict == pytest.approx(1 - edits / sum(map(len, ref)))
    stripped = evaluate(
        rec["float"], rec["quant"], rec["feeds"], load_metric("char-accuracy-stripped", rec["float"])
    )
    assert stripped == metric.scores["stripped"]
    labelled = CharAccuracy(chars, labels=rec["labels"])
    against_labels = evaluate(rec["float"], rec["quant"], rec["feeds"], labelled)
    assert 0.0 <= against_labels <= labelled.scores["stripped"] <= 1.0


def test_char_accuracy_needs_the_character_list(digits, rec) -> None:
    with pytest.raises(MetricError, match="has no 'character' metadata"):
        load_metric("char-accuracy", digits["float"])
    metric = CharAccuracy(model_characters(rec["float"]))
    with pytest.raises(MetricError, match=r"first output is \[16, 10\]; expected \[N, T, 6625\]"):
        metric.update([digits["fx"][0]], [digits["qx"][0]], {})
    short = CharAccuracy(model_characters(rec["float"]), labels=["one"])
    with pytest.raises(MetricError, match="1 label"):
        evaluate(rec["float"], rec["float"], rec["feeds"][:2], short)


def _plugin(tmp_path: Path, body: str, name: str = "my_metric.py") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def test_plugin_runs_and_gets_the_model_path(tmp_path: Path, digits) -> None:
    path = _plugin(
        tmp_path,
        "import numpy as np\n"
        "class MaxAbs:\n"
        "    higher_is_better = False\n"
        "    def __init__(self, model_path=None):\n"
        "        self.model_path, self.worst = model_path, 0.0\n"
        "    def update(self, float_outputs, quant_outputs, feed):\n"
        "        self.worst = max(self.worst, float(np.abs(float_outputs[0] - quant_outputs[0]).max()))\n"
        "    def result(self):\n"
        "        return self.worst\n",
    )
    metric = load_metric(f"{path}:MaxAbs", digits["float"])
    assert metric.higher_is_better is False and metric.inner.model_path == digits["float"]
    got = evaluate(digits["float"], digits["quant"], digits["feeds"], metric)
    expected = max(float(np.abs(a - b).max()) for a, b in zip(digits["fx"], digits["qx"], strict=True))
    assert got == pytest.approx(expected, rel=1e-6) and got > 0


def test_plugin_that_raises_names_file_and_line(tmp_path: Path, digits) -> None:
    path = _plugin(
        tmp_path,
        "class Bad:\n"
        "    def update(self, float_outputs, quant_outputs, feed):\n"
        "        self.helper()\n"
        "    def helper(self):\n"
        "        return 1 / 0\n"
        "    def result(self):\n"
        "        return 1.0\n",
    )
    with pytest.raises(MetricError) as err:
        evaluate(digits["float"], digits["quant"], digits["feeds"], f"{path}:Bad")
    message = str(err.value)
    assert f"{path}:5: update() raised ZeroDivisionError: division by zero" in message
    assert "\n" not in message


def test_plugin_results_that_are_not_numbers_are_refused(tmp_path: Path, digits) -> None:
    path = _plugin(
        tmp_path,
        "class Text:\n"
        "    def update(self, f, q, feed): pass\n"
        "    def result(self): return 'good'\n"
        "class Nan:\n"
        "    def update(self, f, q, feed): pass\n"
        "    def result(self): return float('nan')\n",
    )
    feeds = digits["feeds"][:1]
    with pytest.raises(
        MetricError, match=r"Text: result\(\) returned 'good' \(str\); return one real number"
    ):
        evaluate(digits["float"], digits["quant"], feeds, f"{path}:Text")
    with pytest.raises(MetricError, match=r"result\(\) returned NaN"):
        evaluate(digits["float"], digits["quant"], feeds, f"{path}:Nan")


def test_plugin_loading_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(MetricError, match=r"missing.py: no such file"):
        load_metric(f"{tmp_path / 'missing.py'}:M")
    path = _plugin(
        tmp_path, "class Metric1:\n    def update(self, f, q, feed): pass\n    def result(self): return 1\n"
    )
    with pytest.raises(MetricError, match="no class 'Metric2'. Did you mean 'Metric1'?"):
        load_metric(f"{path}:Metric2")
    broken = _plugin(tmp_path, "x = 1\nclass M(:\n    pass\n", "broken.py")
    with pytest.raises(MetricError, match=rf"{broken}:2: importing it raised SyntaxError"):
        load_metric(f"{broken}:M")
    no_result = _plugin(tmp_path, "class M:\n    def update(self, f, q, feed): pass\n", "half.py")
    with pytest.raises(MetricError, match=r"has no result\(\) method"):
        load_metric(f"{no_result}:M")
    ctor = _plugin(
        tmp_path,
        "class M:\n    def __init__(self):\n        raise KeyError('cfg')\n"
        "    def update(self, f, q, feed): pass\n    def result(self): return 1\n",
        "ctor.py",
    )
    with pytest.raises(MetricError, match=rf"{ctor}:3: M\(\) raised KeyError"):
        load_metric(f"{ctor}:M")


def test_counting_metrics_give_their_step_and_continuous_ones_none(digits, rec) -> None:
    reference = FloatReference(digits["float"], digits["feeds"], "top1")
    assert reference.self_score() == (1.0, 1 / 64)  # 4 batches of 16 class positions
    assert FloatReference(digits["float"], digits["feeds"], "top5").self_score()[1] == 1 / 64
    assert FloatReference(digits["float"], digits["feeds"], "cosine").self_score()[1] is None
    chars = model_characters(rec["float"])
    ref = [ctc_greedy_decode(next(iter(run_ort(rec["float"], f).values())), chars)[0] for f in rec["feeds"]]
    strict = FloatReference(rec["float"], rec["feeds"], "char-accuracy", rec["float"])
    assert strict.self_score()[1] == 1 / sum(map(len, ref))  # one character of float's text
    stripped = FloatReference(rec["float"], rec["feeds"], "char-accuracy-stripped", rec["float"])
    assert stripped.self_score()[1] == 1 / sum(len(r.strip()) for r in ref)
    assert CharAccuracy(chars).resolution() is None  # nothing seen yet


def test_plugin_resolution_is_checked_and_named(tmp_path: Path, digits) -> None:
    body = (
        "class Steps:\n"
        "    def update(self, float_outputs, quant_outputs, feed):\n"
        "        pass\n"
        "    def result(self):\n"
        "        return 1.0\n"
        "    def resolution(self):\n"
        "        return {value}\n"
    )
    good = _plugin(tmp_path, body.format(value="0.25"), "good.py")
    assert FloatReference(digits["float"], digits["feeds"], f"{good}:Steps").self_score()[1] == 0.25
    bad = _plugin(tmp_path, body.format(value="-1"), "bad.py")
    with pytest.raises(
        MetricError, match=r"bad.py:Steps: resolution\(\) returned -1; return the smallest step"
    ):
        FloatReference(digits["float"], digits["feeds"], f"{bad}:Steps").self_score()[1]
    raising = _plugin(tmp_path, body.format(value="1 / 0"), "raising.py")
    with pytest.raises(MetricError, match=r"raising.py:7: resolution\(\) raised ZeroDivisionError"):
        FloatReference(digits["float"], digits["feeds"], f"{raising}:Steps").self_score()[1]


def test_an_error_metric_is_refused_where_scores_are_read_as_higher_is_better(tmp_path: Path, digits) -> None:
    """The accuracy search and triage compare scores to a threshold below float's: a plugin whose lower
    values are better would meet any budget at once, so both refuse it in one line naming the metric."""
    from tests.helpers import run_cli
    from zonnx.quantization.triage import triage

    path = _plugin(
        tmp_path,
        "import numpy as np\n"
        "class MaxAbs:\n"
        "    higher_is_better = False\n"
        "    def __init__(self):\n"
        "        self.worst = 0.0\n"
        "    def update(self, float_outputs, quant_outputs, feed):\n"
        "        self.worst = max(self.worst, float(np.abs(float_outputs[0] - quant_outputs[0]).max()))\n"
        "    def result(self):\n"
        "        return self.worst\n",
    )
    calib = tmp_path / "calib.npz"
    np.savez(calib, input=np.concatenate([f["input"] for f in digits["feeds"]]))
    out = tmp_path / "s.onnx"
    proc = run_cli(
        "quantize", digits["float"], str(out), "--calib", str(calib), "--accuracy-budget", "0.5",
        "--metric", f"{path}:MaxAbs",
    )  # fmt: skip
    assert proc.returncode != 0 and not out.exists()
    lines = proc.stderr.strip().splitlines()  # the held-out split is said first, then the one error line
    assert "Traceback" not in proc.stderr and "lower is better" in lines[-1] and "MaxAbs" in lines[-1]
    assert not any("lower is better" in line for line in lines[:-1])
    import onnx

    with pytest.raises(MetricError, match="lower is better.*triage"):
        triage(digits["float"], onnx.load(digits["quant"]), digits["feeds"][:2], metric=f"{path}:MaxAbs")
