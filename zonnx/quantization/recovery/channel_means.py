"""Per-channel means of chosen tensors over samples, from ORT runs of a model with ReduceMean outputs added.

For a tensor ``T`` of rank r with channels on axis 1, the probe adds ``ReduceMean(T, axes = all but 1,
keepdims=0)`` as an output, so a run returns ``[C]`` values per tensor instead of the tensor itself
(memory stays at the size of the model's own outputs). Each sample's means are returned (a
``[samples, C]`` array per tensor), so callers can weigh the spread across samples. ``overridable`` initializers are also listed as graph inputs, so a run can feed new values for
them without building a new session (ORT treats such initializers as defaults).
"""

from __future__ import annotations

__all__ = ["ChannelProbe", "add_channel_means", "channel_mean_name", "output_sqnr", "probe_session"]

import math
import os
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from zonnx.errors import VerificationError, first_line
from zonnx.ir.io import default_opset


def channel_mean_name(name: str) -> str:
    """The output name of the per-channel mean of tensor ``name``."""
    return f"{name}__zonnx_channel_mean"


def add_channel_means(model: onnx.ModelProto, tensors: Mapping[str, int]) -> None:
    """Add ``ReduceMean(T, axes = all but 1, keepdims=0)`` of each tensor (name -> rank) as an output."""
    graph = model.graph
    new_axes_input = default_opset(model) >= 18
    for name, rank in tensors.items():
        axes = [0, *range(2, rank)]
        out = channel_mean_name(name)
        if new_axes_input:
            axes_name = f"{out}_axes"
            graph.initializer.append(numpy_helper.from_array(np.asarray(axes, np.int64), axes_name))
            node = helper.make_node("ReduceMean", [name, axes_name], [out], keepdims=0)
        else:
            node = helper.make_node("ReduceMean", [name], [out], axes=axes, keepdims=0)
        graph.node.append(node)
        graph.output.append(onnx.ValueInfoProto(name=out))


def probe_session(model: onnx.ModelProto, providers: Sequence[str], what: str) -> ort.InferenceSession:
    """An ORT session that runs ``model`` as written (basic optimizations: fake quantization in float),
    on ``ZONNX_THREADS`` threads; a model ORT cannot load is one clear error naming ``what``."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.intra_op_num_threads = int(os.environ.get("ZONNX_THREADS", "0"))
    try:
        return ort.InferenceSession(model.SerializeToString(), opts, providers=list(providers))
    except Exception as e:  # ORT's exception classes share no public base
        raise VerificationError(
            f"{what}: onnxruntime cannot load the probe model ({first_line(e)})."
        ) from None


class ChannelProbe:
    """An ORT session of ``model`` that returns its outputs plus the per-channel means of ``tensors``.

    ``tensors`` maps a tensor name to its rank (>= 2; channel axis 1). Runs use ORT with graph
    optimizations off, so the model runs as written (fake quantization in float).
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        tensors: Mapping[str, int],
        *,
        overridable: Iterable[str] = (),
        providers: Sequence[str] = ("CPUExecutionProvider",),
        what: str = "model",
    ) -> None:
        proto = onnx.ModelProto.FromString(model.SerializeToString())
        graph = proto.graph
        self.outputs = [o.name for o in graph.output]
        self.tensors = dict(tensors)
        add_channel_means(proto, self.tensors)
        inits = {i.name: i for i in graph.initializer}
        have = {i.name for i in graph.input}
        for name in overridable:
            if name in inits and name not in have:
                init = inits[name]
                graph.input.append(helper.make_tensor_value_info(name, init.data_type, list(init.dims)))
        self.what = what
        self.session = probe_session(proto, providers, what)
        self._inputs = {i.name for i in self.session.get_inputs()}

    def run(
        self,
        feeds: Sequence[Mapping[str, np.ndarray]],
        overrides: Mapping[str, np.ndarray] | None = None,
        tensors: Sequence[str] | None = None,
        with_outputs: bool = True,
    ) -> tuple[dict[str, np.ndarray], list[list[np.ndarray]]]:
        """Per-sample channel means ``[samples, C]`` of ``tensors`` (default: all), and the model outputs of
        each feed when ``with_outputs``. ORT runs only the nodes the requested values need."""
        wanted = list(self.tensors if tensors is None else tensors)
        names = (self.outputs if with_outputs else []) + [channel_mean_name(n) for n in wanted]
        rows: dict[str, list[np.ndarray]] = {n: [] for n in wanted}
        outputs: list[list[np.ndarray]] = []
        for i, feed in enumerate(feeds):
            inputs = {k: np.asarray(v) for k, v in feed.items() if k in self._inputs}
            inputs.update(overrides or {})
            try:
                values = self.session.run(names, inputs)
            except Exception as e:
                raise VerificationError(
                    f"sample {i}: the {self.what} failed to run ({first_line(e)})."
                ) from None
            if with_outputs:
                outputs.append(values[: len(self.outputs)])
            for name, value in zip(wanted, values[len(names) - len(wanted) :], strict=True):
                rows[name].append(np.asarray(value, np.float64).reshape(-1))
        return {k: np.stack(v) for k, v in rows.items()}, outputs


def output_sqnr(reference: Sequence[Sequence[np.ndarray]], test: Sequence[Sequence[np.ndarray]]) -> float:
    """SQNR (dB) of ``test`` against ``reference`` over all float outputs of all samples."""
    signal = noise = 0.0
    for ref_outs, test_outs in zip(reference, test, strict=True):
        for r, t in zip(ref_outs, test_outs, strict=True):
            if np.asarray(r).dtype.kind != "f" or np.shape(r) != np.shape(t):
                continue
            r64, t64 = np.asarray(r, np.float64), np.asarray(t, np.float64)
            signal += float(np.square(r64).sum())
            noise += float(np.square(r64 - t64).sum())
    if noise == 0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf
