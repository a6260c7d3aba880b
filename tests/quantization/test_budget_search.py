"""Accuracy-budget search on a real trained model: the fewest raised layers within budget, a config to re-run."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.helpers import digits_feeds, run_cli
from zonnx import zoo
from zonnx.errors import OptionError
from zonnx.quantization.api import build_config
from zonnx.quantization.search.budget import confirm_sizes, search_precision
from zonnx.quantization.search.executor import LocalExecutor
from zonnx.quantization.search.run import quantize_with_budget


@pytest.fixture(scope="module")
def digits() -> Path:
    return zoo.get("digits_cnn")


def _config():
    return build_config(per_channel=True, extra_options={"QuantPlacement": "kernels"})


def test_the_search_raises_the_fewest_layers_that_meet_the_budget(digits: Path, tmp_path: Path) -> None:
    out = tmp_path / "q.onnx"
    # the layer search alone: the bias-correction trial (tested below) would start it within the budget
    final, result, config_path = quantize_with_budget(
        digits, out, digits_feeds(32), _config(), budget=0.002, metric="cosine", eval_feeds=digits_feeds(16, 100),
        bias_correction="off",
    )  # fmt: skip
    assert result.baseline.score < result.threshold <= result.chosen.score
    assert result.met and result.chosen.raised >= 1 and result.precision == "float"
    # binary search: the prefix one shorter than the choice was evaluated and missed (or is the baseline)
    shorter = [c for c in result.candidates if c.raised == result.chosen.raised - 1] or [result.baseline]
    assert shorter[0].score < result.threshold
    text = config_path.read_text()
    assert text.count("exclude = true") == result.chosen.raised
    # the written model carries the choice: the raised nodes read no quantized weight
    raised = set(result.chosen.overrides)
    model = onnx.load(out)
    for node in model.graph.node:
        if node.name in raised:
            assert not any(i.endswith("_DequantizeLinear_Output") and "weight" in i for i in node.input)
    assert {r["candidate"] for r in result.table()} >= {"baseline", "#1"}


class CountingExecutor(LocalExecutor):
    """In process, counting the ``map`` calls (one per round of the search)."""

    calls = 0

    def map(self, fn, items):
        self.calls += 1
        return super().map(fn, items)


def test_two_probes_per_round_find_the_same_choice_in_fewer_rounds(digits: Path, tmp_path: Path) -> None:
    kwargs = dict(
        budget=0.002, metric="cosine", eval_feeds=digits_feeds(16, 100), max_layers=12, bias_correction="off"
    )
    one = quantize_with_budget(digits, tmp_path / "w1.onnx", digits_feeds(32), _config(), **kwargs)[1]
    counted = CountingExecutor()
    two = quantize_with_budget(digits, tmp_path / "w2.onnx", digits_feeds(32), _config(), executor=counted,
                               trials_per_round=2, **kwargs)[1]  # fmt: skip
    assert two.met and two.chosen.raised == one.chosen.raised >= 1
    assert two.chosen.overrides == one.chosen.overrides and two.chosen.score == one.chosen.score
    # the invariant: the prefix one shorter than the choice was scored and missed (or is the baseline)
    shorter = [c for c in two.candidates if c.raised == two.chosen.raised - 1] or [two.baseline]
    assert shorter[0].score < two.threshold
    # one map call per round (the first: all layers raised); the binary search has one candidate per round
    assert len(one.candidates) > 2 and counted.calls < len(one.candidates)
    assert len(two.candidates) > counted.calls  # some round scored two probes
    with pytest.raises(OptionError, match="trials_per_round 0"):
        quantize_with_budget(
            digits, tmp_path / "w0.onnx", digits_feeds(32), _config(), trials_per_round=0, **kwargs
        )


def test_confirm_sizes_grow_by_half_up_to_the_limit() -> None:
    assert confirm_sizes(4, 100, 1) == [4]
    assert confirm_sizes(4, 100, 3) == [4, 6, 9]
    assert confirm_sizes(1, 100, 3) == [1, 2, 3]
    assert confirm_sizes(8, 10, 4) == [8, 10]  # stops at the limit
    assert confirm_sizes(12, 10, 2) == [10]


def test_confirmation_on_all_samples_picks_the_same_with_two_probes_per_round(
    digits: Path, tmp_path: Path
) -> None:
    kwargs = dict(
        budget=0.0, metric="cosine", eval_feeds=digits_feeds(16, 100), max_layers=12, search_samples=4
    )
    probe = quantize_with_budget(digits, tmp_path / "c0.onnx", digits_feeds(32), _config(), **kwargs)[1]
    # a threshold midway between the baseline and every layer raised (on the 4 search samples): met by a search
    top = probe.candidates[0].score
    assert top > probe.baseline.score
    kwargs["budget"] = 100 * (probe.float_score - (top + probe.baseline.score) / 2)
    one = quantize_with_budget(digits, tmp_path / "c1.onnx", digits_feeds(32), _config(), **kwargs)[1]
    two = quantize_with_budget(digits, tmp_path / "c2.onnx", digits_feeds(32), _config(), executor=CountingExecutor(),
                               trials_per_round=2, **kwargs)[1]  # fmt: skip
    assert one.chosen.full and two.chosen.full  # the choice was confirmed on all 16 samples
    assert two.chosen.raised == one.chosen.raised and two.chosen.score == one.chosen.score
    assert two.met == one.met


def test_the_written_config_reproduces_the_choice_without_searching(digits: Path, tmp_path: Path) -> None:
    calib = tmp_path / "calib.npz"
    np.savez(calib, input=np.concatenate([f["input"] for f in digits_feeds(32)]))
    searched = tmp_path / "searched.onnx"
    proc = run_cli(
        "quantize", str(digits), str(searched), "--calib", str(calib), "--accuracy-budget", "0.002"
    )
    assert proc.returncode == 0, proc.stderr
    assert "held out 8 of the 32 calibration samples" in proc.stderr
    assert "accuracy budget" in proc.stdout and "chosen" in proc.stdout
    assert "MSE thresholds" in proc.stdout  # the trial over min/max, said either way
    assert "SmoothQuant" in proc.stdout  # so is the SmoothQuant trial
    assert "calibrated on 24 of the 32 calibration samples" in Path(f"{searched}.search.toml").read_text()
    again = tmp_path / "again.onnx"
    proc = run_cli(
        "quantize", str(digits), str(again), "--calib", str(calib), "--config", f"{searched}.search.toml"
    )
    assert proc.returncode == 0, proc.stderr
    a, b = onnx.load(searched), onnx.load(again)
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]


def test_a_budget_nothing_meets_keeps_the_best_and_strict_fails(digits: Path, tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        _, result, _ = quantize_with_budget(
            digits,
            tmp_path / "q.onnx",
            digits_feeds(16),
            _config(),
            budget=0.0,
            metric="top1",
            eval_feeds=digits_feeds(8, 50),
        )
    assert not result.met or result.chosen.score >= result.threshold
    if not result.met:
        assert "accuracy budget not met" in caplog.text
    calib = tmp_path / "calib.npz"
    np.savez(calib, input=np.concatenate([f["input"] for f in digits_feeds(16)]))
    proc = run_cli(
        "quantize",
        str(digits),
        str(tmp_path / "s.onnx"),
        "--calib",
        str(calib),
        "--accuracy-budget",
        "0",
        "--metric",
        "cosine",
        "--strict",
        "--no-smooth-quant",  # the user's no: the search does not try it either
        "--no-bias-correction",  # nor this one
    )
    assert proc.returncode == 1 and "NOT met" in proc.stdout
    assert "SmoothQuant" not in proc.stdout and "bias correction" not in proc.stdout
    assert (tmp_path / "s.onnx").is_file()  # the best model is still saved


def test_a_budget_finer_than_the_metric_on_its_samples_is_said(digits: Path, tmp_path: Path, caplog) -> None:
    trials = {
        "bias_correction": "off",
        "thresholds_trial": "off",
        "smooth_quant_trial": "off",
        "finetune_trial": "off",
    }
    with caplog.at_level(logging.WARNING):
        _, result, _ = quantize_with_budget(
            digits, tmp_path / "q.onnx", digits_feeds(16), _config(), budget=5.0, metric="top1",
            eval_feeds=digits_feeds(40, 50), **trials,
        )  # fmt: skip
    # 40 one-image samples: top1 moves in steps of 2.5 points, so a 5-point budget is 2 steps
    assert result.resolution == 1 / 40
    assert (
        "top1 moves in steps of 2.5 points (one unit in 40), so the 5-point budget is 2.0 step(s)"
        in caplog.text
    )
    assert "Give about 200 evaluation samples (--eval) for 10 steps." in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _, result, _ = quantize_with_budget(
            digits, tmp_path / "c.onnx", digits_feeds(16), _config(), budget=5.0, metric="cosine",
            eval_feeds=digits_feeds(40, 50), **trials,
        )  # fmt: skip
    assert result.resolution is None and "moves in steps" not in caplog.text  # a continuous metric


def test_measured_sensitivity_is_cached_and_reused(digits: Path, tmp_path: Path) -> None:
    out = tmp_path / "q.onnx"
    kwargs = dict(
        budget=0.002,
        metric="cosine",
        eval_feeds=digits_feeds(8, 100),
        measure_layers=2,
        bias_correction="off",
    )  # bias correction alone meets this budget: off, so the search measures layers
    _, first, _ = quantize_with_budget(digits, out, digits_feeds(16), _config(), **kwargs)
    cache = tmp_path / "q.onnx.sensitivity.json"
    data = json.loads(cache.read_text())
    assert len(data["layers"]) == 2
    layer = next(iter(data["layers"]))
    data["layers"][layer]["score"] = 0.123456  # a value no evaluation gives: proves the cache is read
    cache.write_text(json.dumps(data))
    _, second, _ = quantize_with_budget(digits, out, digits_feeds(16), _config(), **kwargs)
    assert second.sensitivity[layer].score == 0.123456
    assert set(second.sensitivity) == set(first.sensitivity)


def test_bad_search_input_is_one_clear_error(digits: Path, tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="a number >= 0"):
        quantize_with_budget(
            digits, tmp_path / "q.onnx", digits_feeds(8), _config(), budget=-1, eval_feeds=digits_feeds(2)
        )
    with pytest.raises(OptionError, match="budget below float means nothing"):
        quantize_with_budget(
            digits,
            tmp_path / "q.onnx",
            digits_feeds(8),
            _config(),
            budget=1,
            metric="sqnr",
            eval_feeds=digits_feeds(2),
        )
    with pytest.raises(OptionError, match="needs at least 4"):
        quantize_with_budget(digits, tmp_path / "q.onnx", digits_feeds(3), _config(), budget=1)
    with pytest.raises(OptionError, match="--min-npu-share 90"):
        quantize_with_budget(
            digits, tmp_path / "q.onnx", digits_feeds(8), _config(), budget=1, min_npu_share=90
        )
    proc = run_cli("quantize", str(digits), str(tmp_path / "x.onnx"), "--calib", "c.npz", "--metric", "top1")
    assert proc.returncode == 2 and "go with --accuracy-budget" in proc.stderr
    proc = run_cli("quantize", str(digits), str(tmp_path / "x.onnx"), "--input-shape", "input:1,1,8,8")
    assert (
        proc.returncode == 2 and "--input-shape, --search-samples and --search-order go with" in proc.stderr
    )
    proc = run_cli("quantize", str(digits), str(tmp_path / "x.onnx"), "--search-order", "measured")
    assert proc.returncode == 2 and "--search-order go with --accuracy-budget" in proc.stderr
    proc = run_cli("quantize", str(digits), str(tmp_path / "x.onnx"), "--search-thresholds", "off")
    assert proc.returncode == 2 and "--search-thresholds goes with --accuracy-budget" in proc.stderr
    proc = run_cli("quantize", str(digits), str(tmp_path / "x.onnx"), "--search-thresholds", "maybe")
    assert proc.returncode == 2 and "--search-thresholds 'maybe': use try or off." in proc.stderr


def test_targets_offer_int16_where_their_file_says_so() -> None:
    assert search_precision("zhouyi-x2") == "int16"
    assert search_precision("dpu-b4096") == "float"
    assert search_precision(None) == "float"


def test_a_mixed_precision_choice_compiles_for_the_target_and_runs_bit_exact(
    digits: Path, tmp_path: Path
) -> None:
    """zhouyi-x2 lists int16: the raised layers get 16-bit activations, the model still compiles with every
    MAC on the NPU, and the simulated NPU agrees with the fake-quant model within one output step or 0.2%
    of the logits' spread (zhouyi-x2's requantization rounds its own way, not as ONNX Runtime's
    QuantizeLinear)."""
    import zonnx
    from zonnx.backend.compile_api import compile_model
    from zonnx.build_npu import target_quantize_kwargs
    from zonnx.verify import ort_session

    out = tmp_path / "z.onnx"
    cfg = build_config(**target_quantize_kwargs("zhouyi-x2"))
    _, result, _ = quantize_with_budget(
        digits, out, digits_feeds(32), cfg, budget=0.001, eval_feeds=digits_feeds(16, 32)
    )
    assert result.precision == "int16" and result.chosen.raised >= 1
    assert set(result.chosen.overrides.values()) == {"int16"} and result.chosen.npu_mac_share == 1.0
    compiled = compile_model(out, "zhouyi-x2")
    assert compiled.partition.mac_share == 1.0
    npu = zonnx.InferenceSession(
        compiled.model, providers=["ZonnxNPUExecutionProvider", "CPUExecutionProvider"]
    )
    fake = ort_session(out)
    model = onnx.load(out)
    last = next(n for n in model.graph.node if n.output[0] == model.graph.output[0].name)
    step = float(
        onnx.numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == last.input[1]))
    )
    for feed in digits_feeds(8, 200):
        a, b = npu.run(None, feed)[0], fake.run(None, feed)[0]
        # the residual Add runs on the NPU too (zhouyi-x2's eltwise rounding); with int16 logits one output
        # step is finer than the int8 rounding before the Gemm, so the bound is the larger of one step
        # and 0.2% of the logits' spread
        assert np.abs(a - b).max() <= max(step * 1.001, 0.002 * np.ptp(b)) and a.argmax() == b.argmax()


def test_a_budget_choice_for_pp_ocr_compiles_with_fixed_shapes_and_the_npu_agrees(
    tmp_path: Path, caplog
) -> None:
    """PP-OCRv4 rec on zhouyi-x2 (int16 offered): with the rec width fixed to 320 the searched candidates
    (3 layers int16) keep >= 90% of MACs on the NPU by the partitioner, the search's choice keeps them
    once compiled, and the simulated NPU decodes the fake-quant model's text to within one character in
    twenty. A budget of 0 on cosine is never met, so every step of the layer search runs."""
    from zonnx.backend.compile_api import compile_model
    from zonnx.build_npu import target_quantize_kwargs
    from zonnx.metrics.evaluate import evaluate
    from zonnx.zoo.text_images import rec_samples

    shape = (1, 3, 48, 320)
    feeds = [f for _, f in rec_samples(24, seed=5) if f["x"].shape == shape]
    assert len(feeds) >= 10
    src, out = zoo.get("ppocr_rec"), tmp_path / "rec.onnx"
    cfg = build_config(**target_quantize_kwargs("zhouyi-x2"))
    _, result, _ = quantize_with_budget(
        src, out, feeds[:4], cfg, budget=0.0, metric="cosine", eval_feeds=feeds[4:6], max_layers=3,
        input_shapes={"x": list(shape)}, search_samples=1, min_npu_share=0.9,
        finetune_trial="off",  # the step is tested on its own (search/test_finetune_step.py); here: minutes
    )  # fmt: skip
    assert result.precision == "int16" and not result.met and result.finetune is None
    raised = [c for c in result.candidates if c.raised == 3]
    assert raised and all(set(c.overrides.values()) == {"int16"} for c in raised)
    assert min(c.npu_mac_share for c in [result.baseline, *raised]) >= 0.9
    compiled = compile_model(out, "zhouyi-x2", input_shapes={"x": list(shape)})
    assert compiled.partition.mac_share >= 0.9
    compiled_path = compiled.save(tmp_path / "rec_npu.onnx")
    # the NPU's text against the fake-quant model's: zhouyi-x2 requantizes half-up, ORT half-even, so a
    # character whose score sits next to the blank's (a space, in practice) may flip
    with caplog.at_level(logging.WARNING):
        assert evaluate(out, compiled_path, feeds[6:10], "char-accuracy") >= 0.95
    # the NPU programs run in ORT, not the slow reference executor (an opset-13 Reshape takes no allowzero)
    assert "cannot load the model" not in caplog.text


def test_bias_correction_is_tried_before_any_layer_is_raised(digits: Path, tmp_path: Path) -> None:
    """The search scores the all-int8 model with and without BiasCorrection and keeps the better; kept,
    it is the search's baseline and the config file carries it, so a re-run reproduces it."""
    kwargs = dict(budget=0.002, metric="cosine", eval_feeds=digits_feeds(16, 100))
    _, result, config_path = quantize_with_budget(
        digits, tmp_path / "q.onnx", digits_feeds(32), _config(), **kwargs
    )
    trial = result.bias_correction
    assert trial is not None and trial.changed.score > trial.plain.score and trial.kept
    assert result.baseline is trial.chosen is trial.changed  # scored once
    assert "BiasCorrection = true" in config_path.read_text()
    _, off, off_config = quantize_with_budget(
        digits, tmp_path / "off.onnx", digits_feeds(32), _config(), bias_correction="off", **kwargs
    )
    assert off.bias_correction is None and off.baseline.score == pytest.approx(trial.plain.score)
    assert "BiasCorrection" not in off_config.read_text()
    with pytest.raises(OptionError, match="bias_correction='maybe'"):
        quantize_with_budget(
            digits, tmp_path / "x.onnx", digits_feeds(32), _config(), bias_correction="maybe", **kwargs
        )


