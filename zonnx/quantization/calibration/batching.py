"""Batched calibration runs: N samples in one ORT run, each sample's statistics still its own.

Samples of one image each (every input's leading dim 1) run one at a time; ORT may run a batch of 8 at a
higher throughput (for small inputs: fewer per-run costs; for 224x224 CNNs on a 2-core host it was
slower, hence ``CalibBatch`` 1 by default). ``make_batched`` turns the calibration
model (built with ``augment.build(..., per_sample=True)``) into one that takes N samples stacked along
axis 0 when the graph allows it:

- every graph input's leading dim (a fixed 1 or symbolic) becomes the symbol ``zonnx_batch``;
- a Reshape whose constant shape starts with 1 while its data input starts with the batch gets 0 there
  ("copy the input's dim"), on a new initializer;
- no moments are collected: a sum over a row of a batch and over a lone sample may add in another
  order (extrema and histogram samples only select values, so they cannot differ);
- after shape inference every measured tensor must have the shape [zonnx_batch, static dims...]: each
  sample's part of it is then one row of the per-sample layout, of the same size for every sample
  (histogram sampling steps do not change within a batch). Otherwise the model runs one sample at a
  time and the reason is logged at info.

The batch size is the smaller of the requested one and ``MEMORY_BUDGET`` / (bytes of the measured
tensors of one sample). ``BatchRunner`` stacks consecutive samples of equal input shapes, each of leading
dim 1, and splits each
run's outputs back into the unbatched layout, one list per sample, which the collector folds in sample
order exactly as it folds single runs. The first batch of 2 or more samples is checked: its first and
last samples run alone too, and every output must be equal bit for bit; if not (or if a batched run
fails), every later sample runs alone (logged at info: those statistics are the single runs'). A sample
whose leading dim is not 1 (a model with a symbolic batch) runs alone through a session over the plain
calibration model, made when the first such sample comes: its statistics are then the unbatched ones.
"""

from __future__ import annotations

__all__ = ["BATCH_SYMBOL", "MEMORY_BUDGET", "BatchRunner", "make_batched"]

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from zonnx.errors import first_line
from zonnx.quantization.calibration.augment import Augmented
from zonnx.quantization.calibration.readers import CalibrationError

logger = logging.getLogger(__name__)

BATCH_SYMBOL = "zonnx_batch"
#: Bytes of measured tensors a batch may hold (the batch size shrinks to fit).
MEMORY_BUDGET = 256 << 20
_FLOAT_BYTES = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.DOUBLE: 8, onnx.TensorProto.FLOAT16: 2}

Feed = dict[str, np.ndarray]


def _dims(vi: onnx.ValueInfoProto) -> list[int | str | None]:
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
        for d in vi.type.tensor_type.shape.dim
    ]


def _reshape_rewrites(model: onnx.ModelProto, shapes: dict[str, list[Any]]) -> int:
    """Give each Reshape of a batch-led tensor to a constant [1, ...] shape a [0, ...] shape instead."""
    inits = {t.name: t for t in model.graph.initializer}
    changed = 0
    for node in model.graph.node:
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        if any(a.name == "allowzero" and a.i for a in node.attribute):
            continue
        data, shape = shapes.get(node.input[0]), inits.get(node.input[1])
        if not data or data[0] != BATCH_SYMBOL or shape is None:
            continue
        value = numpy_helper.to_array(shape)
        if value.ndim != 1 or value.size == 0 or value[0] != 1:
            continue
        value = value.copy()
        value[0] = 0
        name = f"{node.input[1]}_{BATCH_SYMBOL}"
        if name not in inits:
            inits[name] = numpy_helper.from_array(value, name)
            model.graph.initializer.append(inits[name])
        node.input[1] = name
        changed += 1
    return changed


