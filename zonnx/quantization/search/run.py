"""``quantize_with_budget``: calibrate once, search the cheapest mixed precision within the budget, write it.

Evaluation samples come from ``eval_feeds`` or, when none are given, from the calibration data: every
4th sample is held out (and said), so the score is never measured on the samples that set the ranges.
Statistics are saved once in ``work_dir`` and every candidate re-quantizes from them. The output model
is quantized with the chosen overrides; the overrides are written next to it as ``OUTPUT.search.toml``.

Range search (``range_search=True``): before any layer is raised, the ranges of the ``range_groups``
most sensitive shared-scale groups (measured, ``measure.py``) are searched (``ranges.py``) on the first
``range_samples`` evaluation samples and validated on the next ``range_samples`` (kept only if they
help there too); then, as a configuration trial (``config_trial.py``), they stay only when the model
quantized with them scores at least as well on the metric. Kept, the clipped ranges become
``TensorQuantOverrides`` of the configuration every candidate and the final model are quantized with,
and are written to the config file. On an int8-only target this is what the search tries before leaving
layers float. The ranges are tried before bias correction; when both are kept, the pair is scored again
without the ranges (``BudgetResult.ranges_recheck``), and they go unless they still score at least as well
(on PP-OCRv4 rec for bm1684x, ranges that helped alone lowered the corrected model).

Bias correction (``bias_correction="try"``, the default): when the configuration does not already
correct biases, the search scores it with ``BiasCorrection`` on (empirical, from the calibration
samples; TPU-MLIR's ``--bc``, Vitis's bias correction) and keeps it when it scores at least as well on
the metric: it leaves every layer int8, so it is cheaper than any layer raised. It then holds for every
candidate and the final model, and the config file says ``BiasCorrection = true``. ``"off"`` skips it.

MSE thresholds (``thresholds_trial="try"``, the default): when activations are calibrated by min/max,
the search first scores the configuration with MSE thresholds (calibrated once more on the same samples)
and keeps them when they score at least as well (``threshold_step.py``); kept, the MSE model's report
and plan order the layers. ``"off"`` skips it.

SmoothQuant (``smooth_quant_trial="try"``, the default): when the configuration does not smooth already,
the search scores it with ``SmoothQuant`` on (calibrated once more on the smoothed model) and keeps it
when it scores at least as well (``smooth_step.py``); kept, the smoothed model's report and plan order
the layers, and the config file says ``SmoothQuant = true``. ``"off"`` skips it (``zonnx quantize
--no-smooth-quant`` turns it off too).

Fast finetune (``finetune_trial="try"``, the default): when the choice misses the budget and the
configuration does not fine-tune already, the choice is quantized once more with AdaQuant (300 steps
per layer; ``finetune_seconds`` bounds the tuning by the clock, at the cost of repeatability) and kept
when it scores more than one step of the metric higher on every evaluation sample (``finetune_step.py``:
why it comes last, and why a tie is not enough). ``"off"`` skips it.

Each trial hands its kept configuration's scored candidate on (to the next trial, then to the search as
its baseline), so no configuration is scored twice.
"""

from __future__ import annotations

__all__ = [
    "quantize_with_budget",
    "read_feeds",
    "ORDERS",
    "BIAS_CORRECTION",
    "THRESHOLDS_TRIAL",
    "SMOOTH_QUANT_TRIAL",
    "FINETUNE_TRIAL",
]

import dataclasses
import logging
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zonnx.errors import OptionError
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.config import QuantConfig
from zonnx.quantization.search.bias_step import try_bias_correction
from zonnx.quantization.search.budget import BudgetResult, search_budget, split_eval, write_config
from zonnx.quantization.search.config_trial import trial_note, try_config
from zonnx.quantization.search.executor import Executor
from zonnx.quantization.search.finetune_step import finetune_config, try_fast_finetune
from zonnx.quantization.search.measure import measure_groups, measured_order
from zonnx.quantization.search.ranges import RangeSearch, search_ranges
from zonnx.quantization.search.ranges_step import (
    log_ranges_recheck,
    log_ranges_trial,
    ranges_note,
    with_ranges,
    without_ranges,
)
from zonnx.quantization.search.scorer import Candidate, CandidateScorer, node_overrides
from zonnx.quantization.search.sensitivity import feeds_digest
from zonnx.quantization.search.smooth_step import try_smooth_quant
from zonnx.quantization.search.threshold_step import try_mse_thresholds

logger = logging.getLogger(__name__)

