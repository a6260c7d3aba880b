"""``quantize_static``: a drop-in for onnxruntime's and vai_q_onnx's call, in annotate/observe/write steps."""

from __future__ import annotations

__all__ = ["quantize_static", "QuantizeResult", "build_config"]

import dataclasses
import gc
import logging
import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from zonnx.errors import ModelSaveError, OptionError
from zonnx.ir.io import load_proto, save_model, to_ir, to_proto
from zonnx.ir.large import (
    copy_model,
    external_tensors,
    load_whole_or_mapped,
    materialize,
    release_mapped,
    rooted,
)
from zonnx.quantization.annotate import annotate
from zonnx.quantization.annotate_config import annotate_config
from zonnx.quantization.config import (
    QuantConfig,
    check_float8,
    resolve_format,
    resolve_method,
    resolve_type,
    warn_u8s8,
)
from zonnx.quantization.enums import CalibrationMethod, QuantFormat, QuantType, VitisQuantFormat
from zonnx.quantization.finish import run_reports
from zonnx.quantization.formats.typed_params import store_qparams_typed
from zonnx.quantization.holdout import HoldOutReader
from zonnx.quantization.options import parse_extra_options
from zonnx.quantization.plan import QuantPlan, Role
from zonnx.quantization.prepare import check_node_names, prepare_for_quantization
from zonnx.quantization.sample_keeper import SampleKeeper

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class QuantizeResult:
    """What ``quantize_static`` did: the plan, counts of inserted quantizers, and the output path."""

    model: onnx.ModelProto
    plan: QuantPlan
    config: QuantConfig
    counts: Counter[str]
    opset: int
    output: Path | None = None
    report: Any = None
    refinement: Any = None  # Changes made by the target's refinement rules, when a target was given
    #: What the target's preparation passes changed (``prepare.TARGET_PREP_PASSES``), when a target was given.
    target_prep: Counter[str] | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)  # what the run said about lost accuracy
    prepared: onnx.ModelProto | None = None  # the float model after the prep passes (the report's reference)
    #: Accuracy-recovery records by algorithm (CLE, bias correction, fast finetune), when run.
    recovery: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: For a pre-quantized input: how its grids were re-expressed (``prequant.retarget.RetargetReport``).
    prequant: Any = None


def build_config(
    quant_format: Any = QuantFormat.QDQ,
    op_types_to_quantize: Sequence[str] | None = None,
    per_channel: bool = False,
    reduce_range: bool = False,
    activation_type: Any = QuantType.QInt8,
    weight_type: Any = QuantType.QInt8,
    nodes_to_quantize: Sequence[str] | None = None,
    nodes_to_exclude: Sequence[str] | None = None,
    use_external_data_format: bool = False,
    calibrate_method: Any = CalibrationMethod.MinMax,
    extra_options: dict[str, Any] | None = None,
    input_nodes: Sequence[str] | None = None,
    output_nodes: Sequence[str] | None = None,
) -> QuantConfig:
    """Validate the call's arguments (ORT's and vai_q_onnx's spellings) into a QuantConfig."""
    extra = parse_extra_options(extra_options)
    fmt = resolve_format(quant_format)
    method = resolve_method(calibrate_method)
    act = resolve_type(activation_type, "activation_type")
    wt = resolve_type(weight_type, "weight_type")
    if extra.quant_placement == "kernels" and (extra.target or fmt == QuantFormat.QOperator):
        raise OptionError(
            "extra_options['QuantPlacement'] = 'kernels' leaves tensors float, which "
            + (
                "an NPU target cannot run; targets use their own placement: drop QuantPlacement."
                if extra.target
                else "QOperator ops cannot take; use quant_format=QuantFormat.QDQ."
            )
        )
    if isinstance(fmt, VitisQuantFormat) and act not in ("int8", "int16", "int4"):
        raise OptionError(
            f"{fmt}: power-of-two formats are signed; use activation_type=QuantType.QInt8 (got {act})."
        )
    if extra.block_size and (fmt != QuantFormat.QDQ or extra.target):
        raise OptionError(
            "extra_options['BlockSize']: block-wise weights are written as QDQ (opset 21) only; use "
            "quant_format=QuantFormat.QDQ without a target, or remove BlockSize."
        )
    cfg = QuantConfig(
        quant_format=fmt,
        activation_type=act,
        weight_type=wt,
        calibrate_method=method,
        weight_method=extra.weight_calibrate_method.lower(),
        per_channel=bool(per_channel),
        reduce_range=bool(reduce_range),
        op_types_to_quantize=tuple(op_types_to_quantize or ()),
        nodes_to_quantize=tuple(nodes_to_quantize or ()),
        nodes_to_exclude=tuple(nodes_to_exclude or ()),
        input_nodes=tuple(input_nodes or ()),
        output_nodes=tuple(output_nodes or ()),
        use_external_data_format=bool(use_external_data_format),
        extra=extra,
    )
    check_float8(cfg)
    if cfg.power_of_two and cfg.weight_method != "minmax":
        raise OptionError(
            f"extra_options['WeightCalibrateMethod'] = {extra.weight_calibrate_method!r}: power-of-two weights "
            "always take vai_q's position search (NonOverflow, then the least-error of 5 positions); "
            "remove WeightCalibrateMethod."
        )
    return cfg


