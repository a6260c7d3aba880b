"""The end-to-end build: load (or build) a model, optimize, inspect, evaluate, and write a JSON report.

Stages run in order and each adds a section to ``report.json``; later parts of zonnx (quantize,
partition, compile, run) add their stages here.
"""

from __future__ import annotations

__all__ = ["BuildOptions", "BuildReport", "run_build"]

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from zonnx import zoo
from zonnx.errors import ModelSaveError
from zonnx.inspection import inspect_model, render_summary, summary_to_dict
from zonnx.ir.io import load_proto, save_model, write_bytes_atomic
from zonnx.ir.large import load_whole_or_mapped, whole_proto
from zonnx.optimization import OptimizeOptions, optimize_with_report
from zonnx.passes.pipeline import VerifyOptions
from zonnx.passes.report import pipeline_report_dict, render_pipeline_report
from zonnx.paths import refuse_overwrites
from zonnx.verify import compare_outputs, run_ort

#: Calibration samples a user's model (outside the zoo) is evaluated on, NPU and fake-quant vs float.
NPU_EVAL_SAMPLES = 16


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """Options of ``zonnx build``.

    Attributes:
        model: an .onnx path or a zoo model name (default "digits_cnn", trained at first use).
        out_dir: folder for outputs (default "out").
        opset: opset the optimizer upgrades to (default 17).
        verify: compare outputs after every pass (default True).
        target: NPU target to quantize for, compile for and run on (default "dpu-b4096"); None stops
            after optimizing.
        calib: calibration data for models outside the zoo (folder, .npz, FILE.py:FUNC).
        external_data: write every model's weights to ``NAME.onnx.data`` beside it (default False:
            automatic past 2 GB only).
    """

    model: str = "digits_cnn"
    out_dir: Path = Path("out")
    opset: int = 17
    verify: bool = True
    target: str | None = "dpu-b4096"
    calib: str | None = None
    external_data: bool = False


@dataclasses.dataclass
class BuildReport:
    """What each stage produced, in order; written as report.json."""

    model: str
    stages: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"model": self.model, "stages": self.stages}, indent=2, default=str)


def _resolve_model(name: str, console: Console) -> Path:
    if name in zoo.RENAMED and not Path(name).exists():
        zoo.get(name)  # refused with the model's new name
    if name in zoo.names():
        with console.status(f"preparing zoo model {name} (built once, then cached)"):
            return zoo.get(name)
    return Path(name)


def _evaluate(name: str, original: Path, optimized: Path) -> dict[str, Any]:
    """Digits: top-1 accuracy before and after; other zoo models: output agreement on real samples."""
    if name == "digits_cnn":
        from zonnx.zoo.digits import digits_data, evaluate_top1

        x, y = digits_data("test")
        return {
            "task": "digits test top-1",
            "samples": len(y),
            "float_top1": evaluate_top1(original, x, y),
            "optimized_top1": evaluate_top1(optimized, x, y),
        }
    if name not in zoo.names():
        return {}
    worst = 0.0
    samples = zoo.sample_inputs(name, 4)
    for feeds in samples:
        for d in compare_outputs(run_ort(original, feeds), run_ort(optimized, feeds)):
            worst = max(worst, d.relative)
    return {"task": "output agreement on sample inputs", "samples": len(samples), "max_relative_error": worst}


def _deploy(options: BuildOptions, optimized: Path, report: BuildReport, console: Console) -> None:
    """Quantize for the target, compile for its NPU, run the NPU session and evaluate it."""
    from zonnx.build_npu import calibration_feeds, compile_and_run, npu_evaluation, quantize_for_target
    from zonnx.hostcpu import host_int

    target = options.target
    assert target is not None
    quant_path = _output_paths(options, optimized.stem.removesuffix(".opt"))["quantized model"]
    reader = calibration_feeds(options.model, options.calib, load_proto(optimized, load_external_data=False))
    with console.status(f"quantizing for {target}"):
        report.stages["quantize"] = quantize_for_target(
            optimized, quant_path, target, reader, external_data=options.external_data
        )
    q = report.stages["quantize"]
    console.print(
        f"quantize: {q['format']} / {q['method']} for {target}: {q['quantized']}; "
        f"target rules {q['target_rules'] or 'no change needed'}; worst layer {q['worst_layer']}",
        markup=False,
    )
    session, compiled = compile_and_run(
        quant_path, options.out_dir, target, external_data=options.external_data
    )
    report.stages["compile"] = compiled
    host = host_int()
    report.stages["host"] = {"isa": host.isa, "u8s8_exact": host.u8s8_exact, "integer_path": host.path}
    console.print(f"host: {host.describe()}", markup=False)
    console.print(compiled["partition"], markup=False, highlight=False)
    feeds = None
    if options.model not in zoo.names():  # a user's model: its calibration samples (issue 11, item 17)
        from zonnx.quantization.search.run import read_feeds

        feeds = read_feeds(
            calibration_feeds(options.model, options.calib, load_proto(optimized, load_external_data=False)),
            "--calib",
        )
        feeds = feeds[:NPU_EVAL_SAMPLES]
    result = npu_evaluation(options.model, session, optimized, quant_path, feeds)
    report.stages["npu"] = result
    console.print(
        "npu: "
        + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()),
        markup=False,
    )


