"""Sessions over lowered programs with the native kernel library registered (tests of both lowerings)."""

from __future__ import annotations

import onnx
import onnxruntime as ort

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