def _fast_finetune(
    float_model: onnx.ModelProto, model: ir.Model, plan: QuantPlan, reader: SampleKeeper, options: Any
) -> Any:
    """Run fast finetune on the written (and refined) model with the kept calibration feeds."""
    from zonnx.quantization.recovery.fast_finetune import fast_finetune

    ranges = {
        name: (tp.params.qmin, tp.params.qmax) for name, tp in plan.tensors.items() if tp.params is not None
    }
    return fast_finetune(float_model, model, reader.fill(), options, ranges=ranges)


def _check_output_path(model_input: Any, model_output: str | os.PathLike[str]) -> Path:
    out = Path(model_output)
    if (
        isinstance(model_input, str | os.PathLike)
        and out.exists()
        and out.resolve() == Path(model_input).resolve()
    ):
        raise ModelSaveError(f"{out}: is the input model; write the quantized model to another path.")
    if not (out.parent if str(out.parent) else Path(".")).is_dir():
        raise ModelSaveError(f"{out}: folder {out.parent} does not exist; create it first.")
    return out


def quantize_static(
    model_input: str | os.PathLike[str] | onnx.ModelProto,
    model_output: str | os.PathLike[str] | None,
    calibration_data_reader: Any = None,
    quant_format: Any = QuantFormat.QDQ,
    op_types_to_quantize: Sequence[str] | None = None,
    per_channel: bool = False,
    reduce_range: bool = False,
    activation_type: Any = QuantType.QInt8,
    weight_type: Any = QuantType.QInt8,
    nodes_to_quantize: Sequence[str] | None = None,
    nodes_to_exclude: Sequence[str] | None = None,
    use_external_data_format: bool = False,
    calibrate_method: Any = CalibrationMethod.MinMax,
    calibration_providers: Sequence[str] | None = None,
    extra_options: dict[str, Any] | None = None,
    calibration_cache_path: str | os.PathLike[str] | None = None,
    *,
    input_nodes: Sequence[str] | None = None,
    output_nodes: Sequence[str] | None = None,
    config: QuantConfig | None = None,
    progress: Callable[[int], None] | None = None,
    calibration_executor: Any = None,
) -> QuantizeResult:
    """Quantize a float ONNX model with static calibration; same arguments as ORT 1.31's call.

    Also accepts vai_q_onnx's ``input_nodes``/``output_nodes``, ``VitisQuantFormat`` and
    ``PowerOfTwoMethod``. ``calibration_cache_path`` (ORT) or ``extra_options["LoadStats"]`` reuse saved
    calibration statistics instead of running the reader. Writes ``model_output`` atomically (skip
    writing with ``model_output=None``) and returns what was done. ``calibration_executor`` runs the
    ``extra_options["CalibShards"]`` calibration shards (``zonnx.deploy.RayExecutor`` for Ray).
    """
    from zonnx.quantization.observe import calibrate_plan, weight_and_bias_params
    from zonnx.quantization.write import write_model

    cfg = config or build_config(
        quant_format,
        op_types_to_quantize,
        per_channel,
        reduce_range,
        activation_type,
        weight_type,
        nodes_to_quantize,
        nodes_to_exclude,
        use_external_data_format,
        calibrate_method,
        extra_options,
        input_nodes,
        output_nodes,
    )
    out = _check_output_path(model_input, model_output) if model_output is not None else None
    from zonnx.quantization.calibration.stats_file import check_output_file

    for option, path in (
        ("SaveStats", cfg.extra.save_stats),
        ("ExportCalibrationTable", cfg.extra.export_calibration_table),
    ):
        if path:  # a bad location fails now, not after calibration
            check_output_file(path, option)
    target = None
    if cfg.extra.target:
        from zonnx.backend.targets import load_target

        target = load_target(cfg.extra.target)  # an unknown target fails before calibration
        if cfg.extra.residual_stream_16 and "int16" not in target.quant.activation_dtypes:
            raise OptionError(
                f"extra_options['ResidualStream16']: target {target.name} takes no int16 activations "
                f"({', '.join(target.quant.activation_dtypes)}); remove the option for this target."
            )
        if (
            target.quant.activation_symmetric
            and not cfg.extra.activation_symmetric
            and target.quant.scale != "power_of_two"
        ):
            logger.warning(
                "Target %s takes symmetric activations but this call quantizes them asymmetric, so the "
                "NPU will leave those nodes on the CPU; pass extra_options ActivationSymmetric=True "
                "(and an int8 activation_type), or the keyword arguments of "
                "zonnx.build_npu.target_quantize_kwargs(%r).",
                target.name,
                target.name,
            )
    if target is None:
        warn_u8s8(cfg)
    from zonnx.quantization.recovery import steps as recovery

    recovery.check_recovery_formats(cfg)  # before the model is read; the data check follows its import

    # past proto_limit() a file's external weights stay mapped from it, read one tensor at a time
    # a file is read once: whole, or mapped past the limit
    loaded, is_mapped = (
        load_whole_or_mapped(model_input) if isinstance(model_input, str | os.PathLike) else (None, False)
    )
    mapped = loaded if is_mapped else None
    model = (
        loaded
        if loaded is not None
        else to_ir(
            copy_model(model_input)  # CopyFrom: works past 2 GiB
            if isinstance(model_input, onnx.ModelProto)
            else model_input
        )
    )
    from zonnx.quantization.prequant import flow as prequant

    has_data = calibration_data_reader is not None or bool(cfg.extra.load_stats or calibration_cache_path)
    imported = prequant.import_for_quantize(model, has_data)
    cfg = prequant.keep_imported_grids(cfg, imported, calibration_data_reader is not None)
    recovery.check_recovery_options(cfg, calibration_data_reader is not None)
    prepared_changes = prepare_for_quantization(model, cfg)
    target_prep = prepared_changes if cfg.extra.target else None
    mapped_weights = external_tensors(model) if mapped is not None else []
    release_mapped(mapped_weights)  # weights the passes read stop counting in memory (mapped again when read)
    records = recovery.recover_float(model, cfg)
    if cfg.extra.smooth_quant:
        from zonnx.quantization.recovery.smooth_quant import smooth_quant_reader

        calibration_data_reader, records["smooth_quant"] = smooth_quant_reader(
            model, calibration_data_reader, cfg.extra, providers=calibration_providers
        )
    check_node_names(model, cfg)
    if not cfg.extra.enable_subgraph:
        from zonnx.quantization.control_flow import warn_control_flow

        warn_control_flow(model)
    if cfg.extra.tensor_quant_overrides:  # checked against the model before calibration
        from zonnx.quantization.overrides import parse_tensor_overrides

        overrides = parse_tensor_overrides(cfg.extra.tensor_quant_overrides, model, cfg.activation_type)
    plan = annotate(model, annotate_config(model, cfg))
    if cfg.extra.tensor_quant_overrides:
        from zonnx.quantization.overrides import apply_tensor_overrides

        apply_tensor_overrides(plan, overrides)
    if not cfg.extra.quantize_bias:
        for name in [n for n, tp in plan.tensors.items() if tp.role is Role.BIAS]:
            del plan.tensors[name]
    if not plan.tensors:  # ORT writes the model unchanged; so does zonnx, and says why
        logger.warning(
            "nothing to quantize: no node was selected (%s); the model is written without quantization.",
            "; ".join(f"{k}: {v}" for k, v in list(plan.skipped.items())[:5]) or "the graph has no nodes",
        )
    if imported is not None and cfg.extra.prequant_requantize:
        imported.drop_grids()  # --requantize: the dequantized model is calibrated from scratch
    elif cfg.extra.prequant_requantize:
        logger.warning("PrequantRequantize: the model is not pre-quantized; the option changes nothing")
    dtypes = target.quant.activation_dtypes if target is not None else ()
    actions = prequant.pin_for_plan(plan, imported, model, has_data, dtypes) if imported is not None else {}
    float_model = to_proto(model)
    stats_path = cfg.extra.load_stats
    cache = cached = None
    if calibration_cache_path is not None and not stats_path:
        from zonnx.quantization.calibration.ort_cache import CalibrationCache

        cache = CalibrationCache.open(calibration_cache_path, cfg.calibrate_method, cfg.extra.smooth_quant)
        if cache.is_zonnx_stats():  # a zonnx SaveStats file: its statistics, as before
            stats_path, cache = str(calibration_cache_path), None
        else:
            cached = cache.load()
    fast_ft = cfg.extra.fast_finetune if cfg.extra.include_fast_ft else None
    keep = max(
        cfg.extra.report_samples,
        recovery.KEPT_SAMPLES if cfg.extra.bias_correction else 0,
        fast_ft.data_size if fast_ft is not None else 0,
    )
    holdout = HoldOutReader(
        calibration_data_reader, cfg.extra.report_samples if cfg.extra.report_holdout else 0
    )
    reader = SampleKeeper(holdout, keep) if calibration_data_reader is not None else None
    calibrate_plan(
        float_model,
        plan,
        cfg,
        reader,
        providers=calibration_providers,
        stats_path=stats_path,
        progress=progress,
        cached_ranges=cached,
        executor=calibration_executor,
    )
    if cache is not None and cached is None:
        cache.save({n: (tp.rmin, tp.rmax) for n, tp in plan.tensors.items() if tp.rmin is not None})
    weight_and_bias_params(model, plan, cfg)
    grid_rows = prequant.grid_changes(plan, imported, model, actions) if imported is not None else None
    if plan.removed:
        from zonnx.quantization.formats.remove_activations import remove_activations

        remove_activations(model, plan)
    counts, opset = write_model(model, plan, cfg)
    release_mapped(mapped_weights)
    refinement = None
    if target is not None:
        from zonnx.quantization.refine.avgpool import target_pool_kernels
        from zonnx.quantization.refine.pipeline import refine_model

        samples = reader.fill() if reader is not None else []
        kernels = target_pool_kernels(float_model, samples, target)
        refinement = refine_model(model, target, pool_kernels=kernels)
    if fast_ft is not None:
        records["fast_finetune"] = _fast_finetune(float_model, model, plan, reader, fast_ft)
    if cfg.extra.bias_correction:
        feeds = reader.fill()[: recovery.KEPT_SAMPLES]
        # a retarget is judged against its source, and skipped when it reproduces it; --requantize
        # quantizes the dequantized float model from scratch, which is then the reference as usual
        retarget = imported is not None and grid_rows is not None and not cfg.extra.prequant_requantize
        judge = None
        if retarget:
            judge = prequant.bias_correction_judge(
                model_input, model, grid_rows, feeds, calibration_providers
            )
        if not retarget or judge is not None:
            records.update(
                recovery.recover_quantized(
                    model, float_model, feeds, cfg, target, calibration_providers, judge
                )
            )
    proto = materialize(to_proto(model))  # what is still in the input's files is read: the output is whole
    streamed = mapped is not None
    if streamed:  # past the limit: the graph's copy of the quantized weights goes before the report
        del model, mapped, mapped_weights
        gc.collect()  # the graph's nodes and values refer to each other
    store_qparams_typed(proto)
    if isinstance(model_input, str | Path):  # for `zonnx run --compare golden` on the compiled model
        kept = [p for p in proto.metadata_props if p.key != "zonnx.float_source"]
        del proto.metadata_props[:]
        proto.metadata_props.extend(kept)
        del kept  # its entries would keep the whole protobuf alive
        proto.metadata_props.add(key="zonnx.float_source", value=str(Path(model_input).resolve()))
    result = QuantizeResult(
        proto, plan, cfg, counts, opset, out, refinement=refinement, recovery=records, prepared=float_model,
        target_prep=target_prep,
    )  # fmt: skip
    early = out is not None and streamed  # past the limit: written first, so the report maps its weights
    if early:  # the written file's graph replaces the proto, whose buffers would outlive its moved weights
        save_model(proto, out, external_data=True if cfg.use_external_data_format else None)
        proto = result.model = load_proto(out, load_external_data=False)
    with rooted(proto, out.parent if early else None):
        run_reports(
            result,
            imported,
            grid_rows,
            model_input,
            float_model,
            reader,
            holdout,
            target,
            calibration_providers,
        )
    if out is not None:
        if not early:
            save_model(proto, out, external_data=True if cfg.use_external_data_format else None)
        report_path = cfg.extra.report_path or f"{out}.report.json"
        if result.report is not None and report_path:
            result.report.write(report_path)
    return result
