"""The build's stages: what each reads, which config sections it depends on, what it writes, how it runs.

    source    [model]               -> model.onnx        (convert + numeric check; zoo names and ONNX too)
    optimize  [optimize]            -> model_opt.onnx    (pre-quantization passes, verified, inspected)
    quantize  [quantize], target's  -> model_int8.onnx, calib_stats.npz, model_int8.onnx.report.json
              quant rules              (a model already quantized, e.g. TFLite int8, is kept as it is)
    compile   [compile]             -> model_npu.onnx, partition.json, profile.json
    evaluate  [evaluate]            -> evaluate.json     (float / int8 / NPU on the evaluation set)

The quantize stage depends on the target's quantization rules only (``[quant]`` of its file), not its
name or hardware numbers: editing the target's hardware, the partition's ``min_nodes`` or picking a
target with the same rules recompiles without recalibrating. The report stage lives in ``report_html``.
"""

from __future__ import annotations

__all__ = ["Stage", "STAGES", "StageContext"]

import dataclasses
import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zonnx import zoo
from zonnx.deploy.config import BuildConfig
from zonnx.deploy.data import DATASETS, calibration_samples, eval_samples
from zonnx.errors import OptionError
from zonnx.ir.io import load_proto, save_model, write_bytes_atomic

logger = logging.getLogger(__name__)

#: Below this share of MACs on the NPU the compile stage warns (with the CPU nodes' reasons).
LOW_NPU_SHARE = 0.5


@dataclasses.dataclass
class StageContext:
    """What stages share: the config, the output folder and a progress callback (samples done)."""

    config: BuildConfig
    out: Path
    advance: Callable[[int], None] = lambda _n: None

    def file(self, name: str) -> Path:
        return self.out / name

    def source(self) -> str:
        return self.config.path("model", "source", tuple(zoo.names()))

    def dataset(self) -> str:
        value = self.config.path("evaluate", "dataset", DATASETS)
        if value:
            return value
        src = self.config.get("model", "source")
        return "digits" if src == "digits_cnn" else "zoo" if src in zoo.names() else ""

    def target(self) -> str:
        value = str(self.config.get("compile", "target"))
        return self.config.path("compile", "target") if value.endswith(".toml") else value


@dataclasses.dataclass(frozen=True)
class Stage:
    """A stage: config sections in its key, input files (or names), artifacts, and its run function."""

    name: str
    sections: tuple[str, ...]
    inputs: Callable[[StageContext], list[str | Path]]
    artifacts: tuple[str, ...]
    run: Callable[[StageContext], dict[str, Any]]
    extra_key: Callable[[StageContext], str] = lambda _ctx: ""


def _input_shapes(value: str | dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """[model] input_shape: ``"NAME:d0,d1,...;NAME2:..."`` or a table ``{NAME = [d0, d1, ...]}``."""
    if isinstance(value, dict):
        bad = [k for k, v in value.items() if not isinstance(v, list) or not v
               or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in v)]  # fmt: skip
        if bad:
            raise OptionError(f"[model] input_shape {bad[0]} = {value[bad[0]]!r}: give a list of positive whole "
                              "numbers, e.g. {x = [1, 3, 48, 320]}.")  # fmt: skip
        return {k: tuple(v) for k, v in value.items()}
    text = value
    shapes = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, dims = part.rpartition(":")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            sep = ""
        if not sep or not name:
            raise OptionError(f"[model] input_shape {text!r}: write NAME:d0,d1,... (several joined by ;).")
    return shapes


def _source_inputs(ctx: StageContext) -> list[str | Path]:
    src = ctx.source()
    if src in zoo.names():
        return [zoo.get(src)]
    path = Path(src.partition(".py:")[0] + ".py") if ".py:" in src else Path(src)
    if not path.exists():
        raise OptionError(
            f"[model] source {src}: no such file or folder (nor a zoo model: {', '.join(zoo.names())})."
        )
    return [path]


def run_source(ctx: StageContext) -> dict[str, Any]:
    from zonnx.convert import ConvertOptions, convert

    src = ctx.source()
    spec = str(zoo.get(src)) if src in zoo.names() else src
    m = ctx.config.sections["model"]
    options = ConvertOptions(
        input_shapes=_input_shapes(
            m["input_shape"] if isinstance(m["input_shape"], dict) else str(m["input_shape"])
        ),
        input_names=tuple(m["input_names"]),
        output_names=tuple(m["output_names"]),
    )
    converted = convert(spec, options)
    save_model(converted.result.model, ctx.file("model.onnx"))
    return {"source": src, "kind": converted.kind, "ops": dict(converted.ops_after), "output": "model.onnx"}


