"""``zonnx build``: the main job, end to end on a model (the digits CNN by default), or from a config file."""

from __future__ import annotations

__all__ = ["build"]

from pathlib import Path

import typer

from zonnx.build import BuildOptions, run_build
from zonnx.errors import OptionError
from zonnx.tools.console import console


def _init(path: Path) -> None:
    from zonnx.deploy import EXAMPLE

    if path.exists():
        raise OptionError(f"{path}: already exists; give --init another file name or remove it.")
    path.write_text(EXAMPLE)
    console.print(f"wrote {path}; run it with: zonnx build {path}", markup=False)


def build(
    model: str = typer.Argument(
        "digits_cnn",
        help="A build config (.toml), an .onnx file or a zoo model name (digits_cnn, ppocr_rec, resnet18-random, ...).",
    ),
    out_dir: Path = typer.Option(Path("out"), "--out-dir", "-o", help="Folder for the outputs and report."),
    opset: int = typer.Option(17, "--opset", help="Opset the optimizer upgrades to."),
    verify: bool = typer.Option(True, "--verify/--no-verify", help="Compare outputs after every pass."),
    target: str = typer.Option("dpu-b4096", "--target", help="NPU target to quantize, compile and run for."),
    no_deploy: bool = typer.Option(
        False, "--no-deploy", help="Stop after optimizing (no quantize/compile/run)."
    ),
    calib: str = typer.Option(None, "--calib", help="Calibration data for a model outside the zoo."),
    init: bool = typer.Option(
        False,
        "--init",
        help="Write a commented example config (to MODEL if it ends in .toml, else build.toml).",
    ),
    from_stage: str = typer.Option(None, "--from", help="With a config: re-run from this stage on."),
    only: str = typer.Option(None, "--only", help="With a config: run only this stage."),
    external_data: bool = typer.Option(
        False, "--external-data", help="Write each model's weights to NAME.onnx.data (automatic past 2 GB)."
    ),
    ray: bool = typer.Option(
        False, "--ray", help="With a config: evaluate as Ray tasks ([evaluate] backend)."
    ),
) -> None:
    """Load or build MODEL, optimize, inspect, quantize for --target, compile, run on the simulated NPU, report.

    With a config file (zonnx build build.toml) the stages come from the file and a stage whose inputs
    and config section are unchanged is skipped.
    """
    if init:
        _init(Path(model) if model.endswith(".toml") else Path("build.toml"))
        return
    if model.endswith(".toml"):
        from zonnx.deploy import load_build_config, run_config

        run_config(load_build_config(model), console, from_stage=from_stage, only=only,
                   backend="ray" if ray else None)  # fmt: skip
        return
    if from_stage or only or ray:
        raise OptionError(
            "--from, --only and --ray go with a build config: zonnx build build.toml (see --init)."
        )
    run_build(
        BuildOptions(
            model=model,
            out_dir=out_dir,
            opset=opset,
            verify=verify,
            target=None if no_deploy else target,
            calib=calib,
            external_data=external_data,
        ),
        console,
    )
