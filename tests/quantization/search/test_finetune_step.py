"""The budget search's fast-finetune step on a real trained model quantized for a power-of-two target."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.helpers import digits_feeds, run_cli
from zonnx import zoo
from zonnx.build_npu import PER_TENSOR_WEIGHT_RECOVERY, target_quantize_kwargs
from zonnx.errors import OptionError
from zonnx.metrics.evaluate import FloatReference
from zonnx.quantization.api import build_config
from zonnx.quantization.enums import QuantFormat
from zonnx.quantization.search.run import quantize_with_budget


@pytest.fixture(scope="module")
def digits() -> Path:
    return zoo.get("digits_cnn")


def _dpu_config():
    """dpu-b4096's recipe without its per-tensor-weight recovery (CLE), as these tests were measured."""
    kwargs = target_quantize_kwargs("dpu-b4096")
    kwargs["extra_options"] = {
        k: v for k, v in kwargs["extra_options"].items() if k not in PER_TENSOR_WEIGHT_RECOVERY
    }
    return build_config(**kwargs)


def _search(
    digits: Path,
    out: Path,
    *,
    calib: int = 32,
    config=None,
    budget: float = 0.0001,
    eval_feeds=None,
    **kwargs,
):
    """The budget search on ``calib`` digits samples, scored by cosine on 16 other samples, one layer to
    raise; by default for dpu-b4096 with a budget nothing meets."""
    return quantize_with_budget(
        digits,
        out,
        digits_feeds(calib),
        config or _dpu_config(),
        budget=budget,
        metric="cosine",
        eval_feeds=eval_feeds or digits_feeds(16, 100),
        max_layers=1,
        **kwargs,
    )


def test_a_choice_that_misses_is_fine_tuned_and_written(digits: Path, tmp_path: Path) -> None:
    """Nothing meets a budget of 0.0001 cosine with one layer to raise: the choice is quantized again with
    AdaQuant and scored on every evaluation sample; it is kept exactly when it scores higher (cosine has
    no step), and the written model and the config file are the kept one's.

    Whether AdaQuant wins here depends on the trained digits CNN, whose weights differ between hosts
    (zonnx/zoo/digits.py): on the AVX-512 VNNI host it was kept, on an AMD Zen 3 (AVX2) host it scored
    0.99984 against the choice's 0.99986 and was dropped, as the step's own docstring says it can be. So
    both verdicts are checked for what follows from them."""
    out = tmp_path / "q.onnx"
    evals = digits_feeds(16, 100)
    final, result, config_path = _search(digits, out, eval_feeds=evals)
    trial = result.finetune
    assert trial is not None and trial.changed.full and "adaquant" in trial.summary and trial.tuned >= 1
    assert trial.resolution is None and trial.kept == (trial.changed.score > trial.plain.score)
    assert trial.changed in result.candidates
    written = FloatReference(str(digits), evals, "cosine", str(digits)).score(onnx.load(out))
    text = config_path.read_text()
    if trial.kept:
        assert result.chosen is trial.changed
        assert [r["candidate"] for r in result.table() if r["chosen"]] == ["choice + fast finetune"]
        assert final.recovery["fast_finetune"].tuned >= 1  # the written model is the fine-tuned one
        assert written == pytest.approx(trial.changed.score, abs=1e-12)
        assert (
            "IncludeFastFT = true" in text
            and 'OptimAlgorithm = "adaquant"' in text
            and "MaxSeconds = inf" in text  # no clock bound: the config repeats the weights
        )
        assert "fast finetune (AdaQuant) added" in text
    else:
        assert result.chosen is not trial.changed and "fast_finetune" not in final.recovery
        assert written == pytest.approx(trial.plain.score, abs=1e-12)  # the plain choice was written over it
        assert "IncludeFastFT" not in text and "fast finetune (AdaQuant) tried, not kept" in text


