"""Quantized models for the capability and partitioner tests (built once per session) and checks."""

from __future__ import annotations

__all__ = ["Models", "quantize", "diamond_model", "acyclic"]

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper
from onnxruntime.quantization import QuantFormat, QuantType

import zonnx
import zonnx.zoo
from zonnx import PowerOfTwoMethod, VitisQuantFormat
from zonnx.backend.partition import Partition
from zonnx.backend.partition.capability import node_keys


class _Reader:
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def quantize(src: str | Path, out: Path, feeds: list[dict[str, np.ndarray]], form: str) -> Path:
    """``form``: "fix" (FixNeuron, power of two, DPU rules), "qdq" (int8 symmetric), "qdq_asym" (ORT default-like)."""
    if form == "fix":
        zonnx.quantize_static(
            src, out, _Reader(feeds), quant_format=VitisQuantFormat.FixNeuron,
            calibrate_method=PowerOfTwoMethod.NonOverflow, extra_options={"Target": "dpu-b4096"},
        )  # fmt: skip
    else:
        zonnx.quantize_static(
            src, out, _Reader(feeds), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8, extra_options={"ActivationSymmetric": form == "qdq"},
        )  # fmt: skip
    return out


class Models:
    """Paths of quantized zoo models, made on first use."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._paths: dict[tuple[str, str], Path] = {}

    def get(self, name: str, form: str, samples: int = 4) -> Path:
        key = (name, form)
        if key not in self._paths:
            feeds = zonnx.zoo.sample_inputs(name, samples)
            self._paths[key] = quantize(zonnx.zoo.get(name), self.folder / f"{name}_{form}.onnx", feeds, form)
        return self._paths[key]


def _conv(name: str, x: str, w: str, out: str, k: int) -> onnx.NodeProto:
    return helper.make_node("Conv", [x, w, f"{w}_b"], [out], name=name, pads=[k // 2] * 4)


def diamond_model(path: Path) -> Path:
    """x -> A (Conv 3x3) -> B (Softmax) -> D (Add); A -> C (Conv 1x1) -> D; D -> E (Conv 17x17) -> y."""
    rng = np.random.default_rng(0)
    inits = []
    for w, k in (("wa", 3), ("wc", 1), ("we", 17)):
        inits.append(
            helper.make_tensor(w, TensorProto.FLOAT, [4, 4, k, k], rng.normal(0, 0.2, (4, 4, k, k)).ravel())
        )
        inits.append(helper.make_tensor(f"{w}_b", TensorProto.FLOAT, [4], rng.normal(0, 0.1, 4)))
    nodes = [
        _conv("A", "x", "wa", "a", 3),
        helper.make_node("Softmax", ["a"], ["b"], name="B", axis=1),
        _conv("C", "a", "wc", "c", 1),
        helper.make_node("Add", ["b", "c"], ["d"], name="D"),
        _conv("E", "d", "we", "y", 17),
    ]
    graph = helper.make_graph(
        nodes, "diamond",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 20, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 20, 20])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    float_path = path.with_name("diamond_float.onnx")
    onnx.save(model, float_path)
    feeds = [{"x": rng.normal(0, 1, (1, 4, 20, 20)).astype(np.float32)} for _ in range(4)]
    return quantize(float_path, path, feeds, "fix")


def acyclic(model: ir.Model, part: Partition) -> bool:
    """Whether contracting each subgraph to one node (CPU nodes stay single) leaves a DAG."""
    keys = node_keys(model.graph)
    places: dict[str, set[str]] = {name: {f"cpu:{name}"} for name in part.cpu_nodes}
    for s in part.subgraphs:
        for name in s.node_names:
            places.setdefault(name, set()).add(f"npu:{s.id}")
    where = {k: next(iter(v)) for k, v in places.items() if len(v) == 1}  # copies are transparent

    def sources(node: ir.Node) -> set[str]:
        found: set[str] = set()
        for value in node.inputs:
            prod = value.producer() if value is not None else None
            if prod is not None:
                found |= {where[keys[prod]]} if keys[prod] in where else sources(prod)
        return found

    edges: dict[str, set[str]] = {}
    for node in model.graph:
        dst = where.get(keys[node])
        for src in sources(node) if dst is not None else ():
            if src != dst:
                edges.setdefault(src, set()).add(dst)
    state: dict[str, int] = {}

    def visit(u: str) -> bool:
        state[u] = 1
        for v in edges.get(u, ()):
            if state.get(v) == 1 or (v not in state and not visit(v)):
                return False
        state[u] = 2
        return True

    return all(state.get(u) == 2 or visit(u) for u in list(edges))
