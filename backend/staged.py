"""The reference executor of a compiled model: ORT sessions over the CPU parts, numpy programs between them."""

from __future__ import annotations

__all__ = ["ORT_TYPES", "StagedExecutor", "open_executable", "ort_cpu_session"]

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from zonnx.backend.compiled import NPU_DOMAIN, NPU_OP, read_program
from zonnx.backend.graph_reads import node_reads
from zonnx.backend.runtime.reference import run_program
from zonnx.errors import ZonnxError
from zonnx.hostcpu import int_path
from zonnx.verify import exact_integer_form

CPU_PROVIDER = "CPUExecutionProvider"
ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(int16)": np.int16,
    "tensor(uint16)": np.uint16, "tensor(int32)": np.int32, "tensor(uint32)": np.uint32,
    "tensor(int64)": np.int64, "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}  # fmt: skip


def ort_cpu_session(model: bytes, sess_options: ort.SessionOptions | None) -> ort.InferenceSession:
    """ORT's CPU session over ``model``; its integer ops and fusable QDQ groups run exactly on every host
    (``verify.exact_integer_form``: uint8 weights where ORT's u8 x s8 kernels saturate)."""
    if int_path() == "u8u8":
        proto = onnx.ModelProto.FromString(model)
        fixed = exact_integer_form(proto)
        if fixed is not proto:
            model = fixed.SerializeToString()
    return open_executable(model, sess_options)


def open_executable(model: bytes | str, sess_options: ort.SessionOptions | None) -> ort.InferenceSession:
    """ORT's CPU session over a model already in this host's exact integer form (``ort_cpu_session``,
    ``compiled_store.lowered_model``), given as bytes or as a file path (ORT then finds external data
    beside it); ORT's refusal is a ZonnxError."""
    try:
        return ort.InferenceSession(model, sess_options, providers=[CPU_PROVIDER])
    except Exception as e:  # ORT raises its own exception types
        raise ZonnxError(f"ONNX Runtime cannot load the model ({str(e).strip()[:400]}).") from None