def run_optimize(ctx: StageContext) -> dict[str, Any]:
    from zonnx.inspection import inspect_model, summary_to_dict
    from zonnx.optimization import OptimizeOptions, optimize_with_report
    from zonnx.passes.pipeline import VerifyOptions
    from zonnx.passes.report import pipeline_report_dict

    src = ctx.config.get("model", "source")
    feeds = zoo.sample_inputs(src, 1)[0] if src in zoo.names() else None
    if ctx.config.get("model", "input_shape") and ctx.dataset():  # the zoo's sample may not fit fixed dims
        names = {i.name for i in load_proto(ctx.file("model.onnx")).graph.input}
        sample = eval_samples(ctx.dataset(), ctx.source(), str(ctx.file("model.onnx")), 1)[0]
        feeds = {k: v for k, v in sample.items() if k in names}
    verify = VerifyOptions(feeds=feeds) if ctx.config.get("optimize", "verify") else None
    opts = OptimizeOptions(target_opset=int(ctx.config.get("optimize", "opset")), verify=verify)
    result = optimize_with_report(load_proto(ctx.file("model.onnx")), opts)
    save_model(result.model, ctx.file("model_opt.onnx"))
    return {
        "output": "model_opt.onnx",
        **pipeline_report_dict(result.report),
        "inspect": summary_to_dict(inspect_model(ctx.file("model_opt.onnx"))),
    }


def _quant_rules_digest(ctx: StageContext) -> str:
    from zonnx.backend.targets import load_target

    return hashlib.sha256(repr(load_target(ctx.target()).quant).encode()).hexdigest()


def _quant_config(ctx: StageContext) -> Any:
    """``target_quantize_kwargs`` of the target, then the [quantize] section's keys over it."""
    from zonnx.build_npu import target_quantize_kwargs
    from zonnx.quantization.api import build_config

    q = ctx.config.sections["quantize"]
    kwargs = target_quantize_kwargs(ctx.target())
    for key, arg in (("method", "calibrate_method"), ("format", "quant_format"), ("per_channel", "per_channel"),
                     ("activation_type", "activation_type"), ("weight_type", "weight_type")):  # fmt: skip
        if q[key] != "":
            kwargs[arg] = q[key]
    kwargs["extra_options"] = {**kwargs.get("extra_options", {}), **q["extra_options"]}
    cfg = build_config(**kwargs)
    if q["nodes"] or q["op_types"]:
        cfg = dataclasses.replace(cfg, node_overrides=dict(q["nodes"]), op_type_overrides=dict(q["op_types"]))
    return cfg


def _already_quantized(path: Path) -> str:
    """The quantization format of a model with quantized activations ('' for a float model)."""
    from zonnx.inspection import inspect_model

    found = inspect_model(path).quantization
    return found.format if found.format != "none" and found.quantize_nodes else ""


def _quantize_executor(ctx: StageContext, wanted: bool) -> Any:
    """The [evaluate] backend's executor for calibration shards and the search's tasks (None: not needed)."""
    if not wanted:
        return None
    from zonnx.deploy.evaluate import make_executor

    return make_executor(ctx.config.get("evaluate", "backend"), ctx.config.get("evaluate", "ray_address"))


def _write_histograms(
    ctx: StageContext, result: Any, samples: list[dict[str, Any]], stats: Path | None
) -> None:
    """``layer_histograms.json``: the worst layers' activation histograms and clipping ranges."""
    from zonnx.deploy.histograms import worst_histograms
    from zonnx.deploy.report_html import WORST_LAYERS, read_json

    layers = (read_json(ctx.file("model_int8.onnx.report.json")) or {}).get("layers", [])
    found = []
    if layers and result.prepared is not None:
        found = worst_histograms(layers, result.plan, result.prepared, samples, stats, WORST_LAYERS)
    write_bytes_atomic(ctx.file("layer_histograms.json"), json.dumps(found).encode())