def run_build(options: BuildOptions, console: Console) -> BuildReport:
    """Run every stage and print each one's result; raises ZonnxError on bad input.

    A build that fails (or is interrupted) removes what it added to the output folder, and the folder
    itself when this build created it: no half-built outputs are left behind.
    """
    out_dir = options.out_dir
    existed = out_dir.is_dir()
    before = {p.name for p in out_dir.iterdir()} if existed else set()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelSaveError(f"{out_dir}: cannot create the output folder ({e.strerror}).") from None
    try:
        return _run_build(options, console)
    except BaseException:
        _remove_new_entries(out_dir, before, remove_dir=not existed)
        raise


def _remove_new_entries(out_dir: Path, before: set[str], *, remove_dir: bool) -> None:
    """Delete what a failed build added under ``out_dir`` (and ``out_dir`` if it made it); best effort."""
    try:
        for path in out_dir.iterdir():
            if path.name not in before:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        if remove_dir:
            out_dir.rmdir()
    except OSError:
        pass


def _output_paths(options: BuildOptions, stem: str) -> dict[str, Path]:
    """Every file a build of a model named ``stem`` writes, by what it is (one naming rule for the stages
    and for the path rule). Files of the deploy stages carry the target's own name, not its path."""
    out = options.out_dir
    paths = {"report.json": out / "report.json", "optimized model": out / f"{stem}.opt.onnx"}
    if options.target is not None:
        from zonnx.backend.targets import load_target

        tag = load_target(options.target).name  # fails on an unknown target before any work
        quant = out / f"{stem}.{tag}.q.onnx"
        paths.update({"quantized model": quant, "quantization report": Path(f"{quant}.report.json"),
                      "report.html": out / "report.html",
                      "compiled model": out / f"{quant.stem}.{tag}.onnx"})  # fmt: skip
    return paths


def _refuse_overwrites(options: BuildOptions, src: Path) -> None:
    """The path rule (``zonnx.paths``): none of the files this build writes may be its model or calibration."""
    calib = Path(options.calib) if options.calib and Path(options.calib).is_file() else None
    refuse_overwrites({"MODEL": src, "--calib": calib}, _output_paths(options, src.stem))


def _run_build(options: BuildOptions, console: Console) -> BuildReport:
    src = _resolve_model(options.model, console)
    _refuse_overwrites(options, src)
    report = BuildReport(model=str(src))
    t0 = time.perf_counter()
    proto, _ = load_whole_or_mapped(src)  # past 2 GB the weights stay mapped from their file
    report.stages["load"] = {"path": str(src), "seconds": round(time.perf_counter() - t0, 3)}
    console.rule(f"[bold]zonnx build[/] {options.model}")

    # Zoo models verify on their real sample inputs (a detector on noise gives outputs of tiny range).
    feeds = zoo.sample_inputs(options.model, 1)[0] if options.model in zoo.names() else None
    opt = OptimizeOptions(
        target_opset=options.opset, verify=VerifyOptions(feeds=feeds) if options.verify else None
    )
    with console.status("optimizing"):
        result = optimize_with_report(proto, opt)
    outputs = _output_paths(options, src.stem)
    optimized_path = outputs["optimized model"]
    save_model(
        whole_proto(result.model), optimized_path, input_path=src, external_data=options.external_data or None
    )
    render_pipeline_report(result.report, console)
    report.stages["optimize"] = {"output": str(optimized_path), **pipeline_report_dict(result.report)}

    summary = inspect_model(optimized_path)
    render_summary(summary, console)
    report.stages["inspect"] = summary_to_dict(summary)

    if options.target is not None:
        _deploy(options, optimized_path, report, console)
    evaluation = _evaluate(options.model, src, optimized_path)
    if evaluation:
        report.stages["evaluate"] = evaluation
        console.print(
            "evaluate: "
            + ", ".join(
                f"{k}={v:.4f}" if isinstance(v, float | np.floating) else f"{k}={v}"
                for k, v in evaluation.items()
            ),
            markup=False,
        )
    report_path = outputs["report.json"]
    write_bytes_atomic(report_path, report.to_json().encode())
    console.print(f"wrote {optimized_path} and {report_path}", markup=False)
    if options.target is not None:
        _html_and_summary(options, report, outputs["report.html"], console)
    return report


def _html_and_summary(options: BuildOptions, report: BuildReport, html: Path, console: Console) -> None:
    """report.html, then the closing summary: accuracy float / int8 / NPU, NPU MAC share, latency, page."""
    from zonnx.deploy.cli_report import cli_summary, report_from_stages
    from zonnx.deploy.report_html import write_report

    shown = {k: str(v) for k, v in dataclasses.asdict(options).items()}
    data = report_from_stages(
        report.stages, f"zonnx build {options.model} for {options.target}", json.dumps(shown, indent=1)
    )
    write_report(html, data)
    console.rule("[bold]summary[/]")
    for line in cli_summary(data, html):
        console.print(line, markup=False, highlight=False)
