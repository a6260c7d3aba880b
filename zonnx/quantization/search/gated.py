"""A quantized model whose activation quantizers can be switched on and off, and rescaled, per run.

Each activation quantizer ``U`` (a QuantizeLinear -> DequantizeLinear pair, a VitisQuantizeLinear ->
VitisDequantizeLinear pair, or a FixNeuron) on tensor ``x`` becomes

    out = x + g * (r * U(x / r) - x)

with two scalar graph inputs per quantizer: the gate ``g`` (1: quantized as written, 0: float) and the
range ratio ``r`` (quantizing ``x / r`` on the written grid and scaling back is quantizing ``x`` with the
scale times ``r``, the zero point and the saturation codes unchanged, so its range is the written one
times ``r``). Weights keep their quantizers. One ONNX Runtime session then serves every candidate
setting of gates and ratios without re-quantizing: "only these tensors quantized" (one-at-a-time
sensitivity) and "every tensor quantized, these ranges scaled" (range search) are both feeds.

The error measure is the output noise: per sample, the sum over outputs of ``||y - y_float||^2 /
||y_float||^2``, averaged over samples (independent noise sources add, so it orders and sums well).
"""

from __future__ import annotations

__all__ = ["GatedModel", "output_noise", "QUANTIZE_OPS", "DEQUANTIZE_OPS", "FAKE_QUANT_OPS"]

import logging
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from zonnx.verify import ort_session

logger = logging.getLogger(__name__)

QUANTIZE_OPS = frozenset({"QuantizeLinear", "VitisQuantizeLinear"})
DEQUANTIZE_OPS = frozenset({"DequantizeLinear", "VitisDequantizeLinear"})
FAKE_QUANT_OPS = frozenset({"FixNeuron"})


def output_noise(reference: Sequence[Sequence[np.ndarray]], outputs: Sequence[Sequence[np.ndarray]]) -> float:
    """Mean over samples of the summed relative noise power of the outputs against the reference."""
    total = 0.0
    for ref, out in zip(reference, outputs, strict=True):
        for a, b in zip(ref, out, strict=True):
            a64 = np.asarray(a, np.float64)
            power = float(np.square(a64).sum()) or 1.0
            total += float(np.square(np.asarray(b, np.float64) - a64).sum()) / power
    return total / max(1, len(reference))


def _scalar_input(graph: onnx.GraphProto, name: str) -> str:
    graph.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, []))
    return name


def _divide(graph: onnx.GraphProto, node: onnx.NodeProto, tag: str) -> tuple[onnx.NodeProto, str]:
    """``node`` (a quantizer) reads ``x / r`` instead of ``x``: the Div node and the ratio input ``r``."""
    r = _scalar_input(graph, f"zonnx_ratio_{tag}")
    scaled = f"{node.input[0]}_zonnx_div_{tag}"
    div = helper.make_node("Div", [node.input[0], r], [scaled], name=f"zonnx_ratio_div_{tag}")
    node.input[0] = scaled
    return div, r


def _gate(
    graph: onnx.GraphProto, x: str, raw: str, out: str, tag: str, r: str, new_nodes: list[onnx.NodeProto]
) -> str:
    """Nodes computing ``out = x + g * (r * raw - x)``; returns the name of the gate input."""
    g = _scalar_input(graph, f"zonnx_gate_{tag}")
    new_nodes += [
        helper.make_node("Mul", [raw, r], [f"{raw}_r"], name=f"zonnx_gate_mul_r_{tag}"),
        helper.make_node("Sub", [f"{raw}_r", x], [f"{raw}_d"], name=f"zonnx_gate_sub_{tag}"),
        helper.make_node("Mul", [f"{raw}_d", g], [f"{raw}_gd"], name=f"zonnx_gate_mul_g_{tag}"),
        helper.make_node("Add", [x, f"{raw}_gd"], [out], name=f"zonnx_gate_add_{tag}"),
    ]
    return g