def test_bias_correction_is_not_tried_where_it_cannot_run(digits: Path, tmp_path: Path) -> None:
    """QOperator models have no DequantizeLinear to correct: the search skips the trial, and runs."""
    from zonnx.quantization.enums import QuantFormat

    cfg = build_config(quant_format=QuantFormat.QOperator, per_channel=True)
    _, result, config_path = quantize_with_budget(
        digits,
        tmp_path / "q.onnx",
        digits_feeds(32),
        cfg,
        budget=0.002,
        metric="cosine",
        eval_feeds=digits_feeds(16, 100),
    )
    assert result.bias_correction is None and "BiasCorrection" not in config_path.read_text()


def test_mse_thresholds_are_tried_when_ranges_are_min_max(digits: Path, tmp_path: Path) -> None:
    """One hot pixel in one calibration image stretches the min/max ranges it reaches; the search scores MSE thresholds
    against min/max before raising any layer, keeps the better and writes it to the config file."""
    calib = digits_feeds(32)
    hot = calib[5]["input"].copy()
    hot.flat[27] = 500.0  # one hot pixel (the 8x8 images span [0, 1])
    calib[5] = {"input": hot}
    kwargs = dict(
        budget=0.002, metric="cosine", eval_feeds=digits_feeds(16, 100), bias_correction="off",
        smooth_quant_trial="off",  # the min/max or MSE model is the search's baseline
    )  # fmt: skip
    _, result, config_path = quantize_with_budget(digits, tmp_path / "q.onnx", calib, _config(), **kwargs)
    trial = result.thresholds
    assert trial is not None and trial.kept and trial.changed.score > trial.plain.score + 0.01
    assert result.baseline is trial.changed  # scored once, the search's starting point
    assert 'method = "mse"' in config_path.read_text()
    _, off, off_config = quantize_with_budget(
        digits, tmp_path / "off.onnx", calib, _config(), thresholds_trial="off", **kwargs
    )
    assert off.thresholds is None and off.baseline.score == pytest.approx(trial.plain.score)
    assert 'method = "minmax"' in off_config.read_text()
    with pytest.raises(OptionError, match="thresholds_trial='maybe'"):
        quantize_with_budget(
            digits, tmp_path / "x.onnx", calib, _config(), thresholds_trial="maybe", **kwargs
        )


