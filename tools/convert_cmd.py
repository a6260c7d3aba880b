"""``zonnx convert INPUT -o OUT``: convert a torch/ONNX/TF/TFLite model to clean ONNX, check it against the
source, print the per-output comparison and the op counts before and after, and write it atomically."""

from __future__ import annotations

__all__ = ["convert", "parse_shape_options", "parse_dynamic", "parse_floats"]

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.table import Table

from zonnx.converters.common import DEFAULT_MIN_COSINE, render_checks
from zonnx.converters.dispatch import ConvertOptions
from zonnx.converters.preprocess import Preprocess
from zonnx.errors import OptionError
from zonnx.ir.io import save_model
from zonnx.paths import refuse_overwrites
from zonnx.tools.console import console, err_console
from zonnx.tools.options import load_feeds, parse_input_shapes, parse_name_list


def parse_shape_options(values: Sequence[str] | None) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """``NAME:D1,D2,...[:DTYPE]`` values -> (shapes, dtypes); the dtype (``int64``...) is for torch inputs."""
    plain, dtypes = [], {}
    for value in values or ():
        head, sep, tail = value.rpartition(":")
        if sep and tail and not tail.replace(",", "").isdigit():
            try:
                np.dtype(tail)
            except TypeError:
                raise OptionError(
                    f"--input-shape {value!r}: {tail!r} is not a dtype (use e.g. float32, int64)."
                ) from None
            dtypes[head.rpartition(":")[0]] = tail
            value = head
        plain.append(value)
    return parse_input_shapes(plain), dtypes


def parse_dynamic(values: Sequence[str] | None) -> dict[str, dict[int, str]]:
    """``NAME:AXIS=DIM[,AXIS=DIM]`` values (repeatable) -> {name: {axis: dim name}}."""
    out: dict[str, dict[int, str]] = {}
    for value in values or ():
        name, sep, spec = value.rpartition(":")
        try:
            pairs = [item.split("=", 1) for item in spec.split(",")]
            axes = {int(axis): dim.strip() for axis, dim in pairs}
        except ValueError:
            axes = {}
        if not sep or not name or not axes or any(not d or a < 0 for a, d in axes.items()):
            raise OptionError(
                f"--dynamic {value!r}: write it as NAME:AXIS=DIM_NAME, for example x:0=batch or "
                "ids:0=batch,1=seq."
            )
        out.setdefault(name, {}).update(axes)
    return out


def parse_floats(option: str, value: str | None) -> tuple[float, ...] | None:
    """``1,2,3`` -> (1.0, 2.0, 3.0); None stays None."""
    if value is None:
        return None
    try:
        return tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise OptionError(
            f"{option} {value!r}: give comma-separated numbers, e.g. 123.675,116.28,103.53."
        ) from None


def _init_args(value: str | None) -> dict[str, Any]:
    if not value:
        return {}
    try:
        args = json.loads(value)
    except json.JSONDecodeError as e:
        raise OptionError(
            f"--init-args {value!r}: not valid JSON ({e.msg}); write e.g. '{{\"num_classes\": 10}}'."
        ) from None
    if not isinstance(args, dict):
        raise OptionError(
            f"--init-args {value!r}: give a JSON object of keyword arguments, e.g. '{{\"num_classes\": 10}}'."
        )
    return args


def _preprocess(
    mean: str | None, scale: str | None, pixel_format: str | None, layout: str | None, input_dtype: str | None
) -> Preprocess | None:
    if all(v is None for v in (mean, scale, pixel_format, layout, input_dtype)):
        return None
    return Preprocess(
        mean=parse_floats("--mean", mean) or (0.0,),
        scale=parse_floats("--scale", scale) or (1.0,),
        pixel_format=pixel_format or "rgb",
        layout=layout or "nchw",
        input_dtype=input_dtype or "float32",
    )


def _render_ops(before: dict[str, int] | None, after: dict[str, int]) -> None:
    table = Table(title="ops before / after clean-up", title_justify="left")
    for col in ("op", "before", "after"):
        table.add_column(col)
    for op in sorted(set(before or {}) | set(after), key=lambda o: (-(after.get(o, 0)), o)):
        table.add_row(op, "-" if before is None else str(before.get(op, 0)), str(after.get(op, 0)))
    table.add_row("total", "-" if before is None else str(sum(before.values())), str(sum(after.values())))
    console.print(table)


