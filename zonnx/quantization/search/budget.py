"""Quantize within an accuracy budget: the cheapest mixed-precision plan whose metric stays close to float.

Rule: ``threshold = float score - budget / 100`` (budget in points of the metric; the float score is the
metric of the float model against itself, e.g. 1.0 for cosine, top1 and char-accuracy against float).

1. Baseline: quantize as configured, saving statistics, with the per-layer report; score it on the
   evaluation samples. Within budget: done, nothing is raised.
2. Order: compute layers by the quantization noise each adds (``rank_layers``, from the baseline's
   per-layer report, no extra run), or by measured sensitivity (``order``: the output noise each
   shared-scale group causes when it alone is quantized, ``measure.py``), the first ``max_layers``; optionally the first ``measure_layers``
   re-ordered by measured sensitivity (each raised alone, ``sensitivity.py``). A layer is raised to
   the precision the target offers: ``int16`` when its activation types include it, else ``float``
   (an NPU runs it on the CPU); ``float`` without a target.
3. Binary search over k, raising the first k layers of that order: k = all first (if even that
   misses, nothing in this order meets the budget), then halving, so about log2(max_layers) + 1
   evaluations find the smallest k that meets the threshold (assuming more raised layers never hurt).
   With ``trials_per_round`` W > 1 (W workers, e.g. Ray's), each round scores W probes at once,
   ``low + (high - low) * i // (W + 1)`` for i = 1..W, on the executor: the interval shrinks W + 1
   times per round (log_{W+1} rounds, more evaluations); W = 1 is exactly the binary search. The
   invariant either way: prefix ``low`` misses, prefix ``high`` meets; a round keeps the smallest probe
   that meets as ``high`` and the largest probe below it that misses as ``low``.
   When the first probe misses and the search falls back to float under an NPU share, the order's
   MAC-free layers (elementwise ops, activations, normalization pieces) are also scored raised alone:
   raising more is not always better on a real model (PP-OCRv4 rec on dpu-b4096, char accuracy on 32
   lines: all 118 allowed layers 0.986, the MAC-free ones alone 0.989, none 0.978), and they cost the
   NPU no MACs, only boundaries. Of these misses, fewest layers raised first, the next is taken only when
   it scores higher than the one held beyond the noise of the search samples (``noise.py``: twice the
   jackknife standard error of the paired difference); a higher score within the noise is logged and kept
   in ``BudgetResult.within_noise``. On that model (dpu-b4096, 32 lines) both scored +0.55 points over the
   baseline, within a noise of 1.1-1.5 points, and read 0.15 and 0.36 points lower on 1000 other lines.
4. Confirmation: when candidates were scored on a subset of the evaluation samples
   (``search_samples``), the choice is scored again on all of them; while it misses the threshold
   there, more layers are raised (k grows by half, up to the whole order), each scored on all samples.
5. NPU share: with ``min_npu_share`` and float fall-back, the order first keeps only layers whose MACs
   together stay within ``n - min_npu_share`` of the model's, n the baseline's own share
   (``mac_allowance.py``), so probes respect the share by construction. A choice whose share of MACs on the NPU (the partitioner's,
   after the inputs' dims are fixed) is below it does not meet the budget: float layers run on the
   CPU and split the graph. The search says so; raise int16 layers on a target that has int16.
6. Every candidate goes into the table; when none meets the budget the one step 3 held is kept (and
   said); when its share is below ``min_npu_share``, the best-scoring one that keeps the share, if any.

The chosen overrides are written as a config file (the format ``--config`` reads), so the user can
edit and re-run without searching.
"""

from __future__ import annotations

