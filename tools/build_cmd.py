"""``zonnx build``: the main job, end to end on a model (the digits CNN by default), with a report."""

from __future__ import annotations

__all__ = ["build"]

from pathlib import Path

import typer

from zonnx.build import BuildOptions, run_build
from zonnx.tools.console import console


def build(
    model: str = typer.Argument(
        "digits_cnn", help="An .onnx file or a zoo model name (digits_cnn, resnet18, ppocr_rec, ...)."
    ),
    out_dir: Path = typer.Option(Path("out"), "--out-dir", "-o", help="Folder for the outputs and report."),
    opset: int = typer.Option(17, "--opset", help="Opset the optimizer upgrades to."),
    verify: bool = typer.Option(True, "--verify/--no-verify", help="Compare outputs after every pass."),
) -> None:
    """Load or build MODEL, optimize it, inspect it and write a report (more stages land as zonnx grows)."""
    run_build(BuildOptions(model=model, out_dir=out_dir, opset=opset, verify=verify), console)
