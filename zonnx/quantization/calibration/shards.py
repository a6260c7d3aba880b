"""Calibration sharded over an executor (in process or Ray), merging exactly into the one-process result.

The calibration set is cut into ``shards`` contiguous runs of batches. A worker opens the augmented
calibration model from files (``calib_aug.onnx`` + ``calib_weights.npz`` in a folder every worker
sees; sessions are never pickled), runs its batches and returns, per batch, the few reductions ORT
computed in the graph (value count, min, max, sum, sum of squares per tensor) and the strided
histogram sample (at most ``hist_sample`` values per tensor; every value with ``hist_sample=None``,
which makes the records as large as the activations). The driver folds those records into
``TensorStats`` in batch order with the same ``BatchFolder`` the one-process ``collect`` uses.

Why records and not per-shard statistics: ORT's moving average ``old + c (new - old)`` and Compass'
``mean`` are recurrences over the batch order, float sums depend on their order, and the grid
histogram's bins depend on the grid at the time a batch was counted; so statistics built shard by
shard cannot be merged bit for bit. Records folded in order give exactly the statistics, ranges and
scales of one process. The per-batch sampling steps come from the previous batch's tensor sizes; a
shard that starts at batch ``b > 0`` therefore also runs batch ``b - 1`` once (not folded) to get them.
Workers keep their session between tasks (the last model file's only). Memory: the driver holds the
feeds and one shard's records at a time; use more shards for larger sets.
"""

from __future__ import annotations

__all__ = ["DEFAULT_SHARDS", "run_shard", "collect_sharded"]

import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from zonnx.ir.io import ModelLike, to_proto, write_bytes_atomic
from zonnx.quantization.calibration import augment
from zonnx.quantization.calibration.collector import (
    DEFAULT_HIST_SAMPLE,
    BatchFolder,
    calibration_session,
    first_steps,
    sample_steps,
)
from zonnx.quantization.calibration.methods import requirements
from zonnx.quantization.calibration.readers import CalibrationError, validated
from zonnx.quantization.calibration.stats import DEFAULT_BINS, TensorStats

logger = logging.getLogger(__name__)

#: Shards when none are asked for: one per local Ray CPU.
DEFAULT_SHARDS = 2
_MODEL, _WEIGHTS, _META = "calib_aug.onnx", "calib_weights.npz", "calib_meta.json"
_SESSIONS: dict[tuple[str, int], tuple[ort.InferenceSession, augment.Augmented, str]] = {}

Feed = dict[str, np.ndarray]
#: (folder, feeds of the shard, the batch before it or None, hist_sample, providers, optimization level)
ShardTask = tuple[str, list[Feed], Feed | None, int | None, tuple[str, ...], int]


def _write(aug: augment.Augmented, folder: Path) -> None:
    """The augmented model (weights as external placeholders), its weights and how to read it."""
    write_bytes_atomic(folder / _MODEL, aug.model.SerializeToString())
    with open(folder / _WEIGHTS, "wb") as f:
        np.savez(f, **{f"w{i}": numpy_helper.to_array(w) for i, w in enumerate(aug.weights)})
    meta = {"weights": [w.name for w in aug.weights], "measured": aug.measured,
            "steps_input": aug.steps_input, "sizes": aug.outputs["sizes"]}  # fmt: skip
    write_bytes_atomic(folder / _META, json.dumps(meta).encode())


def _open(
    folder: str, providers: tuple[str, ...], level: int
) -> tuple[ort.InferenceSession, augment.Augmented, str]:
    """The session over the files in ``folder``, built as ``collect`` builds it; kept per process."""
    path = os.path.join(folder, _MODEL)
    key = (path, os.stat(path).st_mtime_ns)
    if key not in _SESSIONS:
        _SESSIONS.clear()  # one calibration model per process: a finished run's folder is gone
        meta = json.loads(Path(folder, _META).read_text())
        model = onnx.load(path, load_external_data=False)
        with np.load(os.path.join(folder, _WEIGHTS)) as z:
            weights = [numpy_helper.from_array(z[f"w{i}"], n) for i, n in enumerate(meta["weights"])]
        aug = augment.Augmented(model, meta["measured"], {}, {}, [], meta["steps_input"], weights)
        sess = calibration_session(aug, providers, ort.GraphOptimizationLevel(level))
        aug.weights = []
        _SESSIONS[key] = (sess, aug, meta["sizes"])
    return _SESSIONS[key]


