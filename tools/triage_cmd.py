"""``zonnx triage FLOAT QUANT --data X``: the activation quantizers whose float fall-back recovers the output."""

from __future__ import annotations

__all__ = ["triage"]

import typer
from rich.markup import escape
from rich.table import Table

from zonnx.errors import OptionError
from zonnx.inspection.render import PLAIN_BOX
from zonnx.ir.io import load_proto
from zonnx.paths import refuse_overwrites
from zonnx.quantization.search.run import read_feeds
from zonnx.quantization.sources import reader_from_source
from zonnx.quantization.triage import triage as run_triage
from zonnx.quantization.triage_remedies import REMEDIES
from zonnx.tools.console import console, err_console


def triage(
    float_model: str = typer.Argument(..., help="The float model.", show_default=False),
    quant_model: str = typer.Argument(
        ..., help="Its quantized model (QDQ, FixNeuron or VitisQDQ).", show_default=False
    ),
    data: str = typer.Option(
        ..., "--data", help="Samples: .npz/.npy, a folder of them, images or FILE.py:FUNC."
    ),
    metric: str = typer.Option("cosine", "--metric", help="cosine, top1, char-accuracy or FILE.py:Class."),
    tolerance: float = typer.Option(0.99, "--tolerance", help="The score the output must reach."),
    limit: int = typer.Option(16, "--limit", help="Use at most this many samples."),
    max_culprits: int = typer.Option(8, "--max-culprits", help="Stop after this many culprits."),
) -> None:
    """Find, by bisection over the activation quantizers in topological order, the first one that breaks
    the output and the smallest set whose float fall-back brings the score back over the tolerance;
    for each, the score with only it changed by each remedy (float, 16 bits, its range searched again). Exit 1 when the set found does not reach the tolerance."""
    if limit < 1 or max_culprits < 1:
        raise OptionError("--limit and --max-culprits must be at least 1.")
    refuse_overwrites({"FLOAT": float_model, "QUANT": quant_model}, {})
    fproto, qproto = load_proto(float_model), load_proto(quant_model)
    feeds = read_feeds(reader_from_source(data, fproto, limit=limit), "--data")
    result = run_triage(
        float_model, qproto, feeds, metric=metric, tolerance=tolerance, max_culprits=max_culprits,
        progress=lambda m: err_console.print(f"  {m}", markup=False),
    )  # fmt: skip
    table = Table(
        title=f"triage: {metric} baseline {result.baseline:.5f}, tolerance {tolerance}, {result.sites} activation "
        f"quantizers, {len(feeds)} samples, {result.runs} runs",
        box=PLAIN_BOX,
        title_justify="left",
    )
    for col in ("#", "tensor", *(f"{metric}: {r} alone" for r in REMEDIES), "best remedy"):
        table.add_column(col)
    for i, site in enumerate(result.culprits, 1):
        tried = result.remedies.get(site.tensor, {"float": result.alone[site.tensor]})
        cells = [f"{tried[r]:.5f}" if r in tried else "n/a" for r in REMEDIES]
        table.add_row(str(i), escape(site.tensor), *cells, result.best_remedy(site.tensor) or "-")
    console.print(table)
    if result.activations_off is not None:
        console.print(
            f"with every activation quantizer in float {metric} is still {result.activations_off:.5f}: the weights "
            "cause the loss. Quantize with per-channel weights (--per-channel), or leave the layers with the "
            "widest channel spread float (--exclude).",
            markup=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)
    if result.first is None:
        console.print("the quantized model meets the tolerance: nothing to recover", markup=False)
        return
    console.print(
        f"first divergent tensor: {result.first.tensor}; with the {len(result.culprits)} above in float: "
        f"{metric} {result.recovered:.5f}. Apply each one's best remedy: float (zonnx quantize --exclude NODE), "
        "16-bit (--config, per-node activation_type int16), range (--config TensorQuantOverrides, or "
        "--range-search), or let `zonnx quantize --accuracy-budget` choose.",
        markup=False,
        soft_wrap=True,
    )
    if result.recovered < tolerance:
        raise typer.Exit(1)