__all__ = ["BudgetResult", "confirm_sizes", "search_budget", "write_config", "search_precision"]

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zonnx.errors import OptionError
from zonnx.inspection.macs import node_macs_by_name
from zonnx.quantization.config import QuantConfig
from zonnx.quantization.finetune_options import FAST_FINETUNE_KEYS, FastFinetuneOptions
from zonnx.quantization.options import KNOWN_KEYS, ExtraOptions
from zonnx.quantization.search.executor import Executor, LocalExecutor
from zonnx.quantization.search.mac_allowance import within_mac_allowance
from zonnx.quantization.search.noise import Z, paired_difference
from zonnx.quantization.search.resolution import coarse_budget_note
from zonnx.quantization.search.scorer import Candidate, CandidateScorer, node_overrides
from zonnx.quantization.search.sensitivity import layer_sensitivity, rank_layers

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class BudgetResult:
    """What the search measured and chose."""

    metric: str
    float_score: float
    threshold: float
    baseline: Candidate
    sensitivity: dict[str, Candidate]
    candidates: list[Candidate]
    chosen: Candidate
    met: bool
    precision: str
    eval_samples: int
    confirmed: Candidate | None = None
    min_npu_share: float = 0.0
    ranges: Any = None  # the range search (``ranges.RangeSearch``) run before, if any
    bias_correction: Any = None  # the bias-correction trial (``config_trial.ConfigTrial``), if any
    thresholds: Any = None  # the MSE-thresholds trial (``config_trial.ConfigTrial``), if any
    smooth_quant: Any = None  # the SmoothQuant trial (``config_trial.ConfigTrial``), if any
    ranges_recheck: Any = None  # kept ranges scored again without them once bias correction joined
    finetune: Any = None  # the fast-finetune trial on the choice (``finetune_step.FinetuneTrial``), if any
    resolution: float | None = None  # the metric's step on the samples that score candidates, if it has one
    #: candidates that missed the budget and scored higher than the kept one within the noise (``noise.py``)
    within_noise: list[str] = dataclasses.field(default_factory=list)

    def table(self) -> list[dict[str, Any]]:
        """One row per candidate, baseline first: score, layers not int8, NPU MAC share, seconds."""
        rows = []
        for i, cand in enumerate([self.baseline, *self.candidates]):
            rows.append(
                {
                    "candidate": "baseline"
                    if i == 0
                    else "choice + fast finetune"
                    if self.finetune is not None and cand is self.finetune.changed
                    else f"#{i}{' (all samples)' if cand.full else ''}",
                    "score": cand.score,
                    "not_int8": cand.raised,
                    "npu_mac_share": cand.npu_mac_share,
                    "chosen": cand is self.chosen,
                    "seconds": round(cand.seconds, 2),
                }
            )
        return rows


def search_precision(target: str | None) -> str:
    """int16 when the target's activation types include it, else float (CPU fallback)."""
    if not target:
        return "float"
    from zonnx.backend.targets import load_target

    return "int16" if "int16" in load_target(target).quant.activation_dtypes else "float"


