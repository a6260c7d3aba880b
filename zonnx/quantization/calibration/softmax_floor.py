"""Softmax inputs are calibrated on the values that can change the Softmax.

``softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x)``: an entry more than ``FLOOR`` (20) below its
row's maximum contributes less than ``exp(-20) = 2e-9`` of the row's mass, below half a step of any 8- or
16-bit output grid (``1/510``, ``1/131070``). So ``max(x, rowmax(x) - FLOOR)`` has the same Softmax to
that precision, and its range is what the quantizer of ``x`` must cover. The trap this avoids is the
attention mask: ``scores + (1 - mask) * -10000`` gives the Softmax input a range of about ``[-10000, 10]``,
and an 8-bit grid over it has a step of about 40 (78 with symmetric codes): every real score lands on the
same one or two codes and attention becomes uniform. Calibrated on the floored values, the grid covers
the scores, and the masked entries saturate at its lowest code, which is still ``FLOOR`` or more below
every calibrated row's maximum, so they keep contributing nothing.

The rule applies to a tensor whose every reader is a Softmax (opset 13 or later, one axis for all of
them): a tensor that anything else reads keeps its full range.
"""

from __future__ import annotations

__all__ = ["FLOOR", "floor_nodes", "softmax_axes"]

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: How far below its row's maximum a Softmax input still matters (exp(-20) = 2.1e-9).
FLOOR = 20.0


def softmax_axes(graph: onnx.GraphProto, names: Sequence[str], opset: int) -> dict[str, int]:
    """{tensor: Softmax axis} for each of ``names`` that only Softmax nodes (one axis) read."""
    if opset < 13:  # before 13, Softmax flattens to 2-D: the row is not one axis
        return {}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in dict.fromkeys(node.input):
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    axes = {}
    for name in names:
        nodes = readers.get(name, [])
        if (
            not nodes
            or name in outputs
            or any(n.op_type != "Softmax" or n.domain not in ("", "ai.onnx") for n in nodes)
        ):
            continue
        found = {next((a.i for a in n.attribute if a.name == "axis"), -1) for n in nodes}
        if len(found) == 1:
            axes[name] = found.pop()
    return axes


def floor_nodes(x: str, axis: int, out: str, prefix: str, opset: int) -> tuple[list[onnx.NodeProto], list]:
    """Nodes computing ``out = Max(x, ReduceMax(x, axis) - FLOOR)`` and the initializers they need."""
    inits = [numpy_helper.from_array(np.array(FLOOR, np.float32), prefix + "floor")]
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array([axis], np.int64), prefix + "axis"))
        peak = helper.make_node("ReduceMax", [x, prefix + "axis"], [prefix + "peak"], keepdims=1)
    else:
        peak = helper.make_node("ReduceMax", [x], [prefix + "peak"], axes=[axis], keepdims=1)
    nodes = [
        peak,
        helper.make_node("Sub", [prefix + "peak", prefix + "floor"], [prefix + "low"]),
        helper.make_node("Max", [x, prefix + "low"], [out]),
    ]
    return nodes, inits
