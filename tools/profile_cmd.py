"""``zonnx profile MODEL [--target T] [--json] [--clock-mhz F]``: estimated NPU cycles, time, DDR traffic and tiling per layer."""

from __future__ import annotations

__all__ = ["profile"]

import json
import sys
from pathlib import Path

import typer

from zonnx.backend.profile import profile_model, render_profile
from zonnx.tools.console import console
from zonnx.tools.options import parse_input_shapes


def profile(
    model: Path = typer.Argument(
        ..., help="A compiled .onnx model, or a quantized one (compiled first).", show_default=False
    ),
    target: str = typer.Option(
        None,
        "--target",
        "-t",
        help="Target name or a target .toml file (default: the compiled model's target; dpu-b4096 "
        "when the model still has to be compiled).",
    ),
    json_: bool = typer.Option(False, "--json", help="Print the report as JSON instead of tables."),
    clock_mhz: float = typer.Option(None, "--clock-mhz", help="NPU clock in MHz (default: the target's)."),
    min_nodes: int = typer.Option(2, "--min-nodes", help="Smallest NPU subgraph when compiling, in ops."),
    input_shape: list[str] = typer.Option(
        None, "--input-shape", help="Fixed input shape, e.g. x:1,3,224,224 (repeatable)."
    ),
) -> None:
    """Estimate each NPU layer's cycles, time, DDR bytes and on-chip tiling from the target's hardware numbers.

    Prints one row per NPU layer (MACs, cycles, ms, DDR read/written, tile over output rows x columns x
    channels, number of tiles, whether weights stay resident, compute or memory bound) and per CPU node
    (MACs only), then the totals and every assumed number. Exit code 2 on bad input.
    """
    report = profile_model(
        model,
        target,
        clock_mhz=clock_mhz,
        min_nodes=min_nodes,
        input_shapes=parse_input_shapes(input_shape),
    )
    if json_:
        sys.stdout.write(json.dumps(report.to_dict(), indent=1) + "\n")
        return
    render_profile(report, console)