class GatedModel:
    """``model`` (a quantized ModelProto) with a gate and a range ratio on every activation quantizer.

    ``units`` maps each activation quantizer's tensor (the float tensor it quantizes, by the name the
    plan knows it under when ``known`` is given) to its (gate input, ratio input) names. ``outputs``:
    the tensors ``run`` returns (the graph outputs by default; any tensor of the model may be named).
    ``keep``: tensors whose quantizer is never switched off, because it does a removed Relu/Clip's clipping
    (``QuantPlan.removed``): off, it would let negative values through.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        known: Iterable[str] | None = None,
        outputs: Sequence[str] | None = None,
        keep: Iterable[str] = (),
    ) -> None:
        self.keep = set(keep)
        self._pending: dict[int, tuple[str, str, str]] = {}
        self._all_inputs: list[tuple[str, str, str]] = []
        m = onnx.ModelProto()
        m.CopyFrom(model)
        graph = m.graph
        consts = {i.name for i in graph.initializer}
        consts |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
        readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
        wanted = set(known) if known is not None else None
        self.units: dict[str, tuple[str, str]] = {}
        nodes: list[onnx.NodeProto] = []
        for index, node in enumerate(graph.node):
            nodes.append(node)
            x = node.input[0] if node.input else ""
            if not x or x in consts:
                continue
            if node.op_type in QUANTIZE_OPS:
                pairs = [d for d in readers.get(node.output[0], []) if d.op_type in DEQUANTIZE_OPS]
                if not pairs:
                    continue
                div, r = _divide(graph, node, str(index))
                nodes.insert(len(nodes) - 1, div)
                # the dequantize nodes come later in topological order: gate them when they are reached
                for d in pairs:
                    d.output[0], out = f"{d.output[0]}_zonnx_raw", d.output[0]
                    self._pending[id(d)] = (x, out, r)
                continue
            raw_out = None
            if node.op_type in DEQUANTIZE_OPS and id(node) in self._pending:
                x, out, r = self._pending.pop(id(node))
                raw_out = node.output[0]
            elif node.op_type in FAKE_QUANT_OPS:
                div, r = _divide(graph, node, str(index))
                nodes.insert(len(nodes) - 1, div)
                node.output[0], out = f"{node.output[0]}_zonnx_raw", node.output[0]
                raw_out = node.output[0]
            if raw_out is None:
                continue
            name = self._tensor_name(x, out, wanted)
            tag = str(index)
            extra: list[onnx.NodeProto] = []
            g = _gate(graph, x, raw_out, out, tag, r, extra)
            nodes += extra
            self.units.setdefault(name, (g, r))
            self._all_inputs.append((name, g, r))
        del graph.node[:]
        graph.node.extend(nodes)
        self.outputs = list(outputs) if outputs else [o.name for o in graph.output]
        listed = {o.name for o in graph.output}
        for name in self.outputs:
            if name not in listed:
                graph.output.append(onnx.ValueInfoProto(name=name))
        self.model = m
        self.session = ort_session(m)
        logger.info("gated model: %d activation quantizer(s) switchable", len(self._all_inputs))

    @staticmethod
    def _tensor_name(x: str, out: str, wanted: set[str] | None) -> str:
        if wanted is None or x in wanted or out not in wanted:
            return x
        return out  # a graph output keeps its name on the dequantized side

    def feeds(
        self, on: Iterable[str] | None, ratios: Mapping[str, float] | None = None
    ) -> dict[str, np.ndarray]:
        """Gate and ratio feeds: tensors in ``on`` quantized (every one when None), ratios default 1."""
        chosen = None if on is None else set(on)
        ratios = ratios or {}
        out = {}
        for name, g, r in self._all_inputs:
            out[g] = np.array(
                1.0 if chosen is None or name in chosen or name in self.keep else 0.0, np.float32
            )
            out[r] = np.array(ratios.get(name, 1.0), np.float32)
        return out

    def run(
        self,
        samples: Sequence[Mapping[str, np.ndarray]],
        on: Iterable[str] | None = None,
        ratios: Mapping[str, float] | None = None,
    ) -> list[list[np.ndarray]]:
        """Outputs on each sample with the quantizers of ``on`` active (all when None), ``ratios`` applied."""
        gates = self.feeds(on, ratios)
        return [list(self.session.run(self.outputs, {**sample, **gates})) for sample in samples]
