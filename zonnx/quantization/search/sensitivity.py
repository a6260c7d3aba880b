"""Per-layer sensitivity: the metric with one layer raised (16-bit or float), the others as the baseline.

Each layer costs one re-quantization from saved statistics and one evaluation, so the layers measured
are the ``limit`` worst of the baseline's per-layer report (lowest SQNR of the node's output), not every
node. Results are cached in a JSON file keyed by everything they depend on (float model bytes, base
configuration, metric, evaluation samples, precision); an interrupted run resumes where it stopped.
"""

from __future__ import annotations

__all__ = ["rank_layers", "layer_sensitivity", "cache_key"]

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from zonnx.quantization.annotate import LATENT_OPS
from zonnx.quantization.report_render import LayerReport
from zonnx.quantization.search.executor import Executor, LocalExecutor
from zonnx.quantization.search.scorer import Candidate, CandidateScorer

logger = logging.getLogger(__name__)


def rank_layers(report: LayerReport, quantized_nodes: Sequence[str], limit: int) -> list[str]:
    """Compute nodes (not value-moving ops) of the plan, worst reported output SQNR first."""
    planned = set(quantized_nodes)
    seen: dict[str, None] = {}
    for stats in report.layers:  # already worst first
        if stats.node in planned and stats.op_type not in LATENT_OPS and stats.node not in seen:
            seen[stats.node] = None
    return list(seen)[:limit]


def cache_key(scorer: CandidateScorer, precision: str) -> str:
    """Hash of everything a sensitivity depends on."""
    h = hashlib.sha256()
    h.update(Path(scorer.float_model).read_bytes())
    h.update(repr(scorer.base).encode())
    h.update(scorer.metric_spec.encode())
    h.update(precision.encode())
    for feed in scorer.feeds:
        for name in sorted(feed):
            h.update(name.encode())
            h.update(np.ascontiguousarray(feed[name]).tobytes())
    return h.hexdigest()


def _load(path: Path, key: str) -> dict[str, dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data.get("layers", {}) if isinstance(data, dict) and data.get("key") == key else {}


def _save(path: Path, key: str, layers: Mapping[str, dict]) -> None:
    tmp = path.with_name(f".{path.name}.zonnx-{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "layers": layers}, indent=1))
    os.replace(tmp, path)


def layer_sensitivity(
    scorer: CandidateScorer,
    layers: Sequence[str],
    precision: str,
    cache: Path | None,
    *,
    executor: Executor | None = None,
    progress: Callable[[str, Candidate | None], None] | None = None,
) -> dict[str, Candidate]:
    """Score each layer raised to ``precision`` on its own; cached results are reused."""
    key = cache_key(scorer, precision)
    known = _load(cache, key) if cache is not None else {}
    results: dict[str, Candidate] = {}
    todo = []
    for layer in layers:
        if layer in known:
            results[layer] = Candidate(**known[layer])
            if progress:
                progress(layer, results[layer])
        else:
            todo.append(layer)
    if known:
        logger.info("sensitivity: %d of %d layers from the cache %s", len(results), len(layers), cache)
    runner = executor or LocalExecutor()
    for layer, cand in zip(todo, runner.map(lambda n: scorer.score({n: precision}), todo), strict=True):
        results[layer] = cand
        known[layer] = cand.as_dict()
        if cache is not None:
            _save(cache, key, known)
        if progress:
            progress(layer, cand)
    return {layer: results[layer] for layer in layers}
