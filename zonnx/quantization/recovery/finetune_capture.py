"""Layer inputs and outputs of a model on a fixed set of feeds, computed a stretch of the graph at a time.

Fast finetune needs, layer after layer in topological order, a few tensors of the float model and the
layer input of the *quantized* model as it is after the earlier layers were tuned. Re-running the whole
quantized model for every layer would cost ``layers x model`` runs; instead ``SegmentRunner`` runs the
graph once, in stretches:

- the nodes are taken in graph (topological) order; a request for tensors runs the stretch of nodes
  from where the last request stopped up to the last producer of the requested tensors, as one small
  ONNX model (inputs: the cached tensors it reads; outputs: what it produced that later nodes or
  pending requests read) in its own ORT session, on every feed;
- *constant* nodes (all inputs initializers or other constant nodes: weight quantizers, Constant) are
  never run ahead of time: each stretch carries the constant nodes it needs, so a weight changed with
  ``set_initializer`` after an earlier stretch ran is seen by the stretch that reads it;
- cached tensors are dropped once no later node and no pending request reads them, so memory holds the
  graph's frontier (a few tensors) times the number of feeds, never every activation.

Sessions run with ORT's graph optimizations off, so the tensors are those of the graph as written.
"""

from __future__ import annotations

__all__ = ["SegmentRunner"]

import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from zonnx.backend.graph_reads import node_reads
from zonnx.errors import first_line
from zonnx.quantization.calibration.readers import CalibrationError

logger = logging.getLogger(__name__)


class SegmentRunner:
    """Computes requested tensors of ``model`` on ``feeds``, running each node once (see module doc).

    ``wanted``: every tensor that will be requested, once per request (a tensor two layers read is
    listed twice), so none is dropped before its last request; ``threads``: ORT intra-op threads.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        feeds: Sequence[Mapping[str, np.ndarray]],
        wanted: Iterable[str] = (),
        *,
        threads: int = 1,
    ) -> None:
        self._model = model
        self._feeds = [dict(f) for f in feeds]
        graph = model.graph
        self._nodes = list(graph.node)
        self._inits = {t.name: t for t in graph.initializer}
        self._producer: dict[str, int] = {}
        self._reads: list[set[str]] = []
        self._const: list[bool] = []
        const_values = set(self._inits)
        for i, node in enumerate(self._nodes):
            reads = set(node_reads(node))
            self._reads.append(reads)
            is_const = reads <= const_values
            self._const.append(is_const)
            for out in node.output:
                if out:
                    self._producer[out] = i
                    if is_const:
                        const_values.add(out)
        # last non-constant reader of each value, to drop cached tensors nobody reads any more
        self._last_read: dict[str, int] = {}
        for i, reads in enumerate(self._reads):
            if not self._const[i]:
                for x in reads:
                    self._last_read[x] = i
        self._pending = Counter(wanted)
        self._done = -1  # index of the last non-constant node already run
        inputs = {v.name for v in graph.input} - set(self._inits)
        self._cache: dict[str, list[np.ndarray]] = {}
        for name in inputs:
            missing = [k for k, f in enumerate(self._feeds) if name not in f]
            if missing:
                raise CalibrationError(f"calibration feed {missing[0]} has no input {name!r} of the model.")
            self._cache[name] = [np.asarray(f[name]) for f in self._feeds]
        self._threads = threads
        self.segments = 0  # stretches run so far (one ORT session each)

    @property
    def held(self) -> list[str]:
        """The tensors held now (graph inputs and outputs of stretches that later nodes still read)."""
        return list(self._cache)

    def set_initializer(self, tensor: onnx.TensorProto) -> None:
        """Replace an initializer (by ``tensor.name``) for the stretches not run yet."""
        if tensor.name not in self._inits:
            raise KeyError(tensor.name)
        self._inits[tensor.name] = tensor

    def fetch(self, names: Sequence[str]) -> dict[str, list[np.ndarray]]:
        """Each requested tensor on every feed (running the graph up to its producers when needed)."""
        todo = [n for n in names if n not in self._cache]
        if todo:
            for name in todo:
                if name not in self._producer:
                    raise KeyError(f"no node produces {name!r}")
                if self._producer[name] <= self._done or self._const[self._producer[name]]:
                    raise KeyError(f"{name!r} is constant or was dropped (request it through `wanted`)")
            self._run_to(max(self._producer[n] for n in todo), set(names))
        out = {name: self._cache[name] for name in names}
        self._pending.subtract(set(names))
        self._pending = +self._pending  # forget names with no request left
        self._drop()
        return out

    # ------------------------------------------------------------------------------------ internals

    def _live(self, name: str, after: int) -> bool:
        return name in self._pending or self._last_read.get(name, -1) > after

    def _drop(self) -> None:
        for name in [n for n in self._cache if not self._live(n, self._done)]:
            del self._cache[name]

    def _run_to(self, stop: int, requested: set[str]) -> None:
        """Run the non-constant nodes in (done, stop] with the constant nodes they need, on every feed."""
        body = [i for i in range(self._done + 1, stop + 1) if not self._const[i]]
        needed_const: set[int] = set()
        stack = [x for i in body for x in self._reads[i]]
        while stack:
            name = stack.pop()
            j = self._producer.get(name)
            if j is not None and self._const[j] and j not in needed_const:
                needed_const.add(j)
                stack.extend(self._reads[j])
        order = sorted(needed_const | set(body))
        produced = {o for i in order for o in self._nodes[i].output if o}
        reads = set().union(*(self._reads[i] for i in order)) if order else set()
        inputs = sorted(x for x in reads - produced if x not in self._inits)
        outputs = sorted(
            o for i in body for o in self._nodes[i].output if o and (o in requested or self._live(o, stop))
        )
        missing = [x for x in inputs if x not in self._cache]
        if missing:
            raise KeyError(f"tensor {missing[0]!r} is needed but was not kept")
        self._done = stop
        if not outputs:
            return
        sess = self._session(order, inputs, outputs, reads)
        results: dict[str, list[np.ndarray]] = {o: [] for o in outputs}
        for k in range(len(self._feeds)):
            values = sess.run(outputs, {x: self._cache[x][k] for x in inputs})
            for o, v in zip(outputs, values, strict=True):
                results[o].append(v)
        self._cache.update(results)
        self.segments += 1

    def _session(
        self, order: list[int], inputs: list[str], outputs: list[str], reads: set[str]
    ) -> ort.InferenceSession:
        src = self._model
        seg = onnx.ModelProto(ir_version=src.ir_version)
        seg.opset_import.extend(src.opset_import)
        seg.functions.extend(src.functions)
        g = seg.graph
        g.name = "zonnx_finetune_segment"
        g.node.extend(self._nodes[i] for i in order)
        g.initializer.extend(self._inits[x] for x in sorted(reads) if x in self._inits)
        for x in inputs:
            dtype = helper.np_dtype_to_tensor_dtype(self._cache[x][0].dtype)
            g.input.append(helper.make_tensor_value_info(x, dtype, None))
        g.output.extend(onnx.ValueInfoProto(name=o) for o in outputs)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.intra_op_num_threads = self._threads
        opts.log_severity_level = 3
        try:
            return ort.InferenceSession(seg.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # ORT's own exception types: make it one user-facing line
            first = first_line(e)
            raise CalibrationError(
                f"onnxruntime could not run a stretch of the model for fast finetune: {first}"
            ) from e