def run_shard(task: ShardTask) -> list[list[np.ndarray]]:
    """The ORT outputs of the calibration model on each batch of one shard, in batch order.

    Rule: batch ``i`` of the shard runs with the sampling steps of the batch before it (the shard's
    previous batch, or ``task[2]``, run once for its sizes only; shape inference on the first batch of
    the whole set when there is none), exactly as ``collect`` steps through the set.
    """
    folder, feeds, before, hist_sample, providers, level = task
    sess, aug, sizes_name = _open(folder, tuple(providers), level)
    out_names = [o.name for o in sess.get_outputs()]
    sizes_at = out_names.index(sizes_name)
    steps = None
    if aug.steps_input is not None and hist_sample is not None:
        first = before if before is not None else feeds[0]
        steps = first_steps(aug, first, hist_sample)
        if before is not None:
            res = sess.run([out_names[sizes_at]], {**before, aug.steps_input: steps})
            steps = sample_steps(res[0], hist_sample)
    records = []
    for feed in feeds:
        run_feed = dict(feed) if steps is None else {**feed, aug.steps_input: steps}
        res = sess.run(out_names, run_feed)
        if steps is not None:
            steps = sample_steps(res[sizes_at], hist_sample)
        records.append(res)
    return records


def _cut(n: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` contiguous [start, stop) runs covering ``n`` batches, sizes differing by at most one."""
    k = max(1, min(shards, n))
    edges = [round(i * n / k) for i in range(k + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:], strict=False) if b > a]


def collect_sharded(
    model: ModelLike,
    tensor_names: Sequence[str],
    reader: Any,
    *,
    executor: Any = None,
    shards: int = DEFAULT_SHARDS,
    methods_needed: Iterable[str | Enum] = ("minmax",),
    providers: Sequence[str] = ("CPUExecutionProvider",),
    progress: Callable[[int], None] | None = None,
    bins: int = DEFAULT_BINS,
    hist_sample: int | None = DEFAULT_HIST_SAMPLE,
    averaging_constant: float = 0.01,
    momentum: float = 0.9,
    optimization_level: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    work_dir: str | os.PathLike[str] | None = None,
) -> dict[str, TensorStats]:
    """``collect``'s statistics, bit for bit, with the batches cut into ``shards`` tasks on ``executor``.

    Options as ``collect``; ``executor`` any object with ``map(fn, items)`` yielding results in item
    order (``zonnx.quantization.search.executor.LocalExecutor`` when None; ``zonnx.deploy.RayExecutor``
    for Ray); ``shards`` (2); ``work_dir`` the folder for the model files the workers open (a temporary
    folder when None; on a cluster, give a folder every node sees). The reader's feeds are held in
    memory (inputs only; activations still never outlive their batch).
    """
    from zonnx.quantization.search.executor import LocalExecutor

    if shards < 1:
        raise CalibrationError(f"shards must be >= 1, got {shards}.")
    if hist_sample is not None and hist_sample < 1:
        raise CalibrationError(f"hist_sample must be >= 1 or None, got {hist_sample}.")
    proto = to_proto(model)
    need = requirements(methods_needed)
    aug = augment.build(proto, tensor_names, need, sample=hist_sample is not None)
    feeds = list(validated(reader, proto))
    stats = {
        t: TensorStats(t, averaging_constant=averaging_constant, momentum=momentum)
        for t in dict.fromkeys(tensor_names)
    }
    out_names = [o.name for o in aug.model.graph.output]
    fold = BatchFolder(aug, stats, bins, out_names)
    runner = executor if executor is not None else LocalExecutor()
    with tempfile.TemporaryDirectory(prefix="zonnx-calib-", dir=work_dir) as folder:
        _write(aug, Path(folder))
        aug.weights = []
        parts = _cut(len(feeds), shards)
        tasks = [
            (
                folder,
                feeds[a:b],
                feeds[a - 1] if a > 0 else None,
                hist_sample,
                tuple(providers),
                int(optimization_level),
            )  # fmt: skip
            for a, b in parts
        ]
        done = 0
        for records in runner.map(run_shard, tasks):
            for res in records:
                fold(res)
                if progress is not None:
                    progress(done)
                done += 1
    _SESSIONS.clear()
    fold.finish()
    logger.info("calibrated %d tensors on %d batches in %d shard(s)", len(stats), done, len(parts))
    return stats
