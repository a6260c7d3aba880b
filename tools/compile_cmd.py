"""``zonnx compile MODEL --target T -o compiled.onnx``: partition and compile ahead of time, print the partition."""

from __future__ import annotations

__all__ = ["compile"]

import json
import sys
from collections import Counter
from pathlib import Path

import typer

from zonnx.backend.compile_api import compile_model
from zonnx.backend.partition import render_partition, to_dict
from zonnx.backend.partition.partitioner import MIN_MACS
from zonnx.ir.io import save_model
from zonnx.tools.console import console
from zonnx.tools.options import parse_input_shapes


def compile(  # noqa: A001 - the subcommand's name
    model: Path = typer.Argument(..., help="A quantized .onnx model (QDQ or FixNeuron).", show_default=False),
    target: str = typer.Option("dpu-b4096", "--target", "-t", help="Target name or a target .toml file."),
    output: Path = typer.Option(
        None, "--output", "-o", help="Compiled model to write (default MODEL_compiled.onnx)."
    ),
    min_nodes: int = typer.Option(2, "--min-nodes", help="Smallest NPU subgraph, in ops (see --min-macs)."),
    min_macs: int = typer.Option(
        MIN_MACS, "--min-macs", help="A smaller subgraph still goes to the NPU when it has this many MACs."
    ),
    input_shape: list[str] = typer.Option(
        None,
        "--input-shape",
        help="Fixed input shape, e.g. x:1,3,224,224 (repeatable); shape arithmetic is folded after it.",
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Fail (exit 2) when the NPU gets no node or under half the MACs."
    ),
    verbose: bool = typer.Option(
        False, "--verbose", help="List subgraph tensors and every CPU node with its reason."
    ),
    external_data: bool = typer.Option(
        False,
        "--external-data",
        help="Write the weights to OUT.onnx.data beside the model (automatic past 2 GB).",
    ),
    json_: bool = typer.Option(False, "--json", help="Print the partition as JSON instead of tables."),
) -> None:
    """Compile MODEL for an NPU target: each NPU subgraph becomes one com.zonnx NpuSubgraph node.

    Prints how many nodes and what share of MACs run on the NPU, the subgraphs, and the CPU nodes per
    rule they broke (--verbose or --json for every node). Low NPU coverage is a warning with its cause
    and fix (--strict: an error). Exit code 2 on bad input (float model, unknown target, unwritable output).
    """
    out = output or model.with_name(f"{model.stem}_compiled.onnx")
    compiled = compile_model(
        model,
        target,
        min_nodes=min_nodes,
        min_macs=min_macs,
        input_shapes=parse_input_shapes(input_shape),
        strict=strict,
    )
    if external_data or compiled.wants_external():  # weights and stored executable beside it (compiled_store)
        compiled.save(out, external_data=True)
    else:
        save_model(compiled.model, out, input_path=model)
    if json_:
        sys.stdout.write(json.dumps({**to_dict(compiled.partition), "output": str(out)}, indent=1) + "\n")
        return
    grid_rules = Counter(
        r for r in compiled.partition.rules.values() if r in ("zero_point", "scale", "dtype")
    )
    if grid_rules:  # a model quantized for another scheme: one line with the fix, before the details
        what = ", ".join(f"{r} {n}" for r, n in grid_rules.most_common())
        console.print(
            f"{sum(grid_rules.values())} node(s) stay on the CPU because the model's quantization grids break "
            f"{compiled.partition.target}'s rules ({what}); retarget it: zonnx quantize {model} "
            f"{model.with_name(model.stem + '_' + compiled.partition.target + '.onnx')} --target {target}",
            markup=False,
        )
    render_partition(compiled.partition, console, verbose=verbose)
    if verbose:
        for sub, prog in zip(compiled.partition.subgraphs, compiled.programs, strict=True):
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(prog.op_counts().items()))
            console.print(f"subgraph {sub.id}: {len(prog.ops)} NPU ops ({kinds})", soft_wrap=True)
    console.print(f"wrote {out} in {compiled.seconds:.2f} s", soft_wrap=True)
