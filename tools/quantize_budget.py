"""``zonnx quantize --accuracy-budget``: run the search, print every candidate, write the model and its config."""

from __future__ import annotations

__all__ = ["run_budget_search"]

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from zonnx.errors import OptionError
from zonnx.inspection.render import PLAIN_BOX
from zonnx.quantization.sources import reader_from_source
from zonnx.tools.console import console, err_console


def run_budget_search(
    model: Path,
    output: Path,
    reader: Any,
    proto: Any,
    preprocess: dict,
    cfg: Any,
    budget: float,
    metric: str,
    eval_data: str | None,
    search_layers: int,
    measure_layers: int,
    strict: bool,
    summary: Callable[[Any, float, Path], Table],
    *,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    search_samples: int | None = None,
    min_npu_share: float = 0.0,
    executor: Any = None,
    order_by: str = "report",
    range_search: bool = False,
    bias_correction: str = "try",
    thresholds_trial: str = "try",
    smooth_quant_trial: str = "try",
    finetune_trial: str = "try",
    finetune_seconds: float | None = None,
) -> None:
    """Search, print every candidate and ``summary`` of the final model, write the model and its config
    file; exit 1 under ``strict`` when the budget is not met. ``executor`` runs calibration shards and
    sensitivity tasks (None: in process)."""
    from zonnx.quantization.search.config_trial import sqnr_words, step_words
    from zonnx.quantization.search.run import quantize_with_budget, read_feeds

    if reader is None:
        raise OptionError("--accuracy-budget needs calibration data (--calib).")
    eval_feeds = (
        read_feeds(reader_from_source(eval_data, proto, preprocess=preprocess), "--eval")
        if eval_data
        else None
    )
    start = time.perf_counter()

    def progress(name: str, cand: Any) -> None:
        err_console.print(f"  {name}: {metric} {cand.score:.5f}, {cand.raised} layer(s) raised", markup=False)

    final, result, config_path = quantize_with_budget(
        str(model), output, reader, cfg, budget=budget, metric=metric, eval_feeds=eval_feeds,
        max_layers=search_layers, measure_layers=measure_layers, progress=progress,
        input_shapes=input_shapes, search_samples=search_samples, min_npu_share=min_npu_share, executor=executor,
        order_by=order_by, range_search=range_search, bias_correction=bias_correction,
        thresholds_trial=thresholds_trial, smooth_quant_trial=smooth_quant_trial, finetune_trial=finetune_trial,
        finetune_seconds=finetune_seconds,
    )  # fmt: skip
    table = Table(
        title=f"accuracy budget: {metric} >= {result.threshold:.5f} (float {result.float_score:.5f} - {budget} "
        f"points), {result.eval_samples} evaluation samples",
        box=PLAIN_BOX,
        title_justify="left",
    )
    for col in ("candidate", metric, f"layers {result.precision}", "NPU MACs", "chosen"):
        table.add_column(col)
    for row in result.table():
        share = row["npu_mac_share"]
        table.add_row(
            row["candidate"], f"{row['score']:.5f}", str(row["not_int8"]),
            "-" if share is None else f"{100 * share:.1f}%", "yes" if row["chosen"] else "",
        )  # fmt: skip
    if result.ranges is not None:
        r = result.ranges
        console.print(
            f"range search: {r.changed} of {len(r.choices)} group(s) clipped, output noise "
            f"{r.plain_noise:.4g} -> {r.noise:.4g} (written to {config_path})",
            markup=False,
        )
    trials = (
        ("MSE thresholds", result.thresholds, "chosen over min/max", "tried, min/max kept"),
        ("SmoothQuant", result.smooth_quant, "added", "tried, not kept"),
        ("bias correction", result.bias_correction, "added", "tried, not kept"),
    )
    for what, trial, kept, dropped in trials:
        if trial is not None:
            console.print(
                f"{what} {kept if trial.kept else dropped}: {metric} {trial.plain.score:.5f} -> "
                f"{trial.changed.score:.5f} on the search samples{sqnr_words(trial)}{step_words(trial)} "
                f"(written to {config_path})",
                markup=False,
            )
    ft = result.finetune
    if ft is not None:
        console.print(
            f"fast finetune {'added' if ft.kept else 'tried, not kept'} on the choice: {metric} "
            f"{ft.plain.score:.5f} -> {ft.changed.score:.5f} on every evaluation sample{step_words(ft)}; "
            f"{ft.summary}",
            markup=False,
        )
    console.print(table)
    console.print(summary(final, time.perf_counter() - start, output))
    verdict = "met" if result.met else "NOT met (kept the best candidate)"
    console.print(f"budget {verdict}; config of the choice: {config_path}", markup=False)
    if strict and not result.met:
        raise typer.Exit(1)
