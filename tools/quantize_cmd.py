"""``zonnx quantize IN OUT --calib SRC``: static quantization with a progress bar and a summary table."""

from __future__ import annotations

__all__ = ["quantize"]

import time
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from zonnx.errors import OptionError
from zonnx.ir.io import external_data_locations, load_proto
from zonnx.paths import refuse_overwrites, target_file
from zonnx.quantization.api import build_config, quantize_static
from zonnx.quantization.config import load_config_file
from zonnx.quantization.sources import reader_from_source
from zonnx.tools.console import console, err_console
from zonnx.tools.options import parse_input_shapes, parse_name_list
from zonnx.tools.quantize_args import (
    calib_file,
    check_search_flags,
    fold_fast_finetune,
    generic_defaults,
    parse_extra,
    parse_floats,
    target_defaults,
)
from zonnx.tools.quantize_budget import run_budget_search
from zonnx.tools.quantize_ray import quantize_executor
from zonnx.tools.quantize_summary import summary_table


def quantize(
    ctx: typer.Context,
    model: Path = typer.Argument(..., help="Float .onnx model."),
    output: Path = typer.Argument(..., help="Quantized .onnx to write."),
    calib: str = typer.Option(
        None, "--calib", help="Images folder, .npz/.npy, folder of arrays, or FILE.py:FUNC."
    ),
    config: Path = typer.Option(None, "--config", help="TOML or JSON config with per-op/per-node overrides."),
    method: str = typer.Option(
        None,
        "--method",
        help="minmax, entropy, percentile, mse, nonoverflow, minmse, ...",
        show_default="minmax; a --target picks its own",
    ),
    weight_method: str = typer.Option(
        None, "--weight-method", help="Weight calibration method.", show_default="minmax"
    ),
    fmt: str = typer.Option(
        None,
        "--format",
        help="qdq, qoperator, fixneuron or vitisqdq.",
        show_default="qdq; a --target picks its own",
    ),
    target: str = typer.Option(
        None,
        "--target",
        help="NPU target: its scheme fills the options not given, its rules refine the result.",
    ),
    per_channel: bool = typer.Option(
        None,
        "--per-channel/--per-tensor",
        help="Per-channel weights.",
        show_default="per channel; a --target picks its own",
    ),
    placement: str = typer.Option(
        None,
        "--placement",
        help="Which tensors get quantizers: kernels (only what integer kernels read; default without a "
        "target) or ort (every tensor of quantizable ops, as ONNX Runtime's quantize_static).",
        show_default="kernels; ort with --target",
    ),
    activation_type: str = typer.Option(
        None,
        "--activation-type",
        help="int8, uint8, int16, uint16, bfloat16.",
        show_default="int8; a --target picks its own",
    ),
    weight_type: str = typer.Option(
        None, "--weight-type", help="int8, uint8, int4, int16, bfloat16.", show_default="int8"
    ),
    exclude: list[str] = typer.Option(None, "--exclude", help="Node names to leave float (comma list)."),
    op_types: list[str] = typer.Option(None, "--op-types", help="Only quantize these op types (comma list)."),
    limit: int = typer.Option(
        None, "--limit", help="Use at most this many calibration samples.", show_default="all"
    ),
    size: str = typer.Option(None, "--size", help="Image HEIGHT,WIDTH (default: the model's input size)."),
    mean: str = typer.Option(
        None, "--mean", help="Per-channel mean subtracted from pixels, e.g. 123.7,116.3,103.5."
    ),
    scale: str = typer.Option(
        None, "--scale", help="Per-channel multiplier after the mean, e.g. 0.0171,0.0175,0.0174."
    ),
    pixel_format: str = typer.Option(None, "--pixel-format", help="rgb, bgr or gray."),
    layout: str = typer.Option(None, "--layout", help="nchw or nhwc."),
    save_stats: Path = typer.Option(
        None, "--save-stats", help="Save calibration statistics for re-quantizing."
    ),
    load_stats: Path = typer.Option(
        None, "--load-stats", help="Reuse saved statistics instead of calibrating."
    ),
    export_table: Path = typer.Option(None, "--export-table", help="Write a TPU-MLIR calibration table."),
    load_table: Path = typer.Option(
        None, "--load-table", help="Take ranges from a TPU-MLIR calibration table."
    ),
    cle: bool = typer.Option(
        None,
        "--cle/--no-cle",
        help="Cross-layer equalization before calibration (IncludeCLE).",
        show_default="off; on with a --target whose weights are per tensor (dpu-b4096)",
    ),
    cle_steps: int = typer.Option(
        None, "--cle-steps", help="Equalization steps with --cle (CLESteps).", show_default="1"
    ),
    replace_relu6: bool = typer.Option(
        None,
        "--replace-relu6",
        help="Replace Clip(0, 6) by Relu first (ReplaceClip6Relu; changes the model).",
        show_default="off",
    ),
    bias_correction: bool = typer.Option(
        None,
        "--bias-correction/--no-bias-correction",
        help="Empirical bias correction (BiasCorrection). --accuracy-budget tries it unless --no-bias-correction "
        "is given.",
        show_default="off; on with a power-of-two --target",
    ),
    smooth_quant: bool = typer.Option(
        None,
        "--smooth-quant/--no-smooth-quant",
        help="SmoothQuant: move activation outliers into the weights first. --accuracy-budget tries it "
        "unless --no-smooth-quant is given.",
        show_default="off",
    ),
    smooth_quant_alpha: float = typer.Option(
        None, "--smooth-quant-alpha", help="SmoothQuant migration strength in [0, 1] (default 0.5)."
    ),
    extra: list[str] = typer.Option(None, "--extra", help="extra_options KEY=VALUE (repeatable)."),
    accuracy_budget: float = typer.Option(
        None,
        "--accuracy-budget",
        help="Search the fewest layers to raise (int16 where the target has it, else float) so that --metric "
        "stays within this many points of float.",
    ),
    metric: str = typer.Option(
        "cosine",
        "--metric",
        help="cosine, top1, char-accuracy, sqnr or FILE.py:Class (with --accuracy-budget).",
    ),
    eval_data: str = typer.Option(
        None, "--eval", help="Evaluation data for the budget search (default: every 4th calibration sample)."
    ),
    search_layers: int = typer.Option(48, "--search-layers", help="Most layers the budget search may raise."),
    measure_layers: int = typer.Option(
        0, "--measure-layers", help="Re-order the first N candidate layers by measured sensitivity (cached)."
    ),
    search_order: str = typer.Option(
        "report",
        "--search-order",
        help="Order of the layers the budget search raises: report (per-layer report's added noise) or "
        "measured (output noise of each group quantized alone, on the evaluation samples).",
    ),
    range_search: bool = typer.Option(
        False,
        "--range-search",
        help="With --accuracy-budget: search the clipping ranges of the most sensitive groups before raising "
        "layers (what an int8-only target can do before leaving layers float).",
    ),
    search_bias_correction: str = typer.Option(
        "try",
        "--search-bias-correction",
        help="With --accuracy-budget: try (score the model with BiasCorrection on and keep it when it scores "
        "at least as well, before raising layers) or off.",
    ),
    search_thresholds: str = typer.Option(
        "try",
        "--search-thresholds",
        help="With --accuracy-budget and min/max calibration: try (score MSE thresholds and keep them when "
        "they score at least as well, before raising layers) or off.",
    ),
    search_finetune: str = typer.Option(
        "try",
        "--search-finetune",
        help="With --accuracy-budget: try (when the choice misses the budget, fine-tune it with AdaQuant, 1000 "
        "steps per layer, and keep that when it scores at least as well) or off.",
    ),
    search_finetune_seconds: float = typer.Option(
        None,
        "--search-finetune-seconds",
        help="Bound the --search-finetune tuning by the clock (seconds). Layers then stop early by time, so "
        "the weights depend on the machine's speed; without it the same run gives the same weights.",
    ),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 when the accuracy budget is not met."),
    input_shape: list[str] = typer.Option(
        None,
        "--input-shape",
        help="NAME:D1,D2,... fixed input dims for the search's NPU share (as compiled).",
    ),
    search_samples: int = typer.Option(
        None, "--search-samples", help="Score candidates on the first N evaluation samples; confirm on all."
    ),
    min_npu_share: float = typer.Option(
        0.9,
        "--min-npu-share",
        help="With --target: a choice with less of its MACs on the NPU misses the budget.",
    ),
    fast_finetune: str = typer.Option(
        None, "--fast-finetune", help="Tune weights layer by layer after quantizing: adaround or adaquant."
    ),
    fast_finetune_iters: int = typer.Option(
        None, "--fast-finetune-iters", help="Fast finetune steps per layer (default 1000)."
    ),
    external_data: bool = typer.Option(
        False,
        "--external-data",
        help="Write the weights to OUT.onnx.data beside the model (automatic past 2 GB or when MODEL has external data).",
    ),
    requantize: bool = typer.Option(
        False,
        "--requantize",
        help="A pre-quantized MODEL: dequantize it and calibrate from scratch (no grids kept).",
    ),
    shards: int = typer.Option(
        1,
        "--shards",
        min=1,
        help="Cut the calibration batches into N shards, one task each (in this process, or in parallel on "
        "Ray with --ray); the statistics and scales equal one process's, bit for bit.",
    ),
    ray: bool = typer.Option(
        False,
        "--ray",
        help="Run the --shards tasks and the --accuracy-budget search's tasks (--measure-layers, and as many "
        "trials per round as Ray has CPUs) on a local Ray or the cluster at --ray-address; needs the ray extra.",
    ),
    ray_address: str = typer.Option(
        None, "--ray-address", help="host:port or ray://host:port of a Ray cluster (implies --ray)."
    ),
) -> None:
    """Quantize MODEL with static calibration and write OUTPUT."""
    search_outputs = (
        {
            "the search config": Path(f"{output}.search.toml"),
            "the sensitivity cache": Path(f"{output}.sensitivity.json"),
        }
        if accuracy_budget is not None
        else {}
    )
    refuse_overwrites(
        {"MODEL": model, "--calib": calib_file(calib), "--config": config, "--load-stats": load_stats,
         "--load-table": load_table, "--target": target_file(target), "--eval": calib_file(eval_data)},
        {"OUTPUT": output, "--save-stats": save_stats, "--export-table": export_table,
         "the per-layer report": Path(f"{output}.report.json"), **search_outputs},
    )  # fmt: skip
    check_search_flags(
        accuracy_budget,
        eval_data=eval_data,
        metric=metric,
        strict=strict,
        input_shape=input_shape,
        search_samples=search_samples,
        search_order=search_order,
        range_search=range_search,
        search_bias_correction=search_bias_correction,
        search_thresholds=search_thresholds,
        search_finetune=search_finetune,
        search_finetune_seconds=search_finetune_seconds,
    )
    cfg_file = load_config_file(config) if config else {}
    proto = load_proto(model, load_external_data=False)  # quantize_static reads (maps) the weights
    tdef = target_defaults(target or cfg_file.get("target"))
    fmt = fmt or cfg_file.get("format", tdef.get("quant_format", "qdq"))
    extra_options = {
        "ReportHoldOut": True,  # the report on samples calibration did not see, when there are enough
        **tdef.get("extra_options", {}),
        **generic_defaults(tdef, fmt),
        **cfg_file.get("extra_options", {}),
        **parse_extra(extra),
    }
    if placement is not None:
        extra_options["QuantPlacement"] = placement
    for key, value in (
        ("Target", target or cfg_file.get("target")),
        ("SaveStats", save_stats),
        ("LoadStats", load_stats),
        ("ExportCalibrationTable", export_table),
        ("LoadCalibrationTable", load_table),
        ("IncludeCLE", cle),
        ("CLESteps", cle_steps),
        ("ReplaceClip6Relu", replace_relu6),
        ("BiasCorrection", bias_correction),
        ("CalibShards", shards if shards > 1 else None),
    ):
        if value is not None:
            extra_options[key] = value if isinstance(value, bool | int) else str(value)
    if requantize:
        extra_options["PrequantRequantize"] = True
    fold_fast_finetune(extra_options, fast_finetune, fast_finetune_iters)
    if smooth_quant is not None:  # given either way, it wins over the target's recipe
        extra_options["SmoothQuant"] = smooth_quant
    if smooth_quant_alpha is not None:
        if not extra_options.get("SmoothQuant"):
            raise OptionError(
                "--smooth-quant-alpha has no effect without --smooth-quant; add it or drop the alpha."
            )
        extra_options["SmoothQuantAlpha"] = float(smooth_quant_alpha)
    elif smooth_quant is False:
        extra_options.pop("SmoothQuantAlpha", None)  # the recipe's alpha goes with its SmoothQuant
    excluded = parse_name_list(exclude) + list(cfg_file.get("nodes_to_exclude", []))
    cfg = build_config(
        quant_format=fmt,
        op_types_to_quantize=parse_name_list(op_types) or cfg_file.get("op_types_to_quantize"),
        per_channel=per_channel
        if per_channel is not None
        else cfg_file.get("per_channel", tdef.get("per_channel", not tdef)),
        reduce_range=cfg_file.get("reduce_range", False),
        use_external_data_format=external_data
        or bool(external_data_locations(proto)),  # weights stay external
        activation_type=activation_type
        or cfg_file.get("activation_type", tdef.get("activation_type", "int8")),
        weight_type=weight_type or cfg_file.get("weight_type", "int8"),
        nodes_to_exclude=excluded,
        calibrate_method=method or cfg_file.get("method", tdef.get("calibrate_method", "minmax")),
        extra_options={
            **(
                {"WeightCalibrateMethod": weight_method or cfg_file["weight_method"]}
                if (weight_method or "weight_method" in cfg_file)
                else {}
            ),
            **extra_options,
        },
    )
    if cfg_file.get("op_types") or cfg_file.get("nodes"):
        import dataclasses

        cfg = dataclasses.replace(
            cfg, op_type_overrides=cfg_file.get("op_types", {}), node_overrides=cfg_file.get("nodes", {})
        )
    from zonnx.quantization.prequant import quantized_form

    if calib is None and load_stats is None and load_table is None and quantized_form(proto) is None:
        raise OptionError(
            "give calibration data with --calib (images folder, .npz/.npy, or FILE.py:FUNC), "
            "or saved statistics with --load-stats."
        )
    preprocess = {
        "size": tuple(int(v) for v in parse_floats(size, "--size")) if size else None,
        "mean": parse_floats(mean, "--mean"),
        "scale": parse_floats(scale, "--scale"),
        "pixel_format": pixel_format,
        "layout": layout,
    }
    reader = reader_from_source(calib, proto, preprocess=preprocess, limit=limit) if calib else None
    executor = quantize_executor(shards, ray, ray_address, budget=accuracy_budget,
                                 skips_calibration=load_stats is not None or load_table is not None)  # fmt: skip
    if executor is not None:
        ctx.call_on_close(executor.close)
    if accuracy_budget is not None:
        run_budget_search(model, output, reader, load_proto(model), preprocess, cfg, accuracy_budget, metric, eval_data,
                          search_layers, measure_layers, strict, summary_table,
                          input_shapes=parse_input_shapes(input_shape) or None, search_samples=search_samples,
                          min_npu_share=min_npu_share, executor=executor, order_by=search_order,
                          range_search=range_search,
                          bias_correction="off" if bias_correction is False else search_bias_correction,
                          thresholds_trial=search_thresholds, finetune_trial=search_finetune,
                          smooth_quant_trial="off" if smooth_quant is False else "try",
                          finetune_seconds=search_finetune_seconds)  # fmt: skip
        return
    total = len(reader) if reader is not None and hasattr(reader, "__len__") else None
    start = time.perf_counter()
    with Progress(
        TextColumn("calibrating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    ) as bar:
        task = bar.add_task("calibrating", total=total)
        result = quantize_static(model, output, reader, config=cfg, progress=lambda _b: bar.advance(task),
                                 calibration_executor=executor)  # fmt: skip
    console.print(summary_table(result, time.perf_counter() - start, output))
    if result.prequant is not None:
        from zonnx.quantization.prequant.render import render_retarget

        render_retarget(console, result.prequant)
    if result.report is not None:
        result.report.render(console, top=10)
        err_console.print(
            f"per-layer report: {result.config.extra.report_path or str(output) + '.report.json'}",
            markup=False,
        )
