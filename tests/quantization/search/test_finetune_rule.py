"""Fast finetune's acceptance rule: a gain of more than one step of the metric, never a tie."""

from __future__ import annotations

from zonnx.quantization.search.config_trial import trial_note
from zonnx.quantization.search.finetune_step import FinetuneTrial
from zonnx.quantization.search.scorer import Candidate

STEP = 1 / 364  # one character on PP-OCRv4 rec's 32 search lines


def _trial(plain: float, changed: float, step: float | None = STEP, tuned: int = 5) -> FinetuneTrial:
    return FinetuneTrial(
        Candidate({}, plain, output_sqnr=11.10), Candidate({}, changed, output_sqnr=11.37), "s", tuned, step
    )


def test_a_one_character_gain_keeps_the_plain_choice() -> None:
    # PP-OCRv4 rec on dpu-b4096 (npu_budget, 2026-11-29): one character up on the search lines, SQNR up,
    # 0.78 points down on 1000 test lines
    trial = _trial(0.9835, 0.9835 + STEP)
    assert trial.within_step and not trial.kept
    assert "not kept (gain within one step" in trial.verdict
    note = trial_note("fast finetune (AdaQuant)", trial, digits=5)
    assert "tried, not kept" in note and "a gain within one step does not keep it" in note


def test_a_tie_keeps_the_plain_choice() -> None:
    trial = _trial(0.9918, 0.9918)
    assert not trial.within_step and not trial.kept and "no higher score" in trial.verdict


def test_two_characters_up_keep_it() -> None:
    trial = _trial(0.9863, 0.9863 + 2 * STEP)
    assert trial.kept and not trial.within_step and trial.verdict == "kept:"
    assert "added" in trial_note("fast finetune (AdaQuant)", trial) and "within one step" not in trial_note(
        "fast finetune (AdaQuant)", trial
    )


def test_a_lower_score_or_no_tuned_layer_keeps_the_plain_choice() -> None:
    assert not _trial(0.99, 0.98).kept
    no_layer = _trial(0.98, 0.99, tuned=0)
    assert not no_layer.kept and "no layer tuned" in no_layer.verdict


def test_a_continuous_metric_keeps_any_higher_score_and_no_tie() -> None:
    assert _trial(0.99984, 0.99986, step=None).kept
    assert not _trial(0.99986, 0.99986, step=None).kept
    assert not _trial(0.99986, 0.99984, step=None).kept
