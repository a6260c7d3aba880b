"""Per-channel means of a model's tensors, level after level, recomputing only what changed in between.

Sequential bias correction measures one level of layers, corrects their biases, and measures the next
level on the corrected model. A full run per level repeats the whole upstream graph every time; here
each node runs again only when something it depends on changed.

Rule: a node's outputs stay valid until a value it (transitively) reads is changed (``invalidate``, with
the names of the changed initializers). A request runs, in a session of just those nodes, the nodes the
requested tensors need that are not valid, fed with the kept values of valid tensors at the cut, the
model's inputs, and the current initializers. Values kept for later are the tensors a run produced
that a node outside it reads, and the inputs of the ``layers`` (each runs once to be measured and once
more after its own correction); a kept value is dropped once every node that reads it is valid and is
not a layer still to run again.

Each run uses the session options of ``channel_means.ChannelProbe`` (basic optimizations: the model runs
as written, fake quantization in float), so the means are those a full run gives, up to the order of
float additions ORT picks for a different graph.
"""

from __future__ import annotations

__all__ = ["LevelRuns", "initializer_override"]

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from zonnx.backend.graph_reads import node_reads
from zonnx.errors import VerificationError, first_line
from zonnx.quantization.recovery.channel_means import add_channel_means, channel_mean_name, probe_session


