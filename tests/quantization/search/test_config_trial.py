"""The configuration trials' rule: the metric decides, and within one of its steps the output SQNR does."""

from __future__ import annotations

from zonnx.quantization.search.config_trial import ConfigTrial, trial_note
from zonnx.quantization.search.scorer import Candidate

STEP = 1 / 364  # one character on PP-OCRv4 rec's 32 search lines


def _trial(plain: tuple[float, float | None], changed: tuple[float, float | None], step: float | None = STEP):
    return ConfigTrial(
        Candidate({}, plain[0], output_sqnr=plain[1]), Candidate({}, changed[0], output_sqnr=changed[1]), step
    )


def test_one_step_lower_with_higher_sqnr_is_kept() -> None:
    # PP-OCRv4 rec on dpu-b4096, SmoothQuant: one character lower, output SQNR 7.9 -> 11.1 dB
    trial = _trial((0.9863, 7.93), (0.9863 - STEP, 11.10))
    assert trial.tied and trial.kept
    note = trial_note("SmoothQuant", trial)
    assert "output SQNR 7.93 -> 11.10 dB" in note and "within one step" in note


def test_one_step_higher_with_lower_sqnr_is_not_kept() -> None:
    trial = _trial((0.9863, 11.1), (0.9863 + STEP, 7.9))
    assert trial.tied and not trial.kept


def test_more_than_one_step_lower_is_not_kept_whatever_the_sqnr() -> None:
    trial = _trial((0.9890, 7.0), (0.9890 - 2.5 * STEP, 30.0))
    assert not trial.tied and not trial.kept


def test_more_than_one_step_higher_is_kept_whatever_the_sqnr() -> None:
    trial = _trial((0.9800, 30.0), (0.9800 + 2 * STEP, 7.0))
    assert not trial.tied and trial.kept


def test_equal_scores_and_equal_sqnr_keep_the_change() -> None:
    assert _trial((0.99, 10.0), (0.99, 10.0)).kept


def test_continuous_metric_or_missing_sqnr_is_decided_by_the_score() -> None:
    assert not _trial((0.990, 5.0), (0.989, 20.0), step=None).kept  # cosine: no step
    assert not _trial((0.9863, None), (0.9863 - STEP, 11.1)).kept  # no SQNR on one side
    assert "output SQNR" not in trial_note("SmoothQuant", _trial((0.99, None), (0.99, None)))
