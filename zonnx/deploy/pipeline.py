"""``run_config``: run a build config's stages in order, skip the unchanged ones, write report.json and report.html.

A stage runs when ``--from`` reaches it, when ``--only`` names it, or when its cache key (``cache``)
changed; otherwise its recorded result is reused. A stage that fails leaves the artifacts of the stages
before it intact; report.json and report.html are still written with what ran and the failing stage's
error, then the error is raised (non-zero exit). The last stage, ``report``, is cheap and runs every
time (``--only`` another stage leaves the reports as they were).
"""

from __future__ import annotations

__all__ = ["STAGE_NAMES", "BuildRun", "run_config", "summary_lines"]

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from zonnx.deploy.cache import StageCache, stage_key
from zonnx.deploy.config import BuildConfig, section_digest
from zonnx.deploy.report_html import ReportData, read_json, write_report
from zonnx.deploy.stages import STAGES, Stage, StageContext, remove_artifacts
from zonnx.errors import ModelSaveError, OptionError, ZonnxError, did_you_mean
from zonnx.ir.io import write_bytes_atomic

logger = logging.getLogger(__name__)

STAGE_NAMES = tuple(s.name for s in STAGES) + ("report",)


@dataclasses.dataclass
class BuildRun:
    """Which stages ran and which were skipped, each stage's result and seconds, and the error if any."""

    out_dir: Path
    executed: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    results: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    error: str = ""


def _check_stage(name: str | None, flag: str) -> None:
    if name is not None and name not in STAGE_NAMES:
        raise OptionError(
            f"{flag} {name}: no such stage.{did_you_mean(name, STAGE_NAMES)} Stages: {', '.join(STAGE_NAMES)}."
        )


def _key(stage: Stage, ctx: StageContext) -> str:
    digests = [section_digest(ctx.config, s) for s in stage.sections] + [stage.extra_key(ctx)]
    return stage_key(stage.name, digests, stage.inputs(ctx))


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def summary_lines(results: dict[str, dict[str, Any]], report_html: Path | None) -> list[str]:
    """The closing summary: accuracy float / int8 / NPU, MAC share on the NPU, estimated latency, report."""
    lines = []
    ev = results.get("evaluate")
    if ev:
        s = ev["scores"]
        lines.append(f"accuracy ({ev['metric']}, {ev['samples']} samples): float {_fmt(s.get('float'))} / "
                     f"int8 {_fmt(s.get('int8'))} / NPU {_fmt(s.get('npu'))}")  # fmt: skip
    comp = results.get("compile")
    if comp:
        lines.append(f"NPU ({comp['target']}): {100 * comp['mac_share']:.1f}% of known MACs, {comp['npu_ops']} of "
                     f"{comp['total_ops']} ops in {comp['subgraphs']} subgraph(s); estimated NPU latency {comp['npu_ms']:.4f} ms "
                     f"({comp['npu_cycles']} cycles at {comp['clock_mhz']} MHz)")  # fmt: skip
    if report_html is not None:
        lines.append(f"report: {report_html}")
    return lines


def _report_data(config: BuildConfig, run: BuildRun) -> ReportData:
    out = run.out_dir
    q = run.results.get("quantize") or {}
    layers = read_json(out / q["layer_report"]) if q.get("layer_report") else None
    comp = run.results.get("compile")
    summary = [
        (line.split(":", 1)[0], line.split(":", 1)[1].strip()) for line in summary_lines(run.results, None)
    ]
    summary += [(f"stage {k}", f"{v:.2f} s") for k, v in run.seconds.items()]
    return ReportData(
        title=f"zonnx build: {config.get('model', 'source')} for {config.get('compile', 'target')}",
        summary=summary,
        accuracy=run.results.get("evaluate"),
        layers=(layers or {}).get("layers", []),
        histograms=(read_json(out / "layer_histograms.json") or []) if q else [],
        partition=read_json(out / "partition.json") if comp else None,
        profile=read_json(out / "profile.json") if comp else None,
        search=(q.get("search") or {}).get("table"),
        config=config.text,
        error=run.error,
    )


def _write_reports(config: BuildConfig, run: BuildRun) -> Path | None:
    out = run.out_dir
    body = {
        "config": config.sections,
        "stages": run.results,
        "seconds": run.seconds,
        "error": run.error or None,
    }
    write_bytes_atomic(out / "report.json", json.dumps(body, indent=1, default=str).encode())
    if not config.get("report", "html"):
        return None
    return write_report(out / "report.html", _report_data(config, run))


def run_config(
    config: BuildConfig,
    console: Console,
    *,
    from_stage: str | None = None,
    only: str | None = None,
    backend: str | None = None,
) -> BuildRun:
    """Run ``config``'s stages (see the module docstring); ``backend`` overrides [evaluate] backend."""
    _check_stage(from_stage, "--from")
    _check_stage(only, "--only")
    if backend is not None:
        config.sections["evaluate"]["backend"] = backend
    out = config.out_dir
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelSaveError(f"{out}: cannot create the output folder ({e.strerror}).") from None
    cache = StageCache(out)
    run = BuildRun(out)
    forced = False
    console.rule(f"[bold]zonnx build[/] {config.get('model', 'source')} -> {out}")
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        for stage in STAGES:
            forced = forced or stage.name == from_stage
            if only is not None and stage.name != only:
                record = cache.load(stage.name)
                if record is not None:
                    run.results[stage.name] = record["result"]
                continue
            task = progress.add_task(stage.name, total=None)
            ctx = StageContext(config, out, advance=lambda n, t=task: progress.advance(t, n))
            try:
                key = _key(stage, ctx)
                reuse = None if (forced or only == stage.name) else cache.fresh(stage.name, key)
                if reuse is not None:
                    run.results[stage.name] = reuse
                    run.skipped.append(stage.name)
                    console.print(f"  {stage.name:<10} skipped (inputs and config unchanged)", markup=False)
                    continue
                remove_artifacts(ctx, stage)
                cache.forget(stage.name)
                start = time.perf_counter()
                result = stage.run(ctx)
                run.seconds[stage.name] = round(time.perf_counter() - start, 3)
                cache.store(stage.name, key, result, [ctx.file(a) for a in stage.artifacts])
            except ZonnxError as e:
                run.error = f"stage {stage.name} failed: {e}"
                _write_reports(config, run)
                raise
            except Exception as e:
                run.error = f"stage {stage.name} failed: {type(e).__name__}: {e}"
                _write_reports(config, run)
                raise
            finally:
                progress.remove_task(task)
            run.results[stage.name] = result
            run.executed.append(stage.name)
            console.print(f"  {stage.name:<10} done in {run.seconds[stage.name]:.2f} s", markup=False)
    html = None
    if only in (None, "report"):
        start = time.perf_counter()
        html = _write_reports(config, run)
        run.executed.append("report")
        console.print(f"  {'report':<10} done in {time.perf_counter() - start:.2f} s", markup=False)
    for line in summary_lines(run.results, html):
        console.print(line, markup=False, highlight=False)
    return run
