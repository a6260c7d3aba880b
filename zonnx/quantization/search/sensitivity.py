"""Per-layer sensitivity: the metric with one layer raised (16-bit or float), the others as the baseline.

Each layer costs one re-quantization from saved statistics and one evaluation, so the layers measured
are the first ``limit`` of ``rank_layers`` (the most quantization noise each adds, read from the
baseline's per-layer report), not every node. Results are cached in a JSON file keyed by everything they depend on (float model bytes, base
configuration, metric, evaluation samples, precision); an interrupted run resumes where it stopped.
"""

from __future__ import annotations

__all__ = ["rank_layers", "layer_sensitivity", "cache_key", "feeds_digest"]

import dataclasses
import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from zonnx.quantization.op_rules import LATENT_OPS
from zonnx.quantization.report_render import LayerReport
from zonnx.quantization.search.executor import Executor, LocalExecutor
from zonnx.quantization.search.scorer import Candidate, CandidateScorer

logger = logging.getLogger(__name__)


def _noise(sqnr_db: float) -> float:
    """Noise power over signal power of a tensor, from its SQNR."""
    return 0.0 if sqnr_db == math.inf else 10.0 ** (-sqnr_db / 10.0)


def rank_layers(
    report: LayerReport, float_model: onnx.ModelProto, quantized_nodes: Sequence[str], limit: int
) -> list[str]:
    """Compute nodes (not value-moving ops) of the plan, the most noise each adds first.

    A node's added noise is its output's relative noise power minus the largest of its inputs' (from
    the per-layer report): the error the node itself brings, not the error it inherits. A node whose
    output is not quantized (the "kernels" placement) is charged for the quantizers on its inputs.
    """
    planned = set(quantized_nodes)
    noise = {s.tensor: _noise(s.sqnr_db) for s in report.layers}
    feeding = {o: list(node.input) for node in float_model.graph.node for o in node.output}
    added: dict[str, float] = {}
    for node in float_model.graph.node:
        if node.name not in planned or node.op_type in LATENT_OPS:
            continue
        outs = [noise[o] for o in node.output if o in noise]
        if outs:  # its output is quantized: the error it adds over its inputs
            added[node.name] = max(outs) - max((noise.get(i, 0.0) for i in node.input), default=0.0)
            continue
        ins = [i for i in node.input if i in noise]  # "kernels" placement: the quantizers on its input edges
        if ins:
            upstream = [noise.get(x, 0.0) for i in ins for x in feeding.get(i, [])]
            added[node.name] = max(noise[i] for i in ins) - max(upstream, default=0.0)
    return sorted(added, key=lambda n: -added[n])[:limit]


def feeds_digest(feeds: Sequence[Mapping[str, np.ndarray]]) -> str:
    """Hash of a list of input dicts (names and bytes)."""
    h = hashlib.sha256()
    for feed in feeds:
        for name in sorted(feed):
            h.update(name.encode())
            h.update(np.ascontiguousarray(feed[name]).tobytes())
    return h.hexdigest()


def cache_key(scorer: CandidateScorer, precision: str, calib_digest: str = "") -> str:
    """Hash of everything a sensitivity depends on (``calib_digest``: of the calibration samples)."""
    h = hashlib.sha256(calib_digest.encode())
    h.update(Path(scorer.float_model).read_bytes())
    stable = dataclasses.replace(scorer.base, extra=dataclasses.replace(scorer.base.extra, load_stats=None))
    h.update(repr(stable).encode())  # not the temporary statistics path, which differs per run
    h.update(scorer.metric_spec.encode())
    h.update(precision.encode())
    h.update(feeds_digest(scorer.feeds).encode())
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
    calib_digest: str = "",
) -> dict[str, Candidate]:
    """Score each layer raised to ``precision`` on its own; cached results are reused."""
    key = cache_key(scorer, precision, calib_digest)
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
