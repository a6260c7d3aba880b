"""The rule that says when the evaluation samples cannot resolve the accuracy budget."""

from __future__ import annotations

from zonnx.quantization.search.resolution import MIN_BUDGET_STEPS, coarse_budget_note


def test_a_budget_of_fewer_steps_than_the_minimum_is_said_with_the_samples_that_would_do() -> None:
    # PP-OCRv4 rec's 32 search lines: about 360 characters, a 0.5-point budget is 1.8 steps
    note = coarse_budget_note(0.5, 1 / 360, 32, "char-accuracy-stripped")
    assert note is not None
    assert "the 0.5-point budget is 1.8 step(s)" in note and "steps of 0.28 points (one unit in 360)" in note
    assert "Give about 178 evaluation samples (--eval) for 10 steps." in note


def test_enough_steps_a_zero_budget_and_continuous_metrics_are_not_judged() -> None:
    step = 1 / 1000
    assert coarse_budget_note(MIN_BUDGET_STEPS * step * 100, step, 100, "top1") is None
    assert coarse_budget_note(MIN_BUDGET_STEPS * step * 100 * 0.99, step, 100, "top1") is not None
    assert coarse_budget_note(0.0, step, 100, "top1") is None  # float's own score asked for: exact
    assert coarse_budget_note(0.5, None, 32, "cosine") is None