#: How the search orders the layers it may raise (``quantize_with_budget(order_by=)``).
ORDERS = ("report", "measured")
#: What the search does with bias correction (``quantize_with_budget(bias_correction=)``).
BIAS_CORRECTION = ("try", "off")
#: Whether the search tries MSE thresholds over min/max (``quantize_with_budget(thresholds_trial=)``).
THRESHOLDS_TRIAL = ("try", "off")
#: Whether the search tries SmoothQuant (``quantize_with_budget(smooth_quant_trial=)``).
SMOOTH_QUANT_TRIAL = ("try", "off")
#: Whether the search tries fast finetune on a choice that misses (``quantize_with_budget(finetune_trial=)``).
FINETUNE_TRIAL = ("try", "off")
#: Most samples read into memory from a calibration reader for the search.
MAX_SEARCH_SAMPLES = 4096


def read_feeds(reader: Any, what: str) -> list[dict[str, np.ndarray]]:
    """Every feed of a CalibrationDataReader or an iterable of input dicts, bounded."""
    items = iter(reader.get_next, None) if hasattr(reader, "get_next") else iter(reader)
    feeds = []
    for feed in items:
        if len(feeds) == MAX_SEARCH_SAMPLES:
            raise OptionError(
                f"{what}: more than {MAX_SEARCH_SAMPLES} samples; the search keeps them in memory."
            )
        feeds.append({k: np.asarray(v) for k, v in feed.items()})
    return feeds


