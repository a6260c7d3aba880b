"""``zonnx optimize IN OUT``: run the pre-quantization pipeline and print what each pass changed."""

from __future__ import annotations

__all__ = ["optimize"]

import json
from pathlib import Path

import typer

from zonnx.converters.from_onnx import set_input_dims
from zonnx.errors import OptionError
from zonnx.ir.io import check_wiring, load_proto, save_model
from zonnx.ir.large import load_whole_or_mapped, whole_proto
from zonnx.optimization import DEFAULT_OPSET, OptimizeOptions, optimize_with_report
from zonnx.passes.catalog import PASSES, PIPELINES, pass_class
from zonnx.passes.pipeline import VerifyOptions
from zonnx.passes.report import pipeline_report_dict, render_pipeline_report
from zonnx.paths import refuse_overwrites
from zonnx.tools.console import console, err_console
from zonnx.tools.options import load_feeds, parse_input_shapes, parse_name_list


def _list_passes() -> None:
    for name in PASSES:
        doc = (pass_class(name).__doc__ or "").strip().splitlines()[0]
        console.print(f"{name:26s} {doc}", markup=False)
    for name, members in PIPELINES.items():
        console.print(f"pipeline {name}: {', '.join(members)}", markup=False)


def optimize(
    model: Path = typer.Argument(None, help="Input .onnx model.", show_default=False),
    output: Path = typer.Argument(None, help="Output .onnx path (omit with --inplace).", show_default=False),
    opset: int = typer.Option(DEFAULT_OPSET, "--opset", help="Default-domain opset to upgrade to (13+)."),
    pipeline: str = typer.Option("pre_quant", "--pipeline", help="Named pipeline: pre_quant or clean."),
    passes: list[str] = typer.Option(
        None, "--passes", help="Run these passes/pipelines instead (comma list)."
    ),
    skip: list[str] = typer.Option(None, "--skip", help="Leave these passes out (comma list)."),
    verify: bool = typer.Option(False, "--verify", help="Check and compare ORT outputs after every pass."),
    input_shape: list[str] = typer.Option(
        None,
        "--input-shape",
        help="Fix an input's shape before the passes (and for --verify), e.g. x:1,3,224,224.",
    ),
    inputs: Path = typer.Option(
        None, "--inputs", help="Real inputs for --verify: .npz, one array per input."
    ),
    fixed_point: bool = typer.Option(
        True, "--fixed-point/--single-round", help="Repeat until nothing changes."
    ),
    inplace: bool = typer.Option(
        False, "--inplace", help="Allow OUTPUT to be the input file (or omit OUTPUT)."
    ),
    external_data: bool = typer.Option(
        False,
        "--external-data",
        help="Write the weights to OUT.onnx.data beside the model (automatic past 2 GB).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    list_passes: bool = typer.Option(False, "--list-passes", help="List passes and pipelines, then exit."),
) -> None:
    """Run the pre-quantization pass pipeline on MODEL and write OUTPUT."""
    if list_passes:
        _list_passes()
        return
    if model is None:
        raise OptionError("give the input model: zonnx optimize IN.onnx OUT.onnx")
    if output is None:
        if not inplace:
            raise OptionError("give an output path (zonnx optimize IN.onnx OUT.onnx) or --inplace.")
        output = model
    if not verify and inputs:  # --input-shape fixes dims for the passes too; --inputs only feeds --verify
        raise OptionError("--inputs only feed --verify's checks and do nothing without it: add --verify.")
    refuse_overwrites({"--inputs": inputs}, {"OUTPUT": output})  # IN == OUT is --inplace's business
    options = OptimizeOptions(
        target_opset=opset,
        pipeline=pipeline,
        passes=tuple(parse_name_list(passes)) or None,
        skip=tuple(parse_name_list(skip)),
        fixed_point=fixed_point,
        verify=VerifyOptions(
            shapes=parse_input_shapes(input_shape), feeds=load_feeds(inputs) if inputs else None
        )
        if verify
        else None,
    )
    skeleton = load_proto(model, load_external_data=False)
    check_wiring(
        skeleton, str(model)
    )  # an invalid input is said to be invalid, not optimized into a worse one
    shapes = parse_input_shapes(input_shape)
    if shapes:  # the passes see fixed dims, so shape arithmetic on them folds (convert's rule)
        skeleton = set_input_dims(skeleton, shapes)
    proto, _ = load_whole_or_mapped(model, skeleton=skeleton)  # past 2 GB the weights stay mapped
    show_progress = console.is_terminal and not as_json
    if show_progress:
        with console.status("optimizing") as status:
            result = optimize_with_report(proto, options, progress=lambda n: status.update(f"pass {n}"))
    else:
        result = optimize_with_report(proto, options)
    save_model(
        whole_proto(result.model),
        output,
        input_path=model,
        inplace=inplace,
        external_data=external_data or None,
    )
    if as_json:
        console.print_json(
            json.dumps({"input": str(model), "output": str(output), **pipeline_report_dict(result.report)})
        )
        return
    render_pipeline_report(result.report, console)
    err_console.print(f"wrote {output}", markup=False)
