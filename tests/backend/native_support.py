"""Sessions over lowered programs with the native kernel library registered (tests of both lowerings)."""

from __future__ import annotations

import collections

import onnx
import onnxruntime as ort

from zonnx.backend.compiler import Program
from zonnx.backend.native import native_status, register_library

#: Parametrize ids for tests that run the pure-ONNX lowering and the native kernels.
KERNELS = [False, True]
KERNEL_IDS = ["onnx", "native"]


def lowered_session(model: onnx.ModelProto, native: bool) -> ort.InferenceSession:
    """An ORT CPU session over ``model``; with ``native`` the kernel library must be built (setup does it)."""
    so = ort.SessionOptions()
    if native:
        status = native_status()
        assert status.available, status.reason
        so = register_library(so, status)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def residual_conv_outputs(prog: Program) -> set[str]:
    """Conv outputs read by one ``add`` only and not program outputs: the tensors the native lowering fuses
    away when they are not exposed (``ort_fuse``; exposing them keeps every conv apart)."""
    readers = collections.Counter(t for op in prog.ops for t in op.inputs)
    into_add = {t for op in prog.ops if op.kind == "add" for t in op.inputs}
    outs = {t.name for t in prog.outputs}
    return {
        op.outputs[0]
        for op in prog.ops
        if op.kind == "conv" and readers[op.outputs[0]] == 1 and op.outputs[0] in into_add - outs
    }


def fused_qconvs(model: onnx.ModelProto) -> int:
    """QConv nodes with a residual add fused in (a third input)."""
    return sum(n.op_type == "QConv" and len(n.input) == 3 for n in model.graph.node)