def test_mse_thresholds_are_not_tried_over_a_chosen_method(digits: Path, tmp_path: Path) -> None:
    """A method the user (or the target recipe) chose other than min/max is kept as it is."""
    from zonnx.quantization.enums import ZonnxCalibrationMethod

    cfg = build_config(per_channel=True, calibrate_method=ZonnxCalibrationMethod.MSE)
    _, result, config_path = quantize_with_budget(
        digits,
        tmp_path / "q.onnx",
        digits_feeds(32),
        cfg,
        budget=0.002,
        metric="cosine",
        eval_feeds=digits_feeds(16, 100),
    )
    assert result.thresholds is None and 'method = "mse"' in config_path.read_text()


def test_smooth_quant_is_tried_and_kept_where_it_helps(tmp_path: Path) -> None:
    """PP-OCRv4 rec on dpu-b4096: the recipe does not smooth (it costs the CNNs), but smoothing lifts this
    model's outputs, so the search keeps it, starts from it and writes it."""
    from zonnx.build_npu import target_quantize_kwargs
    from zonnx.zoo.text_images import rec_samples

    shape = (1, 3, 48, 320)
    feeds = [f for _, f in rec_samples(24, seed=5) if f["x"].shape == shape]
    cfg = build_config(**target_quantize_kwargs("dpu-b4096"))
    assert not cfg.extra.smooth_quant
    kwargs = dict(budget=5.0, metric="cosine", eval_feeds=feeds[8:14], finetune_trial="off")
    _, result, config_path = quantize_with_budget(
        zoo.get("ppocr_rec"), tmp_path / "q.onnx", feeds[:8], cfg, **kwargs
    )
    trial = result.smooth_quant
    assert trial is not None and trial.kept and trial.changed.score > trial.plain.score
    assert not trial.tied  # cosine has no step: the score alone decides
    assert trial.changed.output_sqnr > trial.plain.output_sqnr  # measured from the same runs
    assert result.baseline is trial.changed  # scored once, the search's starting point
    text = config_path.read_text()
    assert "SmoothQuant = true" in text and "SmoothQuant added" in text and "output SQNR" in text
    # turned off (--no-smooth-quant, SmoothQuant = false in a build config): the CLI and build tests


