"""``zonnx inspect MODEL``: print what a model holds (I/O, ops, parameters, MACs, quantization) or its JSON."""

from __future__ import annotations

__all__ = ["inspect"]

import sys
from pathlib import Path

import typer

from zonnx.inspection import inspect_model, render
from zonnx.tools.console import console
from zonnx.tools.options import parse_input_shapes


def inspect(
    model: Path = typer.Argument(..., help="The .onnx model to inspect.", show_default=False),
    json_: bool = typer.Option(False, "--json", help="Print the summary as JSON (keys: see ModelSummary)."),
    batch: int = typer.Option(1, "--batch", "-b", help="Value for symbolic batch dims when counting MACs."),
    input_shape: list[str] = typer.Option(
        None, "--input-shape", help="Input shape for counting MACs, e.g. x:1,3,224,224 (repeatable)."
    ),
) -> None:
    """Summarize MODEL: inputs/outputs, op histogram, parameters, MACs, quantization, unknown shapes.

    External data is never read, and the model is never modified.
    """
    summary = inspect_model(model, batch=batch, shapes=parse_input_shapes(input_shape))
    if json_:
        sys.stdout.write(summary.to_json() + "\n")
        return
    render(summary, console)