class StagedExecutor:
    """The reference executor: ORT sessions over CPU parts, numpy ``run_program`` for NPU nodes, in order.

    Each CPU part is the ORT model ORT sees of it in the lowered model, so ORT fuses the same QDQ groups
    (into QLinearConv, QLinearAdd, QGemm, ...) and computes the same numbers: a part exports only the
    tensors later parts or the graph's outputs read, and carries its own copy of the constant-only nodes it
    reads (the DequantizeLinear of its weights), wherever they stand in the graph. (Exporting every tensor
    and reading dequantized weights as inputs kept ORT from fusing, and its float path can round a value one
    step differently from the fused integer kernel the lowered model runs.)
    """

    def __init__(self, model: onnx.ModelProto, sess_options: ort.SessionOptions | None) -> None:
        g = model.graph
        inits = {t.name: t for t in g.initializer}
        types = {i.name: i.type.tensor_type.elem_type for i in g.input}
        plan: list[onnx.NodeProto | list[onnx.NodeProto]] = []  # NPU nodes and runs of CPU nodes between them
        for n in g.node:  # topological order
            if n.op_type == NPU_OP and n.domain == NPU_DOMAIN:
                plan.append(n)
            elif plan and isinstance(plan[-1], list):
                plan[-1].append(n)
            else:
                plan.append([n])
        const = _constant_producers(g, inits)
        order = {id(n): k for k, n in enumerate(g.node)}
        parts: list[onnx.NodeProto | list[onnx.NodeProto]] = []
        for step in plan:
            parts.append(_with_constants(step, const, order) if isinstance(step, list) else step)
        # read_after[k]: what the parts after part k and the graph's outputs read
        read_after: list[set[str]] = [set()] * len(parts)
        later = {o.name for o in g.output}
        for k in range(len(parts) - 1, -1, -1):
            read_after[k] = later
            later = later | _reads(parts[k] if isinstance(parts[k], list) else [parts[k]])
        self.stages: list[tuple[str, Any, list[str], list[str]]] = []
        for part, read_later in zip(parts, read_after, strict=True):
            if not isinstance(part, list):
                prog = read_program(part)
                self.stages.append(("npu", prog, list(part.input), list(part.output)))
                for o, info in zip(part.output, prog.outputs, strict=True):
                    types[o] = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype))
                continue
            nodes = _prune(part, read_later, const)
            if nodes:
                self.stages.append(self._cpu_stage(model, nodes, inits, types, sess_options, read_later))
        self.output_names = [o.name for o in g.output]

    @staticmethod
    def _cpu_stage(
        model, nodes, inits, types, sess_options, read_later
    ) -> tuple[str, Any, list[str], list[str]]:
        made = {o for n in nodes for o in n.output}
        needed = list(dict.fromkeys(i for n in nodes for i in n.input if i and i not in made))
        feeds = [i for i in needed if i not in inits]
        outs = list(dict.fromkeys(o for n in nodes for o in n.output if o and o in read_later))
        graph = onnx.helper.make_graph(
            nodes,
            "stage",
            [onnx.helper.make_tensor_value_info(i, types[i], None) for i in feeds],
            [onnx.helper.make_value_info(o, onnx.TypeProto()) for o in outs],
            [inits[i] for i in needed if i in inits],
        )
        stage = onnx.helper.make_model(
            graph, opset_imports=list(model.opset_import), functions=list(model.functions)
        )
        stage.ir_version = model.ir_version
        stage.metadata_props.extend(model.metadata_props)
        sess = ort_cpu_session(stage.SerializeToString(), sess_options)
        for o in sess.get_outputs():
            types[o.name] = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(ORT_TYPES[o.type]))
        return ("cpu", sess, feeds, outs)

    def run(self, names: list[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        env = dict(feeds)
        for kind, runner, ins, outs in self.stages:
            if kind == "cpu":
                env.update(zip(outs, runner.run(outs, {i: env[i] for i in ins}), strict=True))
            else:
                got = run_program(runner, {t.name: env[i] for t, i in zip(runner.inputs, ins, strict=True)})
                for o, t in zip(outs, runner.outputs, strict=True):
                    env[o] = got[t.name].astype(t.dtype)
        return [env[n] for n in names]


def _constant_producers(
    graph: onnx.GraphProto, inits: Mapping[str, onnx.TensorProto]
) -> dict[str, onnx.NodeProto]:
    """Output name -> node, for CPU nodes that read only initializers and other such nodes' outputs (no
    subgraphs): a stage can compute them itself."""
    known, out = set(inits), {}
    for n in graph.node:
        if n.op_type == NPU_OP and n.domain == NPU_DOMAIN:
            continue
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
            continue
        if all(not i or i in known for i in n.input):
            known.update(o for o in n.output if o)
            out.update((o, n) for o in n.output if o)
    return out


def _reads(nodes: list[onnx.NodeProto]) -> set[str]:
    """The tensors ``nodes`` read from outside themselves."""
    made = {o for n in nodes for o in n.output}
    return {i for n in nodes for i in node_reads(n) if i not in made}


def _with_constants(
    nodes: list[onnx.NodeProto], const: Mapping[str, onnx.NodeProto], order: Mapping[int, int]
) -> list[onnx.NodeProto]:
    """``nodes`` after the constant-only nodes they read that they do not hold, in graph order."""
    have = {id(n) for n in nodes}
    pulled: list[onnx.NodeProto] = []

    def pull(name: str) -> None:
        src = const.get(name)
        if src is None or id(src) in have:
            return
        have.add(id(src))
        pulled.append(src)
        for i in src.input:
            pull(i)

    for n in nodes:
        for i in n.input:
            pull(i)
    return sorted(pulled + nodes, key=lambda n: order[id(n)])  # graph order is topological order


def _prune(
    nodes: list[onnx.NodeProto], read_later: set[str], const: Mapping[str, onnx.NodeProto]
) -> list[onnx.NodeProto]:
    """``nodes`` without the constant-only ones nothing in the stage reads and no later stage needs from it."""
    keep = list(nodes)
    while True:
        read = {i for n in keep for i in node_reads(n)} | read_later
        drop = [n for n in keep if n.output and all(const.get(o) is n for o in n.output if o)
                and not any(o in read for o in n.output if o)]  # fmt: skip
        if not drop:
            return keep
        keep = [n for n in keep if all(n is not d for d in drop)]