def test_smooth_quant_is_not_tried_on_a_model_that_keeps_its_grids(
    digits: Path, tmp_path: Path, caplog
) -> None:
    """A pre-quantized model keeps its own grids, which smoothing would void: the search does not try it,
    and says why without the warning a user's own SmoothQuant gets."""
    from zonnx.quantization.api import quantize_static
    from zonnx.quantization.calibration.readers import ListReader

    prequantized = tmp_path / "qdq.onnx"
    quantize_static(digits, prequantized, ListReader(digits_feeds(16)))
    with caplog.at_level(logging.INFO):
        _, result, config_path = quantize_with_budget(
            prequantized,
            tmp_path / "b.onnx",
            digits_feeds(16),
            _config(),
            budget=1.0,
            eval_feeds=digits_feeds(8, 100),
        )
    assert result.smooth_quant is None and "SmoothQuant" not in config_path.read_text()
    assert "SmoothQuant not tried (a pre-quantized qdq model keeps its grids)" in caplog.text
    assert "SmoothQuant skipped" not in caplog.text


def test_int8_only_fallback_keeps_the_share_and_scores_the_mac_free_layers(tmp_path: Path) -> None:
    """PP-OCRv4 rec on dpu-b4096 (no int16): the 6625-class head already runs on the CPU (4.6% of MACs),
    so the layers raised together may hold only what is left of the 10% allowance, and raising the head
    itself costs none of it; when raising them all
    misses (a budget of 0 always does), the MAC-free layers of the order are scored alone as well, and
    one with more layers raised is taken only when it scores higher beyond the noise of the samples."""
    from zonnx.build_npu import target_quantize_kwargs
    from zonnx.inspection.macs import node_macs_by_name
    from zonnx.zoo.text_images import rec_samples

    shape = (1, 3, 48, 320)
    feeds = [f for _, f in rec_samples(16, seed=5) if f["x"].shape == shape]
    cfg = build_config(**target_quantize_kwargs("dpu-b4096"))
    final, result, _ = quantize_with_budget(
        zoo.get("ppocr_rec"), tmp_path / "rec.onnx", feeds[:4], cfg, budget=0.0,
        metric="cosine", eval_feeds=feeds[4:6], max_layers=400,
        input_shapes={"x": list(shape)}, min_npu_share=0.9, finetune_trial="off",
    )  # fmt: skip
    assert result.precision == "float" and not result.met
    assert 0.94 < result.baseline.npu_mac_share < 0.96
    top, alone = result.candidates[0], result.candidates[1]
    assert len(result.candidates) == 2 and alone.raised < top.raised
    # the graph whose node names the search raises: prepared and equalized as the recipe asks, and
    # smoothed when the search kept SmoothQuant (its inserted Mul nodes can be raised too)
    smoothed = result.smooth_quant is not None and result.smooth_quant.kept
    assert final.config.extra.smooth_quant == smoothed
    macs = node_macs_by_name(final.prepared, {"x": list(shape)})
    assert all(n in macs for c in (top, alone) for n in c.overrides)
    off = result.baseline.off_npu
    assert off is not None
    head = max(macs, key=lambda n: macs[n] or 0 if n.startswith("p2o.MatMul") else 0)
    assert head in off and head in top.overrides  # already on the CPU: raising it costs no allowance
    raised_macs = sum(macs.get(n) or 0 for n in top.overrides if n not in off)
    total = sum(m for m in macs.values() if m)
    assert raised_macs <= (result.baseline.npu_mac_share - 0.9) * total * 1.001
    assert all(macs[n] == 0 for n in alone.overrides)
    eligible = [c for c in [result.baseline, top, alone] if c.npu_mac_share >= 0.9]
    assert result.chosen in eligible
    # a candidate with more layers raised that scored higher was not taken for being within the noise
    higher = [c for c in eligible if c.score > result.chosen.score and c.raised > result.chosen.raised]
    assert len(result.within_noise) >= len(higher)
    assert all("within their noise" in note for note in result.within_noise)
