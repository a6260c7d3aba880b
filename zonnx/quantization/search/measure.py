"""Measured sensitivity: the output noise each shared-scale group of activations causes when it alone is quantized.

Rule: for each group of activation tensors that share one scale (``QuantPlan.groups``: a tensor and the
value-moving ops after it), the baseline quantized model runs with only that group's quantizers on
(``GatedModel``: weights stay quantized, every other activation float) on a few evaluation samples; its
sensitivity is the noise power (``output_noise``; on the logits of a Softmax output) of the change this
makes to the outputs with every activation float. Measured against those outputs, not the float
model's, the group's error is not mixed with the weights' (their cross term has either sign and, on
a few samples, can hide a group that matters). This is
"quantize only layer i", measured on the task's own outputs, where the per-layer report's proxy (the
noise a layer adds where it sits) misses how much of it reaches the output.

A group is raised by overriding the nodes that own its tensors: the producer of each tensor when that
producer is quantized, else the first quantized reader (a graph input). Raising a node alone would
leave the value-moving ops after it on the 8-bit grid, so the group, not the node, is the unit.

Cost: one run per group and sample of a model about twice as heavy as the quantized one, and no
re-quantization (the gates are inputs of one ONNX Runtime session).
"""

from __future__ import annotations

__all__ = [
    "GroupSensitivity",
    "float_outputs",
    "group_owners",
    "measure_groups",
    "measured_order",
    "measured_outputs",
]

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx

from zonnx.quantization.search.gated import GatedModel, output_noise
from zonnx.verify import ort_session

logger = logging.getLogger(__name__)

_MOVES = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


@dataclasses.dataclass
class GroupSensitivity:
    """One shared-scale group: its tensors, the nodes that own them, and the output noise it causes alone."""

    tensors: list[str]
    owners: list[str]
    noise: float


def group_owners(
    float_model: onnx.ModelProto, tensors: Sequence[str], quantized_nodes: Sequence[str]
) -> list[str]:
    """The quantized nodes whose override sets the spec of ``tensors`` (producer, else first quantized reader)."""
    planned = set(quantized_nodes)
    producer = {o: n.name for n in float_model.graph.node for o in n.output}
    first_reader: dict[str, str] = {}
    for node in float_model.graph.node:
        if node.name in planned:
            for name in node.input:
                first_reader.setdefault(name, node.name)
    owners: list[str] = []
    for t in tensors:
        owner = producer.get(t)
        if owner not in planned:
            owner = first_reader.get(t)
        if owner is not None and owner not in owners:
            owners.append(owner)
    return owners


def measured_outputs(float_model: onnx.ModelProto) -> list[str]:
    """The graph outputs, a Softmax output replaced by its input (the logits: noise adds there, where
    the probabilities saturate)."""
    producer = {o: n for n in float_model.graph.node for o in n.output}
    out = []
    for o in float_model.graph.output:
        node = producer.get(o.name)
        while node is not None and node.op_type in _MOVES:  # the Softmax may sit behind reshapes
            node = producer.get(node.input[0])
        out.append(node.input[0] if node is not None and node.op_type == "Softmax" else o.name)
    return out


def float_outputs(
    float_model: onnx.ModelProto, names: Sequence[str], feeds: Sequence[Mapping[str, np.ndarray]]
) -> list[list[np.ndarray]]:
    """The float model's tensors ``names`` (any tensor, not only outputs) on each feed."""
    m = onnx.ModelProto()
    m.CopyFrom(float_model)
    listed = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in listed)
    sess = ort_session(m)
    return [list(sess.run(list(names), dict(f))) for f in feeds]


def measure_groups(
    quant_model: onnx.ModelProto,
    float_model: onnx.ModelProto,
    groups: Sequence[Sequence[str]],
    quantized_nodes: Sequence[str],
    samples: Sequence[Mapping[str, np.ndarray]],
    *,
    progress: Callable[[int, int], None] | None = None,
    keep: Iterable[str] = (),
) -> list[GroupSensitivity]:
    """Each group's output noise with only its quantizers on (see the module docstring), in group order;
    ``keep``: quantizers that stay on in every run (a removed Relu/Clip's clipping, ``QuantPlan.removed``)."""
    measured = measured_outputs(float_model)
    gated = GatedModel(quant_model, known=[t for g in groups for t in g], outputs=measured, keep=keep)
    names = {i.name for i in float_model.graph.input}
    feeds = [{k: v for k, v in s.items() if k in names} for s in samples]
    reference = float_outputs(float_model, measured, feeds)
    weights_only = gated.run(feeds, on=[])
    floor = output_noise(reference, weights_only)
    out = []
    start = time.perf_counter()
    for i, group in enumerate(groups):
        present = [t for t in group if t in gated.units]
        # the change this group alone makes to the weights-only outputs: no cross term with the weights' error
        noise = output_noise(weights_only, gated.run(feeds, on=present)) if present else 0.0
        out.append(GroupSensitivity(list(group), group_owners(float_model, group, quantized_nodes), noise))
        if progress:
            progress(i + 1, len(groups))
    logger.info(
        "measured the sensitivity of %d group(s) on %d sample(s) in %.0f s (weights-only noise %.3g)",
        len(groups), len(feeds), time.perf_counter() - start, floor,
    )  # fmt: skip
    return out


def measured_order(sensitivities: Sequence[GroupSensitivity]) -> list[str]:
    """Owner nodes, those of the noisiest group first (each node once)."""
    order: list[str] = []
    seen: set[str] = set()
    for s in sorted(sensitivities, key=lambda s: -s.noise):
        for node in s.owners:
            if node not in seen:
                seen.add(node)
                order.append(node)
    return order
