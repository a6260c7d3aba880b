"""Observe: calibration statistics -> ranges -> parameters for every planned tensor.

- Activations: one streaming calibration pass collects exactly the statistics the chosen method
  needs; each tensor's range comes from its own statistics; a shared-scale group takes the union of
  its members' ranges (for power-of-two: the smallest position, i.e. the widest range).
- Softmax/Sigmoid outputs use the fixed range [0, 1].
- Weights: from the tensor itself, per tensor or per channel; ``WeightCalibrateMethod`` may choose a
  histogram method too (per tensor). Power-of-two weights use vai_q_onnx's "diffs" search.
- Biases: int32 at s_input * s_weight (float-scale formats); power-of-two formats treat the bias
  like a weight of the weight's bit width, as vai_q_onnx does.
"""

from __future__ import annotations

__all__ = ["calibrate_plan", "weight_and_bias_params", "activation_method"]

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from zonnx.errors import OptionError
from zonnx.quantization.calibration import pof2
from zonnx.quantization.calibration.collector import collect
from zonnx.quantization.calibration.methods import compute_range, distribution_std, method_name
from zonnx.quantization.calibration.stats import DEFAULT_BINS, GridHistogram, TensorStats
from zonnx.quantization.config import QuantConfig
from zonnx.quantization.plan import QuantPlan, Role, TensorPlan
from zonnx.quantization.schemes import (
    QuantParams,
    bias_params,
    fit_weight_to_bias,
    float8_params,
    params_from_range,
    pof2_params,
    weight_params,
)

logger = logging.getLogger(__name__)

#: ORT's histogram size for Entropy (its ``num_bins`` default; CalibNumBins sets it).
ORT_ENTROPY_BINS = 128


def activation_method(cfg: QuantConfig) -> str:
    """The calibrator's method name for the user's calibrate_method and extra options."""
    name = method_name(cfg.calibrate_method)
    if name == "minmax" and cfg.extra.calib_moving_average:
        return "movingaverage"
    return name


def _method_options(cfg: QuantConfig, name: str) -> dict[str, Any]:
    extra = cfg.extra
    opts: dict[str, Any] = {}
    if name == "percentile":
        opts["percentile"] = extra.calib_percentile
    elif name == "entropy":
        opts["num_quantized_bins"] = extra.calib_num_quantized_bins
        opts["num_bins"] = extra.calib_num_bins or ORT_ENTROPY_BINS
    elif name == "nstd":
        opts["n"] = extra.calib_nstd
    if extra.activation_symmetric or extra.calib_tensor_range_symmetric or cfg.power_of_two:
        opts["symmetric"] = True
    return opts


def _range(stats: TensorStats, tp: TensorPlan, cfg: QuantConfig, name: str) -> tuple[float, float]:
    qmin, qmax = tp.spec.qrange()
    lo, hi = compute_range(stats, name, qmin=qmin, qmax=qmax, **_method_options(cfg, name))
    return lo, hi


def _pos(stats: TensorStats, tp: TensorPlan, name: str) -> int:
    qmin, qmax = tp.spec.qrange()
    if name == "minmse":
        return pof2.minmse_pos(stats, qmin, qmax)
    if name in ("nonoverflow", "minmax"):
        return pof2.nonoverflow_pos(stats, qmin, qmax)
    lo, hi = compute_range(stats, name, qmin=qmin, qmax=qmax, symmetric=True)
    return pof2.pos_overflow(lo, hi, qmin, qmax)


def _span_pos(member_stats: list, span: float) -> int:
    """The finest power-of-two position whose grid still holds [max - span, max] of a Softmax input."""
    tp, stats = member_stats[0]
    hi = max(s.max for _, s in member_stats)
    lo = max(min(s.min for _, s in member_stats), hi - span)
    qmin, qmax = tp.spec.qrange()
    return pof2.pos_overflow(lo, hi, qmin, qmax)


def float_activations(model: onnx.ModelProto) -> list[str]:
    """Every float tensor computed by a node or fed as a graph input (types from shape inference)."""
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    typed = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    names = [v.name for v in graph.input if v.name not in inits]
    names += [o for node in graph.node if node.op_type != "Constant" for o in node.output if o]
    return [n for n in dict.fromkeys(names) if typed.get(n) == onnx.TensorProto.FLOAT]


