"""Streaming collection: one calibration model, one ORT session, activations never outlive their batch.

``collect`` builds the calibration model (``augment.build``: every statistic except the histogram is
computed inside ORT and leaves it as a few small arrays), creates one session with graph optimizations
on (the requested tensors feed the added nodes, so they cannot be fused away), runs every batch once
and folds its results into per-tensor ``TensorStats``.

Histograms are counted from a strided sample of at most about ``hist_sample`` values per tensor and
batch (``hist_sample=None``: every value). The step is the least prime >= size / hist_sample, so it
does not line up with power-of-two or common channel sizes; the first batch's steps come from shape
inference on its input shapes (step 1, every value, where that fails), later ones from the previous
batch's sizes. Below opset 10 (no Slice steps) every value is counted. Extrema, counts and moments
always cover every value.
With ``batch`` > 1, samples of leading dim 1 run several to an ORT run and are folded one
by one as if run alone (``batching``; the statistics are the same, checked bit for bit on the first batch).
Histogram updates run in a worker thread, overlapping the next ORT run (which releases the GIL), with
at most two batches queued, so memory stays flat however many samples there are.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_HIST_SAMPLE",
    "BatchFolder",
    "calibration_session",
    "collect",
    "first_steps",
    "sample_steps",
]

import functools
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from zonnx.errors import first_line
from zonnx.ir.io import ModelLike, proto_limit, to_proto
from zonnx.ir.large import session_folder
from zonnx.quantization.calibration import augment, batching
from zonnx.quantization.calibration.methods import requirements
from zonnx.quantization.calibration.readers import CalibrationError, validated
from zonnx.quantization.calibration.stats import DEFAULT_BINS, GridHistogram, TensorStats

logger = logging.getLogger(__name__)

#: Values per tensor and batch that enter the histogram (extrema and moments always see every value).
DEFAULT_HIST_SAMPLE = 16384
_PRIME_TABLE_SIZE = 1 << 16


@functools.cache
def _primes_at_least(n: int) -> np.ndarray:
    """table[k] = least prime >= k for k < n (table[0] = table[1] = 1)."""
    sieve = np.ones(2 * n + 64, dtype=bool)
    sieve[:2] = False
    for p in range(2, int(sieve.size**0.5) + 1):
        if sieve[p]:
            sieve[p * p :: p] = False
    primes = np.nonzero(sieve)[0]
    table = primes[np.searchsorted(primes, np.arange(n))].astype(np.int64)
    table[:2] = 1
    return table


def sample_steps(sizes: np.ndarray, hist_sample: int) -> np.ndarray:
    """Sampling step per tensor: the least prime >= size / hist_sample (an odd number past the table)."""
    primes = _primes_at_least(_PRIME_TABLE_SIZE)
    k = np.maximum(-(-np.asarray(sizes, dtype=np.int64) // hist_sample), 1)
    return np.where(k < _PRIME_TABLE_SIZE, primes[np.minimum(k, _PRIME_TABLE_SIZE - 1)], k | 1).astype(
        np.int64
    )


def first_steps(aug: augment.Augmented, feed: dict[str, np.ndarray], hist_sample: int) -> np.ndarray:
    """Steps for the first batch from the tensor sizes shape inference gives for its input shapes.

    Tensors whose size inference cannot tell get step 1 (every value) for this one batch.
    """
    sizes = np.zeros(len(aug.measured), dtype=np.int64)
    try:
        m = onnx.ModelProto()
        m.CopyFrom(aug.model)
        for vi in m.graph.input:
            if vi.name in feed:
                shape = vi.type.tensor_type.shape
                del shape.dim[:]
                for d in feed[vi.name].shape:
                    shape.dim.add().dim_value = d
        inferred = onnx.shape_inference.infer_shapes(m)
        dims = {}
        for vi in inferred.graph.value_info:
            ds = vi.type.tensor_type.shape.dim
            if ds and all(d.HasField("dim_value") for d in ds):
                dims[vi.name] = int(np.prod([d.dim_value for d in ds]))
        for i, t in enumerate(aug.measured):
            sizes[i] = dims.get(t, feed[t].size if t in feed else 0)
    except Exception as e:  # noqa: BLE001 - inference is only a speed-up here; say what it costs
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        logger.warning(
            "histogram sampling: shape inference failed on the augmented model (%s); the first "
            "calibration batch counts every value of every tensor (slower for that batch, same ranges)",
            first,
        )
    unknown = int((sizes <= 0).sum())
    if unknown and unknown < len(sizes):
        logger.info(
            "histogram sampling: %d tensors of unknown size count every value in the first batch", unknown
        )
    return np.where(sizes > 0, sample_steps(sizes, hist_sample), 1).astype(np.int64)


#: Non-data fields (names, dims, doc strings) of all weights stay below this: under the limit by more
#: than this, the weights' raw bytes decide without serializing them.
_FIELDS_SLACK = 1 << 26


def _weights_past_limit(weights: Sequence[onnx.TensorProto]) -> bool:
    """``sum(w.ByteSize()) > proto_limit()``; upb's ByteSize copies each tensor, so raw-data weights are
    measured by their element counts unless the sum comes within ``_FIELDS_SLACK`` of the limit."""
    limit = proto_limit()
    if all(w.HasField("raw_data") for w in weights):
        payload = sum(
            int(np.prod(w.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(w.data_type).itemsize
            for w in weights
        )
        if payload > limit:  # the serialized tensors hold at least these bytes
            return True
        if payload < limit - _FIELDS_SLACK:
            return False
    return sum(w.ByteSize() for w in weights) > limit


def calibration_session(
    aug: augment.Augmented, providers: Sequence[Any], level: ort.GraphOptimizationLevel
) -> ort.InferenceSession:
    """The session over the calibration model; its large weights go in as external initializers."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.log_severity_level = 3
    # no spin-waiting between ops: on a loaded host ORT's spinning threads took the CPU that the Python
    # work between runs needs; same threads and work split, so the same values
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if _weights_past_limit(aug.weights):  # past 2 GiB: no packed copy of weights
        opts.add_session_config_entry("session.disable_prepacking", "1")
    session_folder(opts, aug.model)  # a lazily loaded model: ORT maps its weights from their files
    try:
        if aug.weights:
            arrays = [numpy_helper.to_array(w) for w in aug.weights]
            opts.add_external_initializers(
                [w.name for w in aug.weights], [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
            )
        sess = ort.InferenceSession(aug.model.SerializeToString(), opts, providers=list(providers))
    except Exception as e:  # ORT raises its own exception types; make it a user-facing error
        first = first_line(e)
        raise CalibrationError(
            f"onnxruntime could not load the model augmented for calibration: {first}"
        ) from e
    sess._zonnx_weights = arrays if aug.weights else None  # ORT may read them for the session's life
    return sess


class BatchFolder:
    """Folds one batch's outputs into the stats (in the caller's thread or the worker thread)."""

    def __init__(
        self, aug: augment.Augmented, stats: dict[str, TensorStats], bins: int, out_names: list[str]
    ) -> None:
        self.aug, self.stats, self.bins = aug, stats, bins
        self.pos = {key: out_names.index(name) for key, name in aug.outputs.items()}
        self.sample_pos = [out_names.index(name) for name in aug.samples]
        self.src_index = {t: i for i, t in enumerate(aug.measured)}

    def __call__(self, res: list[np.ndarray]) -> None:
        sizes = res[self.pos["sizes"]].tolist()
        mins, maxs = res[self.pos["mins"]].tolist(), res[self.pos["maxs"]].tolist()
        ok = [
            self.stats[t].update_extrema(mins[i], maxs[i], sizes[i]) for i, t in enumerate(self.aug.measured)
        ]
        if "sums" in self.pos:
            sums, sumsqs = res[self.pos["sums"]].tolist(), res[self.pos["sumsqs"]].tolist()
            for i, t in enumerate(self.aug.measured):
                if ok[i]:
                    self.stats[t].update_moments(sizes[i], sums[i], sumsqs[i])
        for t, d in self.aug.derived.items():
            i = self.src_index[d.source]
            lo, hi = mins[i], maxs[i]
            if d.kind == "relu":
                lo, hi = (max(lo, 0.0), max(hi, 0.0)) if lo == lo and hi == hi else (lo, hi)
            self.stats[t].update_extrema(lo, hi, sizes[i])
        for i, (t, pos) in enumerate(zip(self.aug.measured, self.sample_pos, strict=False)):
            if ok[i]:
                st = self.stats[t]
                if st.hist is None:
                    st.hist = GridHistogram(self.bins)
                st.hist.add(res[pos], mins[i], maxs[i])

    def finish(self) -> None:
        """Give derived tensors their histogram and (for value-preserving ops) moments."""
        for t, d in self.aug.derived.items():
            src, st = self.stats[d.source], self.stats[t]
            if src.hist is not None and src.hist.counts is not None:
                st.hist = src.hist.relu() if d.kind == "relu" else src.hist.copy()
            if d.kind == "same" and src.has_moments:
                st.moment_count, st.mean, st.m2 = src.moment_count, src.mean, src.m2


class _Worker(threading.Thread):
    def __init__(self, update: BatchFolder) -> None:
        super().__init__(name="zonnx-calibration", daemon=True)
        self.update = update
        self.q: queue.Queue[list[np.ndarray] | None] = queue.Queue(maxsize=2)
        self.error: BaseException | None = None

    def run(self) -> None:
        while (item := self.q.get()) is not None:
            if self.error is None:
                try:
                    self.update(item)
                except BaseException as e:  # noqa: BLE001 - handed back to the caller's thread
                    self.error = e

    def finish(self) -> None:
        self.q.put(None)
        self.join()


def collect(
    model: ModelLike,
    tensor_names: Sequence[str],
    reader: Any,
    *,
    methods_needed: Iterable[str | Enum] = ("minmax",),
    providers: Sequence[Any] = ("CPUExecutionProvider",),
    progress: Callable[[int], None] | None = None,
    bins: int = DEFAULT_BINS,
    hist_sample: int | None = DEFAULT_HIST_SAMPLE,
    averaging_constant: float = 0.01,
    momentum: float = 0.9,
    optimization_level: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    threads: bool | None = None,
    batch: int = 1,
) -> dict[str, TensorStats]:
    """Run every calibration batch once through one session and return each tensor's ``TensorStats``.

    Options: ``methods_needed`` (names or enums: histograms are collected only for histogram methods,
    moments only for ``nstd``; default minmax); ``providers`` (CPU); ``progress(batch_index)`` after
    each batch; ``bins`` (2048); ``hist_sample`` (values per tensor and batch in the histogram, 16384;
    None counts every value); ``averaging_constant`` (ORT moving average, 0.01); ``momentum`` (Compass
    ``mean``, 0.9); ``optimization_level`` (ORT_ENABLE_ALL); ``threads`` (histogram updates in a
    worker thread; default: when histograms are collected); ``batch`` (samples per ORT run when the
    model allows it, ``batching``; 1 runs one at a time). Problems with the reader's data raise
    ``CalibrationError`` naming the sample and input.
    """
    if hist_sample is not None and hist_sample < 1:
        raise CalibrationError(f"hist_sample must be >= 1 or None, got {hist_sample}.")
    proto = to_proto(model)
    need = requirements(methods_needed)
    aug = augment.build(proto, tensor_names, need, sample=hist_sample is not None, per_sample=batch > 1)
    size = batching.make_batched(aug, batch)
    if batch > 1 and size == 1:  # the plain layout, as without batching
        aug = augment.build(proto, tensor_names, need, sample=hist_sample is not None)
    stats = {
        t: TensorStats(t, averaging_constant=averaging_constant, momentum=momentum)
        for t in dict.fromkeys(tensor_names)
    }
    sess = calibration_session(aug, providers, optimization_level)
    aug.weights = []  # the session holds what it needs; the model is kept only for the first steps
    if aug.steps_input is None:
        aug.model = None
    steps = None
    out_names = [o.name for o in sess.get_outputs()]
    update = BatchFolder(aug, stats, bins, out_names)
    use_thread = threads if threads is not None else "histogram" in need
    worker = _Worker(update) if use_thread else None
    if worker is not None:
        worker.start()

    def plain() -> ort.InferenceSession:
        return calibration_session(
            augment.build(proto, tensor_names, need, sample=hist_sample is not None),
            providers,
            optimization_level,
        )

    runner = batching.BatchRunner(sess, out_names, aug, size, plain)
    b = 0
    try:
        for group in runner.groups(validated(reader, proto)):
            if aug.steps_input is not None and steps is None:  # first batch: sizes from shape inference
                steps = first_steps(aug, group[0], hist_sample)
                aug.model = None
            for res in runner.run(group, steps, b):
                if steps is not None:
                    steps = sample_steps(res[update.pos["sizes"]], hist_sample)
                if worker is None:
                    update(res)
                elif worker.error is None:
                    worker.q.put(res)
                else:
                    break
                del res
                if progress is not None:
                    progress(b)
                b += 1
            if worker is not None and worker.error is not None:
                break
    finally:
        if worker is not None:
            worker.finish()
    if worker is not None and worker.error is not None:
        raise worker.error
    update.finish()
    logger.info(
        "calibrated %d tensors (%d measured) for %s", len(stats), len(aug.measured), ", ".join(sorted(need))
    )
    return stats
