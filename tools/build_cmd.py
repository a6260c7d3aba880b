"""``zonnx build``: the main job, end to end on a model (the digits CNN by default), with a report."""

from __future__ import annotations

__all__ = ["build"]

from pathlib import Path

import typer

from zonnx.build import BuildOptions, run_build
from zonnx.tools.console import console


def build(
    model: str = typer.Argument(
        "digits_cnn", help="An .onnx file or a zoo model name (digits_cnn, ppocr_rec, resnet18-random, ...)."
    ),
    out_dir: Path = typer.Option(Path("out"), "--out-dir", "-o", help="Folder for the outputs and report."),
    opset: int = typer.Option(17, "--opset", help="Opset the optimizer upgrades to."),
    verify: bool = typer.Option(True, "--verify/--no-verify", help="Compare outputs after every pass."),
    target: str = typer.Option("dpu-b4096", "--target", help="NPU target to quantize, compile and run for."),
    no_deploy: bool = typer.Option(
        False, "--no-deploy", help="Stop after optimizing (no quantize/compile/run)."
    ),
    calib: str = typer.Option(None, "--calib", help="Calibration data for a model outside the zoo."),
) -> None:
    """Load or build MODEL, optimize, inspect, quantize for --target, compile, run on the simulated NPU, report."""
    run_build(
        BuildOptions(
            model=model,
            out_dir=out_dir,
            opset=opset,
            verify=verify,
            target=None if no_deploy else target,
            calib=calib,
        ),
        console,
    )