def _fixed_stats(tp: TensorPlan) -> TensorStats:
    stats = TensorStats(tp.name)
    assert tp.fixed_range is not None
    stats.update_extrema(tp.fixed_range[0], tp.fixed_range[1], 1)
    return stats


def calibrate_plan(
    float_model: onnx.ModelProto,
    plan: QuantPlan,
    cfg: QuantConfig,
    reader: Any,
    *,
    providers: Sequence[str] | None = None,
    stats_path: str | None = None,
    progress: Callable[[int], None] | None = None,
    cached_ranges: dict[str, tuple[float, float]] | None = None,
    executor: Any = None,
) -> dict[str, TensorStats]:
    """Fill ``params`` of every activation in the plan; returns the statistics used.

    ``cached_ranges`` (ORT's calibration cache) gives every activation its range without calibrating.
    With ``CalibShards`` > 1 the batches run as that many shards through ``executor`` (in process when
    None; ``zonnx.deploy.RayExecutor`` for Ray): the statistics are the same, bit for bit.
    """
    name = activation_method(cfg)
    wanted = [n for n in plan.activations() if plan.tensors[n].fixed_range is None]
    if cached_ranges is not None:
        missing = [n for n in wanted if n not in cached_ranges]
        if missing:
            raise OptionError(
                f"calibration_cache_path: no range for {len(missing)} tensor(s) of this plan, e.g. "
                f"{missing[0]!r}; delete the cache to calibrate again."
            )
        for n in wanted:
            plan.tensors[n].fixed_range = cached_ranges[n]
        wanted = []
    if cfg.extra.load_calibration_table:
        _ranges_from_table(plan, cfg.extra.load_calibration_table, wanted)
        wanted = []
    if stats_path is not None:
        from zonnx.quantization.calibration.stats_file import load_stats

        stats = load_stats(stats_path, float_model)
        if cfg.extra.calib_shards > 1:
            logger.warning("CalibShards: saved statistics are used (%s); nothing is calibrated", stats_path)
        missing = [n for n in wanted if n not in stats]
        if missing:
            raise OptionError(
                f"{stats_path}: no statistics for {len(missing)} tensor(s) of this plan, e.g. "
                f"{missing[0]!r}; calibrate again (the plan changed since it was saved)."
            )
    elif wanted:
        if cfg.extra.save_stats:  # saved statistics serve later plans too (other nodes excluded, 16-bit, ...)
            wanted = wanted + [n for n in float_activations(float_model) if n not in set(wanted)]
        if reader is None:
            raise OptionError(
                "calibration_data_reader is None: give calibration data (a CalibrationDataReader, "
                "zonnx quantize --calib DIR_OR_NPZ) or saved statistics (extra_options LoadStats)."
            )
        run = functools.partial(collect, batch=cfg.extra.calib_batch)
        if cfg.extra.calib_shards > 1:
            from zonnx.quantization.calibration.shards import collect_sharded

            run = functools.partial(collect_sharded, shards=cfg.extra.calib_shards, executor=executor)
        elif executor is not None:
            logger.warning("calibration executor given with CalibShards = 1: calibration runs in process")
        stats = run(
            float_model,
            wanted,
            reader,
            methods_needed=[name],
            providers=providers or ("CPUExecutionProvider",),
            progress=progress,
            bins=cfg.extra.calib_num_bins or DEFAULT_BINS,
            hist_sample=cfg.extra.calib_histogram_sample,
            averaging_constant=cfg.extra.calib_moving_average_constant,
            momentum=cfg.extra.calib_momentum,
        )
    else:
        stats = {}
    if cfg.extra.export_calibration_table and stats:
        from zonnx.quantization.calibration.stats_file import write_calibration_table

        write_calibration_table(cfg.extra.export_calibration_table, stats, method=name)
    if cfg.extra.save_stats:
        from zonnx.quantization.calibration.stats_file import save_stats

        save_stats(cfg.extra.save_stats, stats, float_model, methods=[name])
    for group in plan.groups():
        members = [plan.tensors[n] for n in group]
        fixed = next((tp.fixed_params for tp in members if tp.fixed_params is not None), None)
        if fixed is not None:  # the user's scale and zero point hold for the whole shared group
            for tp in members:
                tp.params = dataclasses.replace(fixed)
                found = stats.get(tp.name)
                if tp.convert_spec is not None and found is not None and found.batches > 0:
                    tp.rmin, tp.rmax = _range(found, tp, cfg, name)
            _convert_params(members)
            continue
        pinned = [tp for tp in members if tp.name in plan.overridden and tp.fixed_range is not None]
        if pinned:
            members_range = pinned[0].fixed_range  # an override's range wins over the group's union
            params = params_from_range(members_range[0], members_range[1], pinned[0].spec)
            for tp in members:
                tp.rmin, tp.rmax = members_range
                tp.params = dataclasses.replace(params) if tp.spec == pinned[0].spec else _respec(params, tp)
            continue
        member_stats = [(tp, _fixed_stats(tp) if tp.fixed_range else stats.get(tp.name)) for tp in members]
        member_stats = [(tp, s) for tp, s in member_stats if s is not None and s.batches > 0]
        if not member_stats:
            logger.warning("tensor %r: no calibration values seen; left float", group[0])
            continue
        spec = members[0].spec
        span = min((tp.softmax_span for tp in members if tp.softmax_span), default=None)
        if spec.power_of_two:
            pos = min(_pos(s, tp, "minmax" if tp.fixed_range else name) for tp, s in member_stats)
            if span is not None:
                pos = max(pos, _span_pos(member_stats, span))
            params = pof2_params(pos, spec)
        elif spec.dtype.is_float and not any(tp.fixed_range for tp in members):
            # float8 (ORT's Distribution): the scale matches the widest member's spread to float8's;
            # ORT's quantize_static always calibrates the "same" scenario (config.check_float8)
            spread = max(distribution_std(s, "same") for _, s in member_stats)
            params = float8_params(spread, spec)
        else:
            ranges = [tp.fixed_range or _range(s, tp, cfg, name) for tp, s in member_stats]
            lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
            if span is not None and hi - lo > span:
                lo = hi - span  # a Softmax input: what lies further down gets ~0 weight anyway
            params = params_from_range(lo, hi, spec)
            for tp in members:
                tp.rmin, tp.rmax = lo, hi
        for tp in members:
            tp.params = dataclasses.replace(params) if tp.spec == spec else _respec(params, tp)
        _convert_params(members)
    return stats