def quantize_with_budget(
    model_input: str | Path,
    model_output: str | Path,
    calibration_data_reader: Any,
    config: QuantConfig,
    *,
    budget: float,
    metric: str = "cosine",
    eval_feeds: Sequence[dict[str, np.ndarray]] | None = None,
    max_layers: int = 48,
    measure_layers: int = 0,
    executor: Executor | None = None,
    progress: Callable[[str, Candidate | None], None] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    search_samples: int | None = None,
    min_npu_share: float = 0.0,
    trials_per_round: int | None = None,
    order_by: str = "report",
    measure_samples: int = 2,
    range_search: bool = False,
    range_groups: int = 16,
    range_samples: int = 8,
    bias_correction: str = "try",
    thresholds_trial: str = "try",
    smooth_quant_trial: str = "try",
    finetune_trial: str = "try",
    finetune_seconds: float | None = None,
) -> tuple[Any, BudgetResult, Path]:
    """Quantize ``model_input`` to ``model_output`` within ``budget`` points of ``metric``.

    ``input_shapes``: fixed input dims for the NPU share (as the model will be compiled);
    ``search_samples``: score candidates on the first N evaluation samples and confirm the choice on
    all of them; ``min_npu_share``: a choice with a smaller share of MACs on the target's NPU does not
    meet the budget; ``trials_per_round``: probes the search scores at once on ``executor`` (None: the
    executor's ``workers``, 1 in process, which is the plain binary search); ``order_by``: ``"report"``
    ranks layers by the per-layer report's added noise, ``"measured"`` by the output noise each shared-scale
    group causes alone (``measure.py``) on the first ``measure_samples`` evaluation samples;
    ``range_search``: search the ranges of the ``range_groups`` most sensitive groups first (module
    docstring; ``BudgetResult.ranges``); ``bias_correction``: ``"try"`` it before raising layers, or
    ``"off"`` (module docstring; ``BudgetResult.bias_correction``); ``thresholds_trial``: ``"try"`` MSE
    thresholds when activations are calibrated by min/max, or ``"off"`` (``threshold_step.py``;
    ``BudgetResult.thresholds``); ``smooth_quant_trial``: ``"try"`` SmoothQuant when the configuration
    does not smooth, or ``"off"`` (``smooth_step.py``; ``BudgetResult.smooth_quant``); ``finetune_trial``: ``"try"`` AdaQuant on a choice that misses the budget
    (its 300 steps per layer, or at most ``finetune_seconds`` of tuning: a bound that is reached cuts
    layers short by the clock, so the weights then depend on the machine), or ``"off"`` (``finetune_step.py``;
    ``BudgetResult.finetune``). Returns the final ``QuantizeResult``,
    the ``BudgetResult`` (every candidate) and the config path.
    """
    from zonnx.quantization.api import quantize_static

    if not isinstance(model_input, str | Path):
        raise OptionError("the accuracy search takes the float model as a path.")
    if max_layers < 1:
        raise OptionError(f"--search-layers {max_layers}: measure at least 1 layer.")
    if not 0.0 <= min_npu_share <= 1.0:
        raise OptionError(f"--min-npu-share {min_npu_share}: give a share of MACs in [0, 1], e.g. 0.9.")
    if order_by not in ORDERS:
        raise OptionError(f"--search-order {order_by!r}: use one of {', '.join(ORDERS)}.")
    if range_search and (range_groups < 1 or range_samples < 1):
        raise OptionError(
            f"--range-search: range_groups={range_groups}, range_samples={range_samples}; give at least 1 of each."
        )
    if measure_samples < 1:
        raise OptionError(f"measure_samples={measure_samples}: measure on at least 1 sample.")
    for name, value, allowed in (
        ("bias_correction", bias_correction, BIAS_CORRECTION),
        ("thresholds_trial", thresholds_trial, THRESHOLDS_TRIAL),
        ("smooth_quant_trial", smooth_quant_trial, SMOOTH_QUANT_TRIAL),
        ("finetune_trial", finetune_trial, FINETUNE_TRIAL),
    ):
        if value not in allowed:
            raise OptionError(f"{name}={value!r}: use one of {', '.join(allowed)}.")
    if finetune_seconds is not None and not finetune_seconds > 0:  # the CLI's check too
        raise OptionError(f"--search-finetune-seconds {finetune_seconds:g}: give a positive number.")
    feeds = read_feeds(calibration_data_reader, "calibration data")
    if eval_feeds is None:
        calib, held = split_eval(feeds)
        logger.warning(
            "no evaluation data given: held out %d of the %d calibration samples (every 4th) for the search",
            len(held),
            len(feeds),
        )
    else:
        calib, held = feeds, [dict(f) for f in eval_feeds]
    out = Path(model_output)
    config_path = out.with_name(out.name + ".search.toml")
    shard_on = executor if config.extra.calib_shards > 1 else None  # calibration shards go there too
    with tempfile.TemporaryDirectory(prefix="zonnx-search-") as work:
        stats = Path(work) / "stats.npz"
        base = dataclasses.replace(config, extra=dataclasses.replace(config.extra, save_stats=str(stats)))
        baseline = quantize_static(
            model_input, None, ListReader(calib), config=base, calibration_executor=shard_on
        )
        if baseline.report is None:
            raise OptionError(
                "the accuracy search needs the per-layer report; set ReportSamples to 1 or more."
            )
        scorer = CandidateScorer(
            model_input, config, stats, held, metric, input_shapes=input_shapes, search_samples=search_samples,
            calib_feeds=calib,
        )  # fmt: skip
        start: Candidate | None = None  # the current configuration's scored candidate, once a trial scored it
        thresholds = None
        if thresholds_trial == "try":
            tried = try_mse_thresholds(
                scorer, metric, model_input, calib, base, Path(work) / "stats-mse.npz",
                calibration_executor=shard_on,
            )  # fmt: skip
            if tried is not None:
                thresholds, mse_baseline = tried
                start = thresholds.chosen
                if thresholds.kept:  # its statistics, report and plan order the layers from here on
                    config = dataclasses.replace(config, calibrate_method=scorer.base.calibrate_method)
                    baseline = mse_baseline
        smoothed = None
        if smooth_quant_trial == "try":
            tried = try_smooth_quant(
                scorer, metric, model_input, calib,
                dataclasses.replace(base, calibrate_method=config.calibrate_method),
                Path(work) / "stats-smooth.npz", start, calibration_executor=shard_on,
                prequantized=baseline.prequant.form if baseline.prequant is not None else None,
            )  # fmt: skip
            if tried is not None:
                smoothed, smooth_baseline = tried
                start = smoothed.chosen
                if smoothed.kept:  # its statistics, report and plan order the layers from here on
                    config = dataclasses.replace(
                        config, extra=dataclasses.replace(config.extra, smooth_quant=True)
                    )
                    baseline = smooth_baseline
        order = None
        ranges: RangeSearch | None = None
        sens = []
        keep = {t for pair in baseline.plan.removed.values() for t in pair}
        if order_by == "measured" or range_search:
            sens = measure_groups(
                baseline.model,
                baseline.prepared,
                baseline.plan.groups(),
                baseline.plan.quantized_nodes,
                held[:measure_samples],
                keep=keep,
            )
            if order_by == "measured":
                order = measured_order(sens)
        if range_search:
            ranges = search_ranges(
                baseline.model, baseline.prepared, baseline.plan,
                [s.tensors for s in sorted(sens, key=lambda s: -s.noise)], held[:range_samples],
                groups=range_groups, keep=keep, validate=held[range_samples : 2 * range_samples],
            )  # fmt: skip
            if ranges.changed:
                trial = try_config(scorer, with_ranges(scorer.base, ranges), start)
                start = trial.chosen
                log_ranges_trial(trial, metric)
                if trial.kept:
                    config = with_ranges(config, ranges)
                else:
                    ranges = None
        corrected = None
        if bias_correction == "try" and not config.extra.bias_correction:
            corrected = try_bias_correction(scorer, metric, start)
            if corrected is not None:
                start = corrected.chosen
                if corrected.kept:
                    config = dataclasses.replace(
                        config, extra=dataclasses.replace(config.extra, bias_correction=True)
                    )
        recheck = None
        if ranges is not None and corrected is not None and corrected.kept:
            recheck = try_config(scorer, without_ranges(scorer.base, ranges), start)
            start = recheck.chosen
            log_ranges_recheck(recheck, metric)
            if recheck.kept:
                config, ranges = without_ranges(config, ranges), None
        result = search_budget(
            scorer,
            baseline.report,
            baseline.prepared,
            baseline.plan.quantized_nodes,
            budget,
            max_layers=max_layers,
            measure_layers=measure_layers,
            cache=out.with_name(out.name + ".sensitivity.json"),
            executor=executor,
            progress=progress,
            calib_digest=feeds_digest(calib),
            min_npu_share=min_npu_share,
            trials_per_round=int(getattr(executor, "workers", 1))
            if trials_per_round is None
            else trials_per_round,
            order=order,
            baseline=start,
        )
        result.ranges = ranges
        result.thresholds = thresholds
        result.smooth_quant = smoothed
        result.ranges_recheck = recheck
        result.bias_correction = corrected
        final_cfg = dataclasses.replace(
            config, node_overrides={**config.node_overrides, **node_overrides(result.chosen.overrides)}
        )
        final = None  # scored inside: a re-scored choice re-quantizes from the statistics here
        if finetune_trial == "try" and not result.met and not config.extra.include_fast_ft:
            tried = try_fast_finetune(
                scorer, result.chosen, final_cfg, model_input, out, calib, finetune_seconds, shard_on
            )
            finetuned, tuned_model = tried if tried is not None else (None, None)
            result.finetune = finetuned
            if finetuned is not None:
                result.candidates.append(finetuned.changed)
            if finetuned is not None and finetuned.kept:
                final, config = tuned_model, finetune_config(config, finetune_seconds)
                result.chosen = finetuned.changed
                share_ok = result.chosen.npu_mac_share is None or result.chosen.npu_mac_share >= min_npu_share
                result.met = result.chosen.score >= result.threshold and share_ok
    if final is None:  # also writes over a fine-tuned model that was not kept
        final = quantize_static(
            model_input, out, ListReader(calib), config=final_cfg, calibration_executor=shard_on
        )
    note = (
        f"zonnx quantize --accuracy-budget: {metric} {result.chosen.score:.4f} against float "
        f"{result.float_score:.4f} (threshold {result.threshold:.4f}, {'met' if result.met else 'NOT met'}) "
        f"on {result.eval_samples if result.chosen.full else len(scorer.feeds)} evaluation samples;\n"
        f"{result.chosen.raised} layer(s) raised to "
        f"{result.precision}{_trials_note(thresholds, smoothed, ranges, corrected, result.finetune)}. "
        "Re-run without searching: zonnx quantize MODEL OUT --calib DATA --config THIS_FILE"
        + (
            f"\n(the search calibrated on {len(calib)} of the {len(feeds)} calibration samples, every 4th held out "
            "for evaluation; a re-run calibrates on every sample it is given, so give it the same ones)"
            if eval_feeds is None
            else ""
        )
    )
    write_config(config_path, config, result.chosen.overrides, note)
    return final, result, config_path


def _trials_note(thresholds: Any, smoothed: Any, ranges: Any, corrected: Any, finetune: Any) -> str:
    """The config note's words on each trial the search ran, in the order it ran them."""
    return (
        trial_note("MSE thresholds", thresholds, "chosen over min/max", "tried, min/max kept")
        + trial_note("SmoothQuant", smoothed)
        + ranges_note(ranges)
        + trial_note("bias correction", corrected)
        + trial_note("fast finetune (AdaQuant)", finetune, digits=5)
    )