def run_quantize(ctx: StageContext) -> dict[str, Any]:
    from zonnx.quantization.api import quantize_static
    from zonnx.quantization.calibration.readers import ListReader

    q = ctx.config.sections["quantize"]
    opt, out = ctx.file("model_opt.onnx"), ctx.file("model_int8.onnx")
    kept = _already_quantized(opt)
    if kept:
        logger.warning(
            "%s: the model is already quantized (%s); kept as it is, not quantized again", opt.name, kept
        )
        shutil.copyfile(opt, out)
        write_bytes_atomic(ctx.file("layer_histograms.json"), b"[]")
        return {"output": "model_int8.onnx", "format": kept, "method": "(the source model's own)",
                "kept": f"already quantized ({kept}): not quantized again", "layer_report": None}  # fmt: skip
    calib = ctx.config.path("quantize", "calib")
    samples = calibration_samples(calib, ctx.dataset(), ctx.source(), str(opt), int(q["samples"]))
    cfg = _quant_config(ctx)
    record: dict[str, Any] = {"calibration_samples": len(samples)}
    shards, measure = q["shards"], q["measure_layers"]
    for key, value, least in (("shards", shards, 1), ("measure_layers", measure, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise OptionError(f"[quantize] {key} = {value!r}: give a whole number >= {least}.")
    executor = _quantize_executor(
        ctx, shards > 1 or q["accuracy_budget"] != ""
    )  # search: sensitivity, trials
    if shards > 1:
        cfg = dataclasses.replace(cfg, extra=dataclasses.replace(cfg.extra, calib_shards=shards))
        record["calibration_shards"] = {"shards": shards, "backend": ctx.config.get("evaluate", "backend")}
    try:
        if q["accuracy_budget"] != "":
            from zonnx.quantization.search.run import quantize_with_budget

            metric = q["metric"] or ("cosine" if ctx.config.get("evaluate", "metric") == "accuracy" else
                                     ctx.config.get("evaluate", "metric"))  # fmt: skip
            said_no = {k for k in ("SmoothQuant", "BiasCorrection") if q["extra_options"].get(k) is False}
            result, search, config_path = quantize_with_budget(
                opt, out, ListReader(samples), cfg, budget=float(q["accuracy_budget"]), metric=metric,
                measure_layers=measure, executor=executor,
                smooth_quant_trial="off" if "SmoothQuant" in said_no else "try",  # the user's no holds
                bias_correction="off" if "BiasCorrection" in said_no else "try",
            )  # fmt: skip
            record["search"] = {"metric": metric, "met": search.met, "table": search.table(),
                                "config": config_path.name}  # fmt: skip
        else:
            stats = dataclasses.replace(cfg.extra, save_stats=str(ctx.file("calib_stats.npz")))
            result = quantize_static(opt, out, ListReader(samples), config=dataclasses.replace(cfg, extra=stats),
                                     calibration_executor=executor)  # fmt: skip
    finally:
        close = getattr(executor, "close", None)
        if close is not None:
            close()
    worst = result.report.worst if result.report is not None else None
    _write_histograms(ctx, result, samples, None if "search" in record else ctx.file("calib_stats.npz"))
    return {
        **record,
        "output": "model_int8.onnx",
        "format": result.config.quant_format.name,
        "method": result.config.calibrate_method.name,
        "quantized": dict(result.counts),
        "target_rules": dict(result.refinement.counts) if result.refinement is not None else {},
        "worst_layer": None if worst is None else {"tensor": worst.tensor, "sqnr_db": worst.sqnr_db},
        "layer_report": "model_int8.onnx.report.json" if result.report is not None else None,
        "warnings": list(result.warnings),
    }


def run_compile(ctx: StageContext) -> dict[str, Any]:
    from zonnx.backend.compile_api import compile_model
    from zonnx.backend.partition.report import to_dict
    from zonnx.backend.profile import profile_model

    compiled = compile_model(ctx.file("model_int8.onnx"), ctx.target(),
                             min_nodes=int(ctx.config.get("compile", "min_nodes")))  # fmt: skip
    compiled.save(ctx.file("model_npu.onnx"))
    partition = to_dict(compiled.partition)
    write_bytes_atomic(ctx.file("partition.json"), json.dumps(partition, indent=1).encode())
    profile = profile_model(ctx.file("model_npu.onnx"), ctx.target()).to_dict()
    write_bytes_atomic(ctx.file("profile.json"), json.dumps(profile, indent=1, default=str).encode())
    totals = profile["totals"]
    summary = partition["summary"]
    if summary["mac_share"] < LOW_NPU_SHARE:
        rules = ", ".join(f"{k} {v}" for k, v in summary["cpu_by_rule"].items())
        logger.warning("%s: only %.1f%% of the known MACs run on the NPU (CPU nodes by reason: %s); "
                       "see partition.json or report.html for each node's reason", compiled.target,
                       100 * summary["mac_share"], rules)  # fmt: skip
    return {
        "output": "model_npu.onnx",
        "target": compiled.target,
        "subgraphs": partition["summary"]["subgraphs"],
        "mac_share": partition["summary"]["mac_share"],
        "npu_ops": partition["summary"]["npu_ops"],
        "total_ops": partition["summary"]["total_ops"],
        "npu_ms": totals["ms"],
        "npu_cycles": totals["cycles"],
        "clock_mhz": profile["hardware"].get("clock_mhz"),
        "partition": "partition.json",
        "profile": "profile.json",
    }


def run_evaluate(ctx: StageContext) -> dict[str, Any]:
    from zonnx.deploy.evaluate import evaluate_models, make_executor

    e = ctx.config.sections["evaluate"]
    dataset = ctx.dataset()
    if not dataset:
        raise OptionError(
            "[evaluate] dataset is not set; name one (digits, zoo, text-lines, a file, FILE.py:NAME)."
        )
    samples = eval_samples(dataset, ctx.source(), str(ctx.file("model.onnx")), int(e["samples"]))
    models = {
        k: ctx.file(f)
        for k, f in (("float", "model.onnx"), ("int8", "model_int8.onnx"), ("npu", "model_npu.onnx"))
    }
    executor = make_executor(e["backend"], e["ray_address"])
    try:
        result = evaluate_models(models, samples, e["metric"], batch=int(e["batch"]), executor=executor,
                                 advance=ctx.advance)  # fmt: skip
    finally:
        close = getattr(executor, "close", None)
        if close is not None:
            close()
    result.update(dataset=dataset, backend=e["backend"])
    write_bytes_atomic(ctx.file("evaluate.json"), json.dumps(result, indent=1).encode())
    return result


def _data_input(value: str) -> list[str | Path]:
    """What a data source's content is: its file or folder, a plugin's .py file, nothing when unset."""
    if not value:
        return []
    return [value.partition(".py:")[0] + ".py"] if ".py:" in value else [value]


def _quantize_inputs(ctx: StageContext) -> list[str | Path]:
    return [ctx.file("model_opt.onnx"), *_data_input(ctx.config.path("quantize", "calib"))]


def _evaluate_inputs(ctx: StageContext) -> list[str | Path]:
    """The float and int8 models and the data; the compiled model enters by ``_evaluate_key``."""
    models = [ctx.file(f) for f in ("model.onnx", "model_int8.onnx")]
    return models + _data_input(ctx.dataset())


def _evaluate_key(ctx: StageContext) -> str:
    """The compiled model's content without provenance metadata (``compiled_digest``), dataset, source."""
    from zonnx.deploy.cache import compiled_digest

    return compiled_digest(ctx.file("model_npu.onnx")) + ctx.dataset() + ctx.source()


STAGES: tuple[Stage, ...] = (
    Stage("source", ("model",), _source_inputs, ("model.onnx",), run_source),
    Stage("optimize", ("optimize",), lambda c: [c.file("model.onnx")], ("model_opt.onnx",), run_optimize),
    Stage("quantize", ("quantize",), _quantize_inputs, ("model_int8.onnx", "layer_histograms.json"), run_quantize,
          extra_key=lambda c: _quant_rules_digest(c) + c.dataset() + c.source()),
    Stage("compile", ("compile",), lambda c: [c.file("model_int8.onnx"), *_target_file(c)],
          ("model_npu.onnx", "partition.json", "profile.json"), run_compile),
    Stage("evaluate", ("evaluate",), _evaluate_inputs,
          ("evaluate.json",), run_evaluate, extra_key=_evaluate_key),
)  # fmt: skip


def _target_file(ctx: StageContext) -> list[Path]:
    from zonnx.backend.targets import load_target

    path = load_target(ctx.target()).path
    return [path] if path is not None else []


def remove_artifacts(ctx: StageContext, stage: Stage) -> None:
    """Delete a stage's artifacts (before it runs again, so a failure never leaves a stale one)."""
    for name in stage.artifacts:
        path = ctx.file(name)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