def convert(
    source: str = typer.Argument(
        ...,
        help="model.py:Class, .pt, .pt2, .onnx, SavedModel folder, .keras/.h5, .tflite.",
        show_default=False,
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Output .onnx path.", show_default=False),
    input_shape: list[str] = typer.Option(
        None, "--input-shape", help="NAME:D1,D2,...[:DTYPE], e.g. x:1,3,224,224 (repeatable)."
    ),
    dynamic: list[str] = typer.Option(
        None, "--dynamic", help="Name dims dynamic: NAME:AXIS=DIM, e.g. x:0=batch."
    ),
    inputs: list[str] = typer.Option(
        None, "--inputs", help="Cut: start the graph at these tensors (comma list)."
    ),
    outputs: list[str] = typer.Option(
        None, "--outputs", help="Cut: end the graph at these tensors (comma list)."
    ),
    input_names: list[str] = typer.Option(None, "--input-names", help="Torch: names of the exported inputs."),
    output_names: list[str] = typer.Option(
        None, "--output-names", help="Torch: names of the exported outputs."
    ),
    init_args: str = typer.Option(None, "--init-args", help="model.py:Class constructor arguments as JSON."),
    opset: int = typer.Option(17, "--opset", help="Default-domain opset of the result (13+)."),
    test_input: list[Path] = typer.Option(
        None, "--test-input", help="Check inputs: .npz, one array per input."
    ),
    tolerance: float = typer.Option(
        DEFAULT_MIN_COSINE, "--tolerance", help="Minimum cosine per float output."
    ),
    max_lsb: int = typer.Option(1, "--max-lsb", help="Maximum code difference per quantized output."),
    check: bool = typer.Option(True, "--check/--no-check", help="Compare with the source framework."),
    custom_ops: list[str] = typer.Option(None, "--custom-ops", help="TF ops to keep as custom nodes."),
    mean: str = typer.Option(
        None, "--mean", help="Fold preprocessing: per-channel mean, e.g. 123.675,116.28,103.53."
    ),
    scale: str = typer.Option(
        None, "--scale", help="Fold preprocessing: per-channel scale, e.g. 0.0171,0.0175,0.0174."
    ),
    pixel_format: str = typer.Option(
        None, "--pixel-format", help="Raw image channel order: rgb, bgr or gray."
    ),
    layout: str = typer.Option(None, "--layout", help="Raw image layout: nchw or nhwc."),
    input_dtype: str = typer.Option(None, "--input-dtype", help="Raw image dtype: float32 or uint8."),
    external_data: bool = typer.Option(
        False,
        "--external-data",
        help="Write the weights to OUT.onnx.data beside the model (automatic past 2 GB).",
    ),
    preprocess_input: str = typer.Option(
        None, "--preprocess-input", help="Image input to fold preprocessing into."
    ),
) -> None:
    """Convert SOURCE to clean ONNX, check it against the source framework, and write OUTPUT."""
    from zonnx.convert import convert as run_convert

    shapes, dtypes = parse_shape_options(input_shape)
    if not 0 < tolerance <= 1:
        raise OptionError(f"--tolerance {tolerance}: give a cosine similarity in (0, 1], e.g. 0.9999.")
    if max_lsb < 0:
        raise OptionError(f"--max-lsb {max_lsb}: must be 0 or more.")
    options = ConvertOptions(
        input_shapes=shapes,
        input_dtypes=dtypes,
        dynamic=parse_dynamic(dynamic),
        inputs=tuple(parse_name_list(inputs)),
        outputs=tuple(parse_name_list(outputs)),
        input_names=tuple(parse_name_list(input_names)),
        output_names=tuple(parse_name_list(output_names)),
        init_args=_init_args(init_args),
        opset=opset,
        check=check,
        test_inputs=tuple(load_feeds(p) for p in test_input or ()),
        min_cosine=tolerance,
        max_lsb=max_lsb,
        custom_ops=tuple(parse_name_list(custom_ops)),
        preprocess=_preprocess(mean, scale, pixel_format, layout, input_dtype),
        preprocess_input=preprocess_input,
    )
    if output.suffix.lower() != ".onnx":
        raise OptionError(f"-o {output}: give an output path ending in .onnx.")
    src_file = Path(source.rpartition(":")[0] if ".py:" in source else source)
    if output.exists() and src_file.resolve() == output.resolve():
        raise OptionError(f"-o {output}: is the input model; choose another output path.")
    # the source (a folder: every file in it, e.g. a SavedModel's variables), test inputs, external data
    sources = [p for p in src_file.rglob("*") if p.is_file()] if src_file.is_dir() else [src_file]
    refuse_overwrites(
        {"SOURCE": sources, "--test-input": list(test_input or ())},
        {"--output": output, "--output (external data)": output.with_name(output.name + ".data")},
    )
    with console.status("converting") if console.is_terminal else contextlib.nullcontext():
        converted = run_convert(source, options)
    result = converted.result
    info = result.info
    console.print(f"{source}: {converted.kind} ({info.framework} {info.framework_version})", markup=False)
    if check:
        render_checks(result.checks, console)
        if converted.preprocess_checks:
            console.print("folded preprocessing vs unfolded model + numpy preprocessing:", markup=False)
            render_checks(converted.preprocess_checks, console)
    else:
        console.print("numeric check skipped (--no-check)", markup=False)
    _render_ops(converted.ops_before, converted.ops_after)
    save_model(result.model, output, external_data=external_data or None)
    err_console.print(f"wrote {output}", markup=False)
