"""Tensors of a model on fixed feeds, computed a stretch of the graph at a time and reused until what they
depend on changes.

Two recovery steps walk a model layer by layer and need values of the model *as it is being changed*: fast
finetune (each layer's input in the quantized model after the earlier layers were tuned) and sequential
bias correction (the channel means of a level's layers after the previous levels were corrected). A full
run per request repeats the whole upstream graph every time; ``GraphRuns`` runs a node again only when a
value it depends on changed.

Rules.

- *Valid*: a node's outputs stay valid until a value it reads, directly or not, changes: ``invalidate``
  with the names of the changed initializers or tensors (``set_initializer`` replaces one and invalidates
  its readers). A node reads its inputs and the outer-scope names of its If/Loop bodies
  (``backend.graph_reads.node_reads``).
- *Request*: ``tensors`` (values) or ``means`` (per-channel means of layer outputs). It runs, in one ORT
  session of just those nodes (``open_session``), the nodes the requested tensors need that are not valid
  or whose outputs were not kept, fed with the kept values at the cut, the model's inputs and the current
  initializers. ``means`` always runs the producers of its tensors (they are the layers being measured);
  ``tensors`` returns a kept value without running anything.
- *Constant nodes* (reading only initializers: a weight's or bias's quantizer, Constant) are never kept:
  ORT folds them, so their outputs cannot be fetched. Every run carries the ones it needs, so a changed
  weight is seen by the next run that reads it.
- *Kept*: a run keeps the tensors it produced that a node outside it reads, that a later request names
  (``wanted``, a count per name), or that a layer to be measured again reads (``layers``, ``corrected``).
  A kept value is dropped once every node that reads it is valid and is not to run again, and no request
  names it any more: memory holds the graph's frontier times the number of feeds, never every activation.
"""

from __future__ import annotations

__all__ = ["GraphRuns", "initializer_override"]

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from zonnx.backend.graph_reads import node_reads
from zonnx.errors import VerificationError, first_line
from zonnx.quantization.recovery.channel_means import add_channel_means, channel_mean_name

#: Opens the ORT session of one run's model (session options, providers, and the error that names it).
SessionOpener = Callable[[onnx.ModelProto], ort.InferenceSession]