def test_a_clock_bound_reaches_the_tuning_and_the_log_says_what_it_costs(
    digits: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``finetune_seconds`` becomes the trial's MaxSeconds: a bound reached before the first layer tunes
    nothing, so the trial is not kept, and the warning says the result now depends on the machine."""
    with caplog.at_level(logging.WARNING):
        _, result, config_path = _search(digits, tmp_path / "q.onnx", finetune_seconds=1e-9)
    assert result.finetune is not None and result.finetune.tuned == 0 and not result.finetune.kept
    assert "depends on this machine's speed" in caplog.text
    assert "IncludeFastFT" not in config_path.read_text()


def test_fast_finetune_is_skipped_when_off_met_out_of_reach_or_short_of_samples(
    digits: Path, tmp_path: Path, caplog
) -> None:
    _, off, off_config = _search(digits, tmp_path / "off.onnx", finetune_trial="off")
    assert off.finetune is None and not off.met and "IncludeFastFT" not in off_config.read_text()
    _, met, _ = _search(digits, tmp_path / "met.onnx", budget=5.0)
    assert met.met and met.finetune is None
    qop = build_config(quant_format=QuantFormat.QOperator, per_channel=True)
    _, unreachable, _ = _search(digits, tmp_path / "qop.onnx", config=qop)
    assert not unreachable.met and unreachable.finetune is None and (tmp_path / "qop.onnx").is_file()
    with caplog.at_level(logging.WARNING):  # fewer calibration samples than one batch of 4: said, not fatal
        _, few, _ = _search(digits, tmp_path / "few.onnx", calib=3)
    assert few.finetune is None and (tmp_path / "few.onnx").is_file()
    assert "fast finetune not tried: fast finetune needs at least 4 calibration sample(s)" in caplog.text
    for bad, match in (
        ({"finetune_trial": "maybe"}, "finetune_trial='maybe'"),
        ({"finetune_seconds": 0}, "positive"),
    ):
        with pytest.raises(OptionError, match=match):
            _search(digits, tmp_path / "x.onnx", **bad)
    assert not (tmp_path / "x.onnx").exists()


def test_the_cli_says_what_fast_finetune_did_its_config_reproduces_it_and_bad_values_are_refused(
    digits: Path, tmp_path: Path
) -> None:
    calib = tmp_path / "calib.npz"
    np.savez(calib, input=np.concatenate([f["input"] for f in digits_feeds(32)]))
    args = ["quantize", str(digits), str(tmp_path / "q.onnx"), "--calib", str(calib), "--target", "dpu-b4096"]
    evals = tmp_path / "eval.npz"  # evaluation data of its own: the search calibrates on all of --calib
    np.savez(evals, input=np.concatenate([f["input"] for f in digits_feeds(16, 100)]))
    proc = run_cli(*args, "--accuracy-budget", "0.0001", "--search-layers", "1", "--eval", str(evals))
    assert proc.returncode == 0, proc.stderr
    # added or not depends on the host's trained weights (see the test above); the line says which
    assert (
        "fast finetune added on the choice: cosine" in proc.stdout
        or "fast finetune tried, not kept on the choice: cosine" in proc.stdout
    ), proc.stdout
    assert "choice + fast finetune" in proc.stdout
    # the config file reproduces the written model without searching (same weights, bit for bit)
    again = tmp_path / "again.onnx"
    proc = run_cli(
        *args[:2], str(again), "--calib", str(calib), "--config", f"{tmp_path / 'q.onnx'}.search.toml"
    )
    assert proc.returncode == 0, proc.stderr
    a, b = onnx.load(tmp_path / "q.onnx"), onnx.load(again)
    assert [(i.name, i.raw_data) for i in a.graph.initializer] == [
        (i.name, i.raw_data) for i in b.graph.initializer
    ]
    proc = run_cli(*args, "--accuracy-budget", "0.0001", "--search-finetune", "maybe")
    assert proc.returncode == 2 and "--search-finetune 'maybe': use try or off." in proc.stderr
    proc = run_cli(*args, "--search-finetune", "off")
    assert proc.returncode == 2 and "--search-finetune goes with --accuracy-budget" in proc.stderr
    proc = run_cli(*args, "--accuracy-budget", "0.0001", "--search-finetune-seconds", "0")
    assert proc.returncode == 2 and "--search-finetune-seconds 0: give a positive number." in proc.stderr
    proc = run_cli(
        *args, "--accuracy-budget", "0.0001", "--search-finetune", "off", "--search-finetune-seconds", "9"
    )
    assert (
        proc.returncode == 2 and "--search-finetune-seconds bounds the search's fast finetune" in proc.stderr
    )