def search_budget(
    scorer: CandidateScorer,
    baseline_report: Any,
    prepared: Any,
    quantized_nodes: Sequence[str],
    budget: float,
    *,
    max_layers: int = 48,
    measure_layers: int = 0,
    cache: Path | None = None,
    executor: Executor | None = None,
    progress: Callable[[str, Candidate | None], None] | None = None,
    calib_digest: str = "",
    min_npu_share: float = 0.0,
    trials_per_round: int = 1,
    order: Sequence[str] | None = None,
    baseline: Candidate | None = None,
) -> BudgetResult:
    """Run steps 1-6 of the module docstring on a scorer built for the baseline configuration;
    ``executor`` runs the sensitivity tasks, and the step-3 probes when ``trials_per_round`` > 1; ``order``
    (the most sensitive node first, e.g. ``measure.measured_order``) replaces the report's ranking;
    ``baseline``: the baseline configuration already scored as step 1 scores it (the bias-correction
    trial's), so it is not scored again."""
    if not (math.isfinite(budget) and budget >= 0):
        raise OptionError(f"--accuracy-budget {budget}: give points of the metric, a number >= 0 (e.g. 0.5).")
    if trials_per_round < 1:
        raise OptionError(f"trials_per_round {trials_per_round}: give at least 1 probe per round.")
    float_score = scorer.float_score
    if not math.isfinite(float_score):
        raise OptionError(
            f"metric {scorer.metric_spec!r} gives {float_score} for the float model against itself, so a "
            "budget below float means nothing; use cosine, top1, char-accuracy or a plugin with a finite score."
        )
    threshold = float_score - budget / 100.0
    coarse = coarse_budget_note(budget, scorer.resolution, len(scorer.feeds), scorer.metric_spec)
    if coarse:
        logger.warning("%s", coarse)
    precision = search_precision(scorer.base.extra.target)
    if baseline is None:
        baseline = scorer.score({}, full=scorer.subset)  # the baseline is judged on every sample
    if progress:
        progress("baseline", baseline)
    candidates: list[Candidate] = []
    sensitivity: dict[str, Candidate] = {}
    within_noise: list[str] = []
    best = baseline
    if baseline.score < threshold:
        ranked = (
            list(order)
            if order is not None
            else rank_layers(baseline_report, prepared, quantized_nodes, len(quantized_nodes))
        )
        macs: Mapping[str, int | None] = {}
        if precision == "float" and min_npu_share > 0 and scorer.base.extra.target:
            macs = node_macs_by_name(prepared, scorer.input_shapes)
            now = baseline.npu_mac_share if baseline.npu_mac_share is not None else 1.0
            ranked = within_mac_allowance(ranked, macs, min_npu_share, now, baseline.off_npu or ())
        order = ranked[
            : min(max_layers, len(ranked) - 1)
        ]  # raising every layer would leave nothing quantized
        if measure_layers:
            measured = order[:measure_layers]
            sensitivity = layer_sensitivity(
                scorer,
                measured,
                precision,
                cache,
                executor=executor,
                progress=progress,
                calib_digest=calib_digest,
            )
            measured.sort(key=lambda n: -sensitivity[n].score)
            order = measured + order[measure_layers:]

        runner = executor if (executor is not None and trials_per_round > 1) else LocalExecutor()

        def trials(ks: list[int], full: bool = False, keep: bool = False) -> list[Candidate]:
            """Score the prefixes of sizes ``ks`` (on every evaluation sample with ``full``) on the runner;
            ``keep``: they hold their outputs for a comparison beyond noise."""
            found = list(
                runner.map(
                    lambda o: scorer.score(o, full=full, keep_outputs=keep),
                    [{n: precision for n in order[:k]} for k in ks],
                )
            )
            where = f", all {len(scorer.full.feeds)} samples" if full else ""
            for k, cand in zip(ks, found, strict=True):
                candidates.append(cand)
                if progress:
                    progress(f"top {k} raised{where}", cand)
            return found

        # The most layers first: if raising all of them misses the budget, no prefix meets it.
        low, high = 0, len(order)
        top = trials([high], keep=True)[0] if order else baseline
        misses = [("the baseline", baseline), (f"all {high} layers raised", top)] if order else []
        free = [n for n in order if macs.get(n) == 0]
        if top.score < threshold and 0 < len(free) < len(order):
            alone = scorer.score({n: precision for n in free}, keep_outputs=True)
            candidates.append(alone)
            if progress:
                progress(f"the {len(free)} MAC-free layers raised", alone)
            misses.insert(1, (f"the {len(free)} MAC-free layers raised", alone))
        if top.score < threshold and misses:  # more layers raised must pay for themselves (noise.py)
            best = _fewest_within_noise(scorer, misses, within_noise)
        if top.score >= threshold:
            while high - low > 1:  # invariant: prefix `low` misses, prefix `high` meets
                probes = sorted({low + (high - low) * i // (trials_per_round + 1)
                                 for i in range(1, trials_per_round + 1)} - {low, high})  # fmt: skip
                scored = dict(zip(probes, trials(probes), strict=True))
                high = min([k for k, c in scored.items() if c.score >= threshold], default=high)
                low = max([k for k, c in scored.items() if c.score < threshold and k < high], default=low)
            best = next(c for c in candidates if c.raised == high and c.score >= threshold)
            if scorer.subset:
                best = _confirm(trials, high, len(order), threshold, trials_per_round)
    met = best.score >= threshold
    share = best.npu_mac_share
    if not met and share is not None and share < min_npu_share:
        # nothing meets the budget: keep the best candidate that still keeps the NPU share, if any
        kept = [c for c in [baseline, *candidates] if (c.npu_mac_share or 0.0) >= min_npu_share]
        if kept:
            best = max(kept, key=lambda c: c.score)
            share = best.npu_mac_share
    if met and share is not None and share < min_npu_share:
        met = False
        logger.warning(
            "accuracy budget met with %d layer(s) raised to %s, but only %.1f%% of MACs stay on the NPU "
            "(at least %.0f%% asked): %s",
            best.raised,
            precision,
            100 * share,
            100 * min_npu_share,
            "float layers run on the CPU and split the graph; try another calibration method or a larger budget"
            if precision == "float"
            else "int16 layers the NPU cannot run fall back to the CPU",
        )
    elif not met:
        logger.warning(
            "accuracy budget not met: best %s %.5f (%d layers raised to %s) against the threshold %.5f (float "
            "%.5f - %.3g points); kept the best candidate. Try more layers (--search-layers), another "
            "calibration method, or a larger budget.",
            scorer.metric_spec,
            best.score,
            best.raised,
            precision,
            threshold,
            float_score,
            budget,
        )
    for cand in [baseline, *candidates]:
        cand.outputs = None  # kept only while compared
    return BudgetResult(
        scorer.metric_spec,
        float_score,
        threshold,
        baseline,
        sensitivity,
        candidates,
        best,
        met,
        precision,
        len(scorer.full.feeds),
        best if best.full else None,
        min_npu_share,
        resolution=scorer.resolution,
        within_noise=within_noise,
    )