class LevelRuns:
    """Channel means of ``model``'s tensors on ``feeds``, kept and reused across requests (module docstring)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        feeds: Sequence[Mapping[str, np.ndarray]],
        *,
        layers: Iterable[str] = (),
        providers: Sequence[str] = ("CPUExecutionProvider",),
    ) -> None:
        self.feeds = [dict(f) for f in feeds]
        self.providers = list(providers)
        self.rerun = set(layers)  # first output names of layers still to run after their correction
        self.pending: set[str] = set()  # corrected layers not run since
        self.kept: dict[str, list[np.ndarray]] = {}
        self.valid: set[str] = set()  # first output names of nodes whose outputs are current
        self.runs = 0
        self.last_nodes = 0  # nodes the last request ran, not counting the constant ones
        self.set_model(model)

    def set_model(self, model: onnx.ModelProto) -> None:
        """Take a model whose nodes and tensor names are those of the previous one, with changed
        initializers or attributes: what those changes reach must be ``invalidate``-d by the caller."""
        self.model = model
        graph = model.graph
        self.nodes = list(graph.node)
        self.reads = [node_reads(node) for node in self.nodes]  # outer-scope names of bodies too
        self.producer: dict[str, int] = {}
        self.readers: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for name in node.output:
                if name:
                    self.producer[name] = i
            for name in self.reads[i]:
                if name:
                    self.readers.setdefault(name, []).append(i)
        self.initializers = {t.name: t for t in graph.initializer}
        self.inputs = {v.name: v for v in graph.input if v.name not in self.initializers}
        # nodes that read only initializers (a weight's or bias's quantizer): ORT folds them, so their
        # outputs cannot be fetched; they run again in every request that needs them
        self.constant: set[int] = set()
        constant_values = set(self.initializers)
        for i, node in enumerate(self.nodes):
            if all(not n or n in constant_values for n in self.reads[i]):
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

    def means(self, tensors: Mapping[str, int]) -> dict[str, np.ndarray]:
        """Per-sample channel means ``[samples, C]`` of ``tensors`` (name -> rank, channels on axis 1);
        their producers always run (they are the layers being measured)."""
        todo = self._needed(tensors)
        order = sorted(todo)
        produced = {out for i in order for out in self.nodes[i].output if out}
        cut = sorted(
            {
                n
                for i in order
                for n in self.reads[i]
                if n and n not in produced and n not in self.initializers
            }
        )
        keep = sorted(
            out
            for i in order
            if i not in self.constant
            for out in self.nodes[i].output
            if out and any(r not in todo or self._key(r) in self.rerun for r in self.readers.get(out, ()))
        )
        session = self._session(order, cut, keep, tensors)
        names = [channel_mean_name(t) for t in tensors] + keep
        rows: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
        fresh: dict[str, list[np.ndarray]] = {k: [] for k in keep}
        for s, feed in enumerate(self.feeds):
            inputs = {n: (self.kept[n][s] if n in self.kept else np.asarray(feed[n])) for n in cut}
            try:
                values = session.run(names, inputs)
            except Exception as e:  # ORT's exception classes share no public base
                raise VerificationError(
                    f"sample {s}: the quantized model failed to run ({first_line(e)})."
                ) from None
            for t, v in zip(tensors, values[: len(tensors)], strict=True):
                rows[t].append(np.asarray(v, np.float64).reshape(-1))
            for k, v in zip(keep, values[len(tensors) :], strict=True):
                fresh[k].append(v)
        self.runs += 1
        self.last_nodes = sum(1 for i in order if i not in self.constant)
        self.kept.update(fresh)
        self.valid.update(self._key(i) for i in order)
        done = {k for k in self.pending if k in self.valid}
        self.pending -= done
        self.rerun -= done
        self._drop_unneeded()
        return {t: np.stack(v) for t, v in rows.items()}

    def _needed(self, tensors: Mapping[str, int]) -> set[int]:
        """Nodes to run: the producers of ``tensors`` and, upstream, every node that is not valid or whose
        outputs were not kept."""
        todo: set[int] = set()
        stack = [self.producer[t] for t in tensors]
        while stack:
            i = stack.pop()
            if i in todo:
                continue
            todo.add(i)
            for name in self.reads[i]:
                p = self.producer.get(name)
                if p is None or (p not in self.constant and name in self.kept and self._key(p) in self.valid):
                    continue
                stack.append(p)
        for i in todo:
            for name in self.reads[i]:
                if (
                    name
                    and name not in self.producer
                    and name not in self.initializers
                    and name not in self.inputs
                ):
                    raise VerificationError(f"tensor {name!r} has no producer in the quantized model.")
        return todo

    def _session(self, order: list[int], cut: list[str], keep: list[str], tensors: Mapping[str, int]):
        """An ORT session of the nodes ``order`` with ``cut`` as inputs and the means and ``keep`` as outputs."""
        graph = helper.make_graph([self.nodes[i] for i in order], "level_run", [], [])
        for name in cut:
            if name in self.inputs:
                graph.input.append(self.inputs[name])
            else:
                sample = np.asarray(self.kept[name][0])
                elem = helper.np_dtype_to_tensor_dtype(sample.dtype)
                graph.input.append(helper.make_tensor_value_info(name, elem, None))
        used = {n for i in order for n in self.reads[i] if n in self.initializers}
        graph.initializer.extend(self.initializers[n] for n in sorted(used))
        model = helper.make_model(
            graph, opset_imports=list(self.model.opset_import), ir_version=self.model.ir_version
        )
        model.functions.extend(self.model.functions)
        add_channel_means(model, tensors)
        model.graph.output.extend(onnx.ValueInfoProto(name=k) for k in keep)
        return probe_session(model, self.providers, "quantized model")

    def _drop_unneeded(self) -> None:
        """Drop kept values no later request can read (module docstring)."""
        for name in list(self.kept):
            readers = self.readers.get(name, ())
            if all(self._key(r) in self.valid and self._key(r) not in self.rerun for r in readers):
                del self.kept[name]

    def corrected(self, changed: Iterable[str], layers: Iterable[str], measured: Iterable[str]) -> None:
        """Of the ``measured`` layers (their output names), ``layers`` were corrected by changing the
        initializers ``changed`` (the current model already holds the new values); the others are final."""
        layers = set(layers)
        self.invalidate(changed)
        self.pending |= layers
        self.rerun -= set(measured) - layers


def initializer_override(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> None:
    """Replace the named initializers of ``model`` in place with ``values``."""
    for i, init in enumerate(model.graph.initializer):
        if init.name in values:
            model.graph.initializer[i].CopyFrom(
                numpy_helper.from_array(np.asarray(values[init.name]), init.name)
            )