def _convert_params(members: list[TensorPlan]) -> None:
    """Parameters of the 'convert' override: its own scale/zero point, or the tensor's range in its type."""
    for tp in members:
        if tp.convert_spec is None:
            continue
        if tp.convert_fixed is not None:
            tp.convert_params = tp.convert_fixed
        elif tp.rmin is not None and tp.rmax is not None:
            tp.convert_params = params_from_range(tp.rmin, tp.rmax, tp.convert_spec)
        else:
            raise OptionError(
                f"TensorQuantOverrides[{tp.name!r}]['convert']: the tensor has no calibrated range to convert; "
                "give the convert scale and zero_point."
            )


def _ranges_from_table(plan: QuantPlan, path: str, wanted: list[str]) -> None:
    """TPU-MLIR table rows become fixed ranges: (-threshold, threshold) for symmetric tensors, else (min, max)."""
    from zonnx.quantization.calibration.stats_file import read_calibration_table

    table = read_calibration_table(path)
    missing = [n for n in wanted if n not in table]
    if missing:
        raise OptionError(
            f"{path}: no row for {len(missing)} tensor(s) of this model, e.g. {missing[0]!r}; "
            "export the table from the same model."
        )
    for n in wanted:
        row, tp = table[n], plan.tensors[n]
        tp.fixed_range = (-row.threshold, row.threshold) if tp.spec.symmetric else (row.min, row.max)


def _respec(params: QuantParams, tp: TensorPlan) -> QuantParams:
    """A group member with another spec (per-node override) gets its own parameters on the same range."""
    if tp.rmin is None or tp.rmax is None:
        return params
    return params_from_range(tp.rmin, tp.rmax, tp.spec)


