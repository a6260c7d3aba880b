"""Quantize within an accuracy budget: the cheapest mixed-precision plan whose metric stays close to float.

Rule: ``threshold = float score - budget / 100`` (budget in points of the metric; the float score is the
metric of the float model against itself, e.g. 1.0 for cosine, top1 and char-accuracy against float).

1. Baseline: quantize as configured, saving statistics, with the per-layer report; score it on the
   evaluation samples. Within budget: done, nothing is raised.
2. Sensitivity (``sensitivity.py``): the report's worst layers, each raised alone to the precision the
   target offers (``int16`` when its activation types include it, else ``float``, which an NPU runs on
   the CPU; ``float`` without a target).
3. Greedy: raise layers in order of their own gain; a layer whose addition does not raise the score
   is dropped again; stop at the first candidate within the threshold. That candidate has the fewest
   layers not int8 this order finds; among equal counts the one with more MACs on the NPU wins.
4. Every candidate goes into the table; when none meets the budget the best one is kept (and said).

The chosen overrides are written as a config file (the format ``--config`` reads), so the user can
edit and re-run without searching.
"""

from __future__ import annotations

__all__ = ["BudgetResult", "search_budget", "write_config", "search_precision"]

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zonnx.errors import OptionError
from zonnx.quantization.config import QuantConfig
from zonnx.quantization.search.executor import Executor
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

    def table(self) -> list[dict[str, Any]]:
        """One row per candidate, baseline first: score, layers not int8, NPU MAC share, seconds."""
        rows = []
        for i, cand in enumerate([self.baseline, *self.candidates]):
            rows.append(
                {
                    "candidate": "baseline" if i == 0 else f"#{i}",
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


def _better(a: Candidate, b: Candidate) -> bool:
    """a beats b: higher score; on equal scores fewer raised layers, then more MACs on the NPU."""
    if a.score != b.score:
        return a.score > b.score
    if a.raised != b.raised:
        return a.raised < b.raised
    return (a.npu_mac_share or 0.0) > (b.npu_mac_share or 0.0)


def search_budget(
    scorer: CandidateScorer,
    baseline_report: Any,
    quantized_nodes: Sequence[str],
    budget: float,
    *,
    max_layers: int = 24,
    cache: Path | None = None,
    executor: Executor | None = None,
    progress: Callable[[str, Candidate | None], None] | None = None,
) -> BudgetResult:
    """Run steps 1-4 of the module docstring on a scorer built for the baseline configuration."""
    if not (math.isfinite(budget) and budget >= 0):
        raise OptionError(f"--accuracy-budget {budget}: give points of the metric, a number >= 0 (e.g. 0.5).")
    float_score = scorer.float_score
    if not math.isfinite(float_score):
        raise OptionError(
            f"metric {scorer.metric_spec!r} gives {float_score} for the float model against itself, so a "
            "budget below float means nothing; use cosine, top1, char-accuracy or a plugin with a finite score."
        )
    threshold = float_score - budget / 100.0
    precision = search_precision(scorer.base.extra.target)
    baseline = scorer.score({})
    if progress:
        progress("baseline", baseline)
    candidates: list[Candidate] = []
    sensitivity: dict[str, Candidate] = {}
    best = baseline
    if baseline.score < threshold:
        layers = rank_layers(baseline_report, quantized_nodes, max_layers)
        sensitivity = layer_sensitivity(
            scorer, layers, precision, cache, executor=executor, progress=progress
        )
        order = sorted(layers, key=lambda n: -(sensitivity[n].score - baseline.score))
        current: dict[str, str] = {}
        current_score = baseline.score
        for layer in order:
            if sensitivity[layer].score <= baseline.score:
                break  # raising it alone did not help; neither will the rest
            trial = scorer.score({**current, layer: precision})
            candidates.append(trial)
            if progress:
                progress(f"+{layer}", trial)
            if trial.score > current_score:
                current, current_score = dict(trial.overrides), trial.score
                if _better(trial, best):
                    best = trial
            if current_score >= threshold:
                break
        met_first = [c for c in candidates if c.score >= threshold]
        if met_first:
            best = met_first[0]
    met = best.score >= threshold
    if not met:
        logger.warning(
            "accuracy budget not met: best %s %.4f (%d layers raised) against the threshold %.4f (float %.4f - "
            "%.2f points); kept the best candidate. Try more layers (--search-layers), another calibration "
            "method, or a larger budget.",
            scorer.metric_spec,
            best.score,
            best.raised,
            threshold,
            float_score,
            budget,
        )
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
        len(scorer.feeds),
    )


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


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
