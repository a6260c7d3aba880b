"""``zonnx compare A.onnx B.onnx [--inputs X.npz]``: every tensor the two models share, and the first that diverges."""

from __future__ import annotations

__all__ = ["compare", "parse_tolerance"]

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from zonnx.compare import DEFAULT_TOL_COS, Comparison, TensorDiff, check_feeds, compare_models
from zonnx.errors import ModelSaveError, OptionError, did_you_mean
from zonnx.inspection.render import PLAIN_BOX
from zonnx.ir.io import load_proto, write_bytes_atomic
from zonnx.paths import refuse_overwrites
from zonnx.tools.console import console, err_console
from zonnx.tools.options import load_feeds
from zonnx.verify import make_inputs

_TOLERANCES = ("cos",)


def parse_tolerance(value: str) -> float:
    """``cos=0.99`` -> 0.99 (the cosine below which a tensor diverges); OptionError otherwise."""
    key, sep, number = value.partition("=")
    key = key.strip()
    if key not in _TOLERANCES:
        raise OptionError(
            f"--tolerance {value!r}: the tolerance is given as cos=0.99.{did_you_mean(key, _TOLERANCES)}"
        )
    try:
        tol = float(number)
    except ValueError:
        tol = float("nan")
    if not sep or not -1 <= tol <= 1:
        raise OptionError(f"--tolerance {value!r}: give a cosine in [-1, 1], e.g. cos=0.99.")
    return tol


def _num(v: float | int | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _table(result: Comparison, top: int) -> Table:
    first = result.first_divergence
    shown = result.worst(top)
    if first is not None and first not in shown:
        shown.append(first)
    lsb = any(r.lsb is not None for r in result.rows)
    title = f"worst {len(shown)} of {len(result.rows)} tensors ({result.mode})"
    table = Table(title=title, box=PLAIN_BOX, title_justify="left")
    for col in ("#", "tensor (A)", "op", "shape", "cosine", "SQNR dB", "max abs", *(["LSB"] if lsb else [])):
        table.add_column(col, justify="left" if col in ("tensor (A)", "op") else "right")
    table.add_column("status")

    def status(r: TensorDiff) -> str:
        return "FIRST BELOW" if r is first else ("below" if r.cosine < result.tol_cos else "ok")

    for r in shown:
        table.add_row(
            str(r.index), escape(r.tensor), escape(r.op), "x".join(map(str, r.shape)), f"{r.cosine:.6f}",
            f"{r.sqnr_db:.1f}", f"{r.max_abs:.4g}", *([_num(r.lsb, "d")] if lsb else []), status(r),
            style="bold red" if r is first else ("yellow" if r.cosine < result.tol_cos else None),
        )  # fmt: skip
    return table


def compare(
    model_a: Path = typer.Argument(
        ..., help="Model A (its order is the report's): float, quantized or compiled.", show_default=False
    ),  # fmt: skip
    model_b: Path = typer.Argument(
        ..., help="Model B: another form of the same network.", show_default=False
    ),
    inputs: Path = typer.Option(None, "--inputs", "-i", help="Feeds as .npz (one array per input name)."),
    tolerance: str = typer.Option(
        f"cos={DEFAULT_TOL_COS}", "--tolerance", help="A tensor diverges below this cosine: cos=0.99."
    ),
    json_path: Path = typer.Option(None, "--json", help="Write every tensor's numbers to this JSON file."),
    top: int = typer.Option(10, "--top", help="Rows of the table: the N lowest cosines."),
    seed: int = typer.Option(0, "--seed", help="Seed of generated inputs (without --inputs)."),
) -> None:
    """Compare every tensor A and B share (float vs fake-quant vs compiled NPU model) on the same inputs.

    Pairs tensors by tracing a quantized model to its float model, by the golden comparison for a
    compiled model (the code of `zonnx run --compare golden`), else by name; prints the N tensors of
    lowest cosine with SQNR and max abs error, and names the first tensor, in A's topological order,
    whose cosine is below the tolerance (exit code 1). --json FILE holds every tensor. Without
    --inputs, inputs are generated from A's input shapes (and a note says so). Bad input exits with 2.
    """
    tol = parse_tolerance(tolerance)
    if top < 1:
        raise OptionError(f"--top {top}: show at least 1 row.")
    refuse_overwrites({"A": model_a, "B": model_b, "--inputs": inputs}, {"--json": json_path})
    protos = {str(model_a): load_proto(model_a), str(model_b): load_proto(model_b)}
    if inputs is not None:
        feeds, where = load_feeds(inputs), f"--inputs {inputs}"
    else:
        feeds, where = make_inputs(protos[str(model_a)], seed=seed), f"generated inputs (seed {seed})"
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
        err_console.print(
            f"note: no --inputs: generated inputs (seed {seed}): {escape(shapes)}", soft_wrap=True
        )
    check_feeds(feeds, protos, where)
    result = compare_models(model_a, model_b, feeds, tol_cos=tol)
    for note in result.notes:
        err_console.print(f"note: {escape(note)}", soft_wrap=True)
    console.print(_table(result, top))
    if json_path is not None:
        data = {**result.to_dict(), "inputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype),
                                                   "generated": inputs is None} for k, v in feeds.items()}}  # fmt: skip
        try:
            write_bytes_atomic(json_path, (json.dumps(data, indent=1) + "\n").encode())
        except OSError as e:
            raise ModelSaveError(f"--json {json_path}: cannot write it ({e.strerror or e}).") from None
        console.print(f"wrote {escape(str(json_path))}", soft_wrap=True)
    style = "bold red" if result.first_divergence else "bold green"
    console.print(escape(result.summary()), style=style, soft_wrap=True)
    if result.first_divergence is not None:
        raise typer.Exit(1)