def _weight_stats(name: str, w: np.ndarray, bins: int) -> TensorStats:
    stats = TensorStats(name)
    stats.update_extrema(float(w.min()), float(w.max()), w.size)
    stats.update_moments(w.size, float(w.sum(dtype=np.float64)), float(np.square(w, dtype=np.float64).sum()))
    stats.hist = GridHistogram(bins)
    stats.hist.add(w.ravel())
    return stats


def _weight_params(tp: TensorPlan, w: np.ndarray, cfg: QuantConfig) -> QuantParams:
    spec = tp.spec
    qmin, qmax = spec.qrange()
    if tp.fixed_params is not None:
        return tp.fixed_params
    if tp.fixed_range is not None:  # TensorQuantOverrides rmin/rmax (per channel: arrays)
        return params_from_range(tp.fixed_range[0], tp.fixed_range[1], spec, spec.axis)
    if cfg.extra.block_size and not spec.power_of_two:
        from zonnx.quantization.blocked import blocked_params

        return blocked_params(tp.name, w, spec, cfg.extra.block_size)
    if spec.power_of_two:
        return pof2_params(pof2.weight_diffs_pos(w, qmin, qmax), spec)
    if spec.dtype.is_float:  # ORT: a float8 weight's scale matches its spread to float8's
        return float8_params(float(np.std(w, dtype=np.float64)), spec)
    method = cfg.weight_method
    if method == "minmax":
        return weight_params(w, spec)
    if spec.axis is not None:
        raise OptionError(
            f"WeightCalibrateMethod {method!r} works per tensor; use per_channel=False or 'minmax'."
        )
    lo, hi = compute_range(
        _weight_stats(tp.name, w, cfg.extra.calib_num_bins or DEFAULT_BINS),
        method,
        qmin=qmin,
        qmax=qmax,
        symmetric=spec.symmetric,
    )
    return params_from_range(lo, hi, spec)


def weight_and_bias_params(model: ir.Model, plan: QuantPlan, cfg: QuantConfig) -> None:
    """Fill ``params`` of weights from their values, then of biases from their input and weight."""
    inits = model.graph.initializers
    for tp in plan.tensors.values():
        if tp.prequantized:
            tp.params = tp.fixed_params
        elif tp.role is Role.WEIGHT and tp.name in inits:
            w = np.asarray(inits[tp.name].const_value.numpy(), dtype=np.float32)
            tp.params = _weight_params(tp, w, cfg)
    for tp in plan.tensors.values():
        if tp.role is not Role.BIAS or tp.bias_of is None or tp.name not in inits:
            continue
        x, w = (plan.tensors.get(n) for n in tp.bias_of)
        if x is None or w is None or x.params is None or w.params is None:
            continue  # the input stayed float: the bias stays float too
        if x.params.dtype.is_float or w.params.dtype.is_float:
            continue  # float8 kernels take a float bias (ORT keeps it float too)
        if cfg.power_of_two:
            b = np.asarray(inits[tp.name].const_value.numpy(), dtype=np.float32)
            qmin, qmax = tp.spec.qrange()
            tp.params = pof2_params(
                pof2.weight_diffs_pos(b, qmin, qmax), dataclasses.replace(tp.spec, axis=None)
            )
        else:
            x_scale = x.params.scale
            if x.convert_params is not None and (x.convert_recv is None or tp.bias_node in x.convert_recv):
                x_scale = x.convert_params.scale  # the node reads the converted quantization
            if w.params.block_size:
                logger.warning(
                    "bias %r stays float: its weight %r is quantized block-wise (BlockSize), which has no "
                    "int32 bias scale",
                    tp.name,
                    w.name,
                )
                continue
            if not cfg.extra.disable_weight_adjust_for_int32_bias and not w.prequantized:
                b = np.asarray(inits[tp.name].const_value.numpy(), dtype=np.float32)
                w.params, raised = fit_weight_to_bias(b, x_scale, w.params)
                if raised:
                    logger.info(
                        "weight %r: raised the scale of %d channel(s) so the int32 codes of bias %r fit",
                        w.name,
                        raised,
                        tp.name,
                    )
            tp.params = bias_params(x_scale, w.params)