class GraphRuns:
    """Values of ``model``'s tensors on ``feeds``, kept and reused across requests (module docstring).

    ``what`` names the model in errors ("quantized model"); ``wanted``: every tensor ``tensors`` will be
    asked for, once per request; ``layers``: first output names of the layers ``means`` measures twice.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        feeds: Sequence[Mapping[str, np.ndarray]],
        open_session: SessionOpener,
        *,
        what: str = "model",
        wanted: Iterable[str] = (),
        layers: Iterable[str] = (),
    ) -> None:
        self.feeds = [dict(f) for f in feeds]
        self.open_session = open_session
        self.what = what
        self.wanted = Counter(wanted)
        self.rerun = set(layers)  # layers still to run after their correction
        self.pending: set[str] = set()  # corrected layers not run since
        self.kept: dict[str, list[np.ndarray]] = {}
        self.valid: set[str] = set()  # first output names of nodes whose outputs are current
        self.runs = 0
        self.last_nodes = 0  # nodes the last run ran, not counting the constant ones
        self.set_model(model)
        missing = [(k, name) for name in self.inputs for k, f in enumerate(self.feeds) if name not in f]
        if missing:
            raise VerificationError(f"feed {missing[0][0]} has no input {missing[0][1]!r} of the {what}.")

    def set_model(self, model: onnx.ModelProto) -> None:
        """Take a model whose nodes and tensor names are those of the previous one, with changed
        initializers or attributes: what those changes reach must be ``invalidate``-d by the caller."""
        self.model = model
        graph = model.graph
        self.nodes = list(graph.node)
        self.reads = [node_reads(node) for node in self.nodes]
        self.producer: dict[str, int] = {}
        self.readers: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for name in node.output:
                if name:
                    self.producer[name] = i
            for name in self.reads[i]:
                self.readers.setdefault(name, []).append(i)
        self.initializers = {t.name: t for t in graph.initializer}
        self.inputs = {v.name: v for v in graph.input if v.name not in self.initializers}
        self.constant: set[int] = set()
        constant_values = set(self.initializers)
        for i, node in enumerate(self.nodes):
            if all(n in constant_values for n in self.reads[i]):
                self.constant.add(i)
                constant_values.update(node.output)

    def _key(self, i: int) -> str:
        return self.nodes[i].output[0]

    def invalidate(self, names: Iterable[str]) -> None:
        """Every node that reads ``names`` (initializers or tensors), directly or not, is no longer valid."""
        todo = [i for name in names for i in self.readers.get(name, ())]
        seen: set[int] = set()
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            self.valid.discard(self._key(i))
            for out in self.nodes[i].output:
                self.kept.pop(out, None)
                todo.extend(self.readers.get(out, ()))

    def set_initializer(self, tensor: onnx.TensorProto) -> None:
        """Replace an initializer (by ``tensor.name``); the nodes that read it run again when needed."""
        if tensor.name not in self.initializers:
            raise KeyError(tensor.name)
        self.initializers[tensor.name] = tensor
        self.invalidate([tensor.name])

    def corrected(self, changed: Iterable[str], layers: Iterable[str], measured: Iterable[str]) -> None:
        """Of the ``measured`` layers (their output names), ``layers`` were corrected by changing the
        initializers ``changed`` (the current model already holds the new values); the others are final."""
        layers = set(layers)
        self.invalidate(changed)
        self.pending |= layers
        self.rerun -= set(measured) - layers

    def tensors(self, names: Sequence[str]) -> dict[str, list[np.ndarray]]:
        """Each of ``names`` on every feed: kept values as they are, the others computed."""
        for name in names:
            if name not in self.producer and name not in self.inputs:
                raise KeyError(f"no node of the {self.what} produces {name!r}")
            if name in self.producer and self.producer[name] in self.constant:
                raise KeyError(f"{name!r} is constant in the {self.what} (ORT folds it)")
        todo = [n for n in names if n in self.producer and not self._current(n)]
        if todo:
            self._run(self._needed([self.producer[n] for n in todo]), set(todo), {})
        out = {n: (self.kept[n] if n in self.kept else [np.asarray(f[n]) for f in self.feeds]) for n in names}
        self.wanted.subtract(set(names))
        self.wanted = +self.wanted  # forget names with no request left
        self._drop_unneeded()
        return out

    def means(self, tensors: Mapping[str, int]) -> dict[str, np.ndarray]:
        """Per-sample channel means ``[samples, C]`` of ``tensors`` (name -> rank, channels on axis 1);
        their producers always run (they are the layers being measured)."""
        rows = self._run(self._needed([self.producer[t] for t in tensors]), set(), tensors)
        self._drop_unneeded()
        return {t: np.stack([np.asarray(v, np.float64).reshape(-1) for v in rows[t]]) for t in tensors}

    # ------------------------------------------------------------------------------------ internals

    def _current(self, name: str) -> bool:
        return name in self.kept and self._key(self.producer[name]) in self.valid

    def _needed(self, start: list[int]) -> set[int]:
        """Nodes to run: ``start`` and, upstream, every node that is constant, not valid, or whose outputs
        were not kept."""
        todo: set[int] = set()
        stack = list(start)
        while stack:
            i = stack.pop()
            if i in todo:
                continue
            todo.add(i)
            for name in self.reads[i]:
                p = self.producer.get(name)
                if p is None or (p not in self.constant and self._current(name)):
                    continue
                stack.append(p)
        for i in todo:
            for name in self.reads[i]:
                if name not in self.producer and name not in self.initializers and name not in self.inputs:
                    raise VerificationError(f"tensor {name!r} has no producer in the {self.what}.")
        return todo

    def _keeps(self, out: str, todo: set[int], requested: set[str]) -> bool:
        """Whether a run over ``todo`` keeps its output ``out`` (module docstring)."""
        if out in requested or out in self.wanted:
            return True
        return any(r not in todo or self._key(r) in self.rerun for r in self.readers.get(out, ()))

    def _run(
        self, todo: set[int], requested: set[str], tensors: Mapping[str, int]
    ) -> dict[str, list[np.ndarray]]:
        """Run the nodes ``todo`` on every feed; returns the means of ``tensors`` per sample."""
        order = sorted(todo)
        produced = {out for i in order for out in self.nodes[i].output if out}
        cut = sorted(
            {n for i in order for n in self.reads[i] if n not in produced and n not in self.initializers}
        )
        keep = sorted(
            out
            for i in order
            if i not in self.constant
            for out in self.nodes[i].output
            if out and self._keeps(out, todo, requested)
        )
        session = self.open_session(self._model_of(order, cut, keep, tensors))
        names = [channel_mean_name(t) for t in tensors] + keep
        rows: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
        fresh: dict[str, list[np.ndarray]] = {k: [] for k in keep}
        for s, feed in enumerate(self.feeds):
            inputs = {n: (self.kept[n][s] if n in self.kept else np.asarray(feed[n])) for n in cut}
            try:
                values = session.run(names, inputs)
            except Exception as e:  # ORT's exception classes share no public base
                raise VerificationError(
                    f"sample {s}: the {self.what} failed to run ({first_line(e)})."
                ) from None
            for t, v in zip(tensors, values[: len(tensors)], strict=True):
                rows[t].append(v)
            for k, v in zip(keep, values[len(tensors) :], strict=True):
                fresh[k].append(v)
        self.runs += 1
        self.last_nodes = sum(1 for i in order if i not in self.constant)
        self.kept.update(fresh)
        self.valid.update(self._key(i) for i in order)
        done = {k for k in self.pending if k in self.valid}
        self.pending -= done
        self.rerun -= done
        return rows

    def _model_of(
        self, order: list[int], cut: list[str], keep: list[str], tensors: Mapping[str, int]
    ) -> onnx.ModelProto:
        """The nodes ``order`` with ``cut`` as inputs, the means of ``tensors`` and ``keep`` as outputs."""
        graph = helper.make_graph([self.nodes[i] for i in order], "zonnx_graph_run", [], [])
        for name in cut:
            if name in self.inputs:
                graph.input.append(self.inputs[name])
            else:
                elem = helper.np_dtype_to_tensor_dtype(np.asarray(self.kept[name][0]).dtype)
                graph.input.append(helper.make_tensor_value_info(name, elem, None))
        used = {n for i in order for n in self.reads[i] if n in self.initializers}
        graph.initializer.extend(self.initializers[n] for n in sorted(used))
        model = helper.make_model(
            graph, opset_imports=list(self.model.opset_import), ir_version=self.model.ir_version
        )
        model.functions.extend(self.model.functions)
        add_channel_means(model, tensors)
        model.graph.output.extend(onnx.ValueInfoProto(name=k) for k in keep)
        return model

    def _drop_unneeded(self) -> None:
        """Drop kept values no later request can read (module docstring)."""
        for name in list(self.kept):
            if name in self.wanted:
                continue
            readers = self.readers.get(name, ())
            if all(self._key(r) in self.valid and self._key(r) not in self.rerun for r in readers):
                del self.kept[name]


def initializer_override(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> None:
    """Replace the named initializers of ``model`` in place with ``values``."""
    for i, init in enumerate(model.graph.initializer):
        if init.name in values:
            model.graph.initializer[i].CopyFrom(
                numpy_helper.from_array(np.asarray(values[init.name]), init.name)
            )