def make_batched(aug: Augmented, batch: int) -> int:
    """Make ``aug.model`` (per-sample layout) take stacked samples; return the batch size (1: cannot).

    Implements the rules of the module docstring; ``aug.model`` is replaced only when batching applies.
    """
    if batch <= 1:
        return 1
    if "sums" in aug.outputs:
        logger.info(
            "calibration runs one sample at a time: moments (sums) depend on ORT's summation order, "
            "which differs between a batch and a single sample"
        )
        return 1
    model = onnx.ModelProto()
    model.CopyFrom(aug.model)  # large weights are placeholders here: a small copy
    inits = {t.name for t in model.graph.initializer}
    fed = [vi for vi in model.graph.input if vi.name not in inits and vi.name != aug.steps_input]
    for vi in fed:
        dims = vi.type.tensor_type.shape.dim
        if not vi.type.HasField("tensor_type") or not dims or dims[0].dim_value not in (0, 1):
            logger.info("calibration runs one sample at a time: input %r has a fixed batch above 1", vi.name)
            return 1
        dims[0].Clear()
        dims[0].dim_param = BATCH_SYMBOL
    try:
        for _ in range(4):  # a rewritten Reshape can make a later one batch-led
            inferred = onnx.shape_inference.infer_shapes(model)
            g = inferred.graph
            shapes = {vi.name: _dims(vi) for vi in [*g.input, *g.value_info, *g.output]}
            elems = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.input, *g.value_info]}
            if not _reshape_rewrites(model, shapes):
                break
    except Exception as e:  # noqa: BLE001 - batching is only a speed-up; say why it is off
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        logger.info("calibration runs one sample at a time: shape inference failed (%s)", first)
        return 1
    per_sample = 0
    for t in aug.measured:
        dims = shapes.get(t)
        if not dims or dims[0] != BATCH_SYMBOL or not all(isinstance(d, int) for d in dims[1:]):
            logger.info(
                "calibration runs one sample at a time: tensor %r has shape %s, not [batch, fixed dims]",
                t,
                dims,
            )
            return 1
        per_sample += int(np.prod(dims[1:], dtype=np.int64)) * _FLOAT_BYTES.get(elems.get(t, 0), 4)
    size = max(1, min(batch, MEMORY_BUDGET // max(per_sample, 1)))
    if size > 1:
        aug.model = model
        logger.info("calibration runs batches of %d samples", size)
    return size


def _same_shapes(a: Feed, b: Feed) -> bool:
    return all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype for k in a)


def _one_sample(feed: Feed) -> bool:
    """Every input has leading dim 1 (so the feed is one row of a batch)."""
    return all(v.ndim > 0 and v.shape[0] == 1 for v in feed.values())


def _groups(feeds: Iterable[Feed], size: int) -> Iterator[list[Feed]]:
    """Consecutive feeds of equal input shapes and dtypes, at most ``size`` at a time."""
    group: list[Feed] = []
    for feed in feeds:
        alone = not _one_sample(feed)
        if group and (alone or len(group) == size or not _same_shapes(group[0], feed)):
            yield group
            group = []
        group.append(feed)
        if alone:
            yield group
            group = []
    if group:
        yield group


class BatchRunner:
    """Runs samples through a calibration session in batches and returns per-sample output lists."""

    def __init__(
        self, sess: Any, out_names: list[str], aug: Augmented, size: int, plain: Callable[[], Any]
    ) -> None:
        """``plain()`` makes the session over the plain calibration model (for samples of batch > 1)."""
        self.sess, self.out_names, self.size = sess, out_names, size
        self.plain, self.plain_sess = plain, None
        self.batched = size > 1
        self.checked = False
        self.sizes_pos = out_names.index(aug.outputs["sizes"])
        self.steps_input = aug.steps_input

    def groups(self, feeds: Iterable[Feed]) -> Iterator[list[Feed]]:
        """The feeds cut into the groups ``run`` takes (single feeds when not batched)."""
        return _groups(feeds, self.size if self.batched else 1)

    def _call(self, sess: Any, feed: Feed, index: int) -> list[np.ndarray]:
        try:
            return sess.run(self.out_names, feed)
        except Exception as e:  # ORT's own exception types
            msg = first_line(e)
            raise CalibrationError(f"calibration sample {index}: onnxruntime failed: {msg}") from e

    def _rows(self, res: list[np.ndarray]) -> list[list[np.ndarray]]:
        """A run's per-sample outputs in the unbatched layout (sizes: one size per tensor)."""
        sizes = res[self.sizes_pos][1::2]
        n = int(res[self.sizes_pos][0])  # the batch: leading dim of the first measured tensor
        return [[sizes if k == self.sizes_pos else r[i] for k, r in enumerate(res)] for i in range(n)]

    def _single(self, feed: Feed, steps: np.ndarray | None, index: int) -> list[np.ndarray]:
        one = _one_sample(feed)
        if steps is not None:
            feed = {**feed, self.steps_input: steps}
        if self.size == 1:
            return self._call(self.sess, feed, index)
        if one:
            return self._rows(self._call(self.sess, feed, index))[0]
        if self.plain_sess is None:
            logger.info("calibration sample %d has a batch above 1: it runs through the plain model", index)
            self.plain_sess = self.plain()
        return self._call(self.plain_sess, feed, index)

    def run(self, group: list[Feed], steps: np.ndarray | None, first: int) -> list[list[np.ndarray]]:
        """Outputs of samples ``first``.. (``group``), each as a single run's; ``steps`` for all of them."""
        if len(group) == 1 or not self.batched:
            return [self._single(f, steps, first + i) for i, f in enumerate(group)]
        stacked = {k: np.concatenate([f[k] for f in group], axis=0) for k in group[0]}
        if steps is not None:
            stacked[self.steps_input] = steps
        try:
            rows = self._rows(self.sess.run(self.out_names, stacked))
        except Exception as e:  # noqa: BLE001 - the single runs say which sample fails, if any
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            logger.info("calibration: a batched run failed (%s); running one sample at a time", first_line)
            self.batched = False
            return [self._single(f, steps, first + i) for i, f in enumerate(group)]
        if not self.checked:
            self.checked = True
            ends = {0: self._single(group[0], steps, first), len(group) - 1: None}
            ends[len(group) - 1] = self._single(group[-1], steps, first + len(group) - 1)
            bad = next(
                (
                    self.out_names[k]
                    for i, single in ends.items()
                    for k in range(len(single))
                    if not _identical(single[k], rows[i][k])
                ),
                None,
            )
            if bad is not None:
                logger.info(
                    "calibration: a batch of %d gives other values than single runs (output %r); "
                    "running one sample at a time",
                    len(group),
                    bad,
                )
                self.batched = False
                middle = [self._single(f, steps, first + i) for i, f in enumerate(group[1:-1], 1)]
                return [ends[0], *middle, ends[len(group) - 1]]
        return rows


def _identical(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bytes (NaN payloads included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
