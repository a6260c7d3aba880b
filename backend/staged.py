"""The reference executor of a compiled model: ORT sessions over the CPU parts, numpy programs between them."""

from __future__ import annotations

__all__ = ["ORT_TYPES", "StagedExecutor", "open_executable", "ort_cpu_session"]

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from zonnx.backend.compiled import NPU_DOMAIN, NPU_OP, read_program
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
    """The reference executor: ORT sessions over CPU parts, numpy ``run_program`` for NPU nodes, in order."""

    def __init__(self, model: onnx.ModelProto, sess_options: ort.SessionOptions | None) -> None:
        g = model.graph
        inits = {t.name: t for t in g.initializer}
        types = {i.name: i.type.tensor_type.elem_type for i in g.input}
        self.stages: list[tuple[str, Any, list[str], list[str]]] = []
        cpu: list[onnx.NodeProto] = []
        for n in g.node:  # topological order: runs of CPU nodes between NPU nodes
            if not (n.op_type == NPU_OP and n.domain == NPU_DOMAIN):
                cpu.append(n)
                continue
            if cpu:
                self.stages.append(self._cpu_stage(model, cpu, inits, types, sess_options))
                cpu = []
            prog = read_program(n)
            self.stages.append(("npu", prog, list(n.input), list(n.output)))
            for o, info in zip(n.output, prog.outputs, strict=True):
                types[o] = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype))
        if cpu:
            self.stages.append(self._cpu_stage(model, cpu, inits, types, sess_options))
        self.output_names = [o.name for o in g.output]

    @staticmethod
    def _cpu_stage(model, nodes, inits, types, sess_options) -> tuple[str, Any, list[str], list[str]]:
        made = {o for n in nodes for o in n.output}
        needed = list(dict.fromkeys(i for n in nodes for i in n.input if i and i not in made))
        feeds = [i for i in needed if i not in inits]
        outs = list(dict.fromkeys(o for n in nodes for o in n.output if o))
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