def _fewest_within_noise(
    scorer: CandidateScorer, misses: Sequence[tuple[str, Candidate]], notes: list[str]
) -> Candidate:
    """Among candidates that miss the budget, fewest layers raised first: walk them and take the next
    one only when it scores higher than the one held beyond the noise of the search samples
    (``noise.py``); a higher score within the noise is logged and noted in ``notes``."""
    _, held = misses[0]
    for what, cand in misses[1:]:
        if not cand.score > held.score:
            continue
        diff = paired_difference(scorer.reference, scorer.search_outputs(cand), scorer.search_outputs(held))
        if diff.beyond_noise:
            held = cand
            continue
        note = (
            f"{what}: {scorer.metric_spec} {diff.difference * 100:+.3g} points against the candidate with "
            f"{held.raised} layer(s) raised on the same {len(scorer.reference.feeds)} samples, within their "
            f"noise ({Z:g} x jackknife standard error = {Z * diff.standard_error * 100:.3g} points), so it "
            "is not taken; more evaluation samples (--eval) narrow the noise"
        )
        logger.warning("%s", note)
        notes.append(note)
    return held


def confirm_sizes(k: int, limit: int, count: int) -> list[int]:
    """``count`` prefix sizes from ``k``, each the previous grown by half (at least 1), capped at ``limit``."""
    sizes = [min(limit, k)]
    while len(sizes) < count and sizes[-1] < limit:
        sizes.append(min(limit, sizes[-1] + max(1, sizes[-1] // 2)))
    return sizes


def _confirm(
    trials: Callable[..., list[Candidate]], k: int, limit: int, threshold: float, per_round: int
) -> Candidate:
    """Score the first ``k`` layers raised on every evaluation sample (``trials(sizes, full=True)``),
    growing k by half until it meets or reaches ``limit``; each round scores ``per_round`` growing sizes
    at once and keeps the smallest that meets (so the choice is the same whatever ``per_round`` is)."""
    while True:
        sizes = confirm_sizes(k, limit, per_round)
        for size, cand in zip(sizes, trials(sizes, full=True), strict=True):
            if cand.score >= threshold or size >= limit:
                return cand
        k = min(limit, sizes[-1] + max(1, sizes[-1] // 2))


def _toml_value(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple | np.ndarray):
        return "[" + ", ".join(_toml_value(v) for v in np.asarray(value).tolist()) + "]"
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


#: extra_options a config file does not carry: where this run's files go, the target (its own key) and
#: the per-tensor table (written as a sub-table).
_NOT_WRITTEN = frozenset(
    {"Target", "SaveStats", "LoadStats", "ReportPath", "ExportCalibrationTable", "LoadCalibrationTable",
     "TensorQuantOverrides"}
)  # fmt: skip


def written_extra_options(base: QuantConfig) -> dict[str, Any]:
    """The extra_options of ``base`` that differ from the defaults and are plain values (ORT's key names)."""
    defaults = ExtraOptions()
    out: dict[str, Any] = {}
    for key, (field, _) in KNOWN_KEYS.items():
        if key in _NOT_WRITTEN or not hasattr(base.extra, field):
            continue
        value = getattr(base.extra, field)
        if value != getattr(defaults, field) and isinstance(value, bool | int | float | str):
            out[key] = value
    return out


def written_fast_finetune(base: QuantConfig) -> dict[str, Any]:
    """The FastFinetune settings of ``base`` that differ from the defaults (Vitis AI's key names)."""
    defaults = FastFinetuneOptions()
    out: dict[str, Any] = {}
    for key, (field, _) in FAST_FINETUNE_KEYS.items():
        if not field:  # accepted for Vitis AI compatibility, nothing stored (OptimDevice, InferDevice)
            continue
        value = getattr(base.extra.fast_finetune, field)
        if value is not None and value != getattr(defaults, field):  # TOML has no null
            out[key] = list(value) if isinstance(value, tuple) else value
    return out


def write_config(path: Path, base: QuantConfig, overrides: Mapping[str, str], note: str) -> Path:
    """The chosen configuration as a TOML config file ``zonnx quantize --config`` reads."""
    lines = [f"# {line}" for line in note.splitlines()]
    lines += [
        f"method = {_toml_value(getattr(base.calibrate_method, 'name', base.calibrate_method).lower())}",
        f"format = {_toml_value(getattr(base.quant_format, 'name', base.quant_format).lower())}",
        f"activation_type = {_toml_value(base.activation_type)}",
        f"weight_type = {_toml_value(base.weight_type)}",
        f"per_channel = {_toml_value(base.per_channel)}",
    ]
    if base.extra.target:
        lines.append(f"target = {_toml_value(base.extra.target)}")
    extras = written_extra_options(base)
    if extras:  # the user's options and the search's own (BiasCorrection), so a re-run reproduces them
        lines += ["", "[extra_options]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in extras.items()]
    if base.extra.include_fast_ft:  # the search's own fast finetune (or the user's): its settings too
        lines += ["", "[extra_options.FastFinetune]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in written_fast_finetune(base).items()]
    tensors = dict(base.extra.tensor_quant_overrides or {})
    if tensors:  # searched ranges (and the user's own): fixed parameters per tensor
        lines += ["", "[extra_options.TensorQuantOverrides]"]
        for name, entries in tensors.items():
            lines.append(f"{json.dumps(name)} = [{', '.join(_toml_value(e) for e in entries)}]")
    for node, keys in node_overrides(overrides).items():
        lines.append("")
        lines.append(f"[nodes.{json.dumps(node)}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in keys.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def split_eval(feeds: list[dict[str, np.ndarray]], max_eval: int = 64) -> tuple[list, list]:
    """Hold out every 4th sample (at most ``max_eval``) for evaluation; calibrate on the rest."""
    if len(feeds) < 4:
        raise OptionError(
            f"the calibration data has {len(feeds)} sample(s): the budget search holds out every 4th for "
            "evaluation and needs at least 4; give more, or evaluation data with --eval."
        )
    held = [f for i, f in enumerate(feeds) if i % 4 == 3][:max_eval]
    held_ids = {id(f) for f in held}
    return [f for f in feeds if id(f) not in held_ids], held
