"""Find, check and register the native kernel library; choose between native kernels and the ONNX lowering.

Rule: the library for the current sources (``build.library_path``) is used when it exists, reports
``build.ABI_VERSION`` through its exported ``ZonnxNativeAbiVersion`` and passes a one-node probe in a
real ORT session; otherwise the NPU runs on the pure-ONNX lowering and one warning line says why and
how to get the fast path. The choice: provider option ``kernels`` ("auto" | "native" | "onnx"); with
"auto", ``$ZONNX_NPU_KERNELS`` (same values) decides, else the library when it is usable. "native"
when the library is not usable is an OptionError naming the reason. The check runs once per process.
"""

from __future__ import annotations

__all__ = [
    "KERNELS_ENV",
    "KERNEL_CHOICES",
    "NativeStatus",
    "native_status",
    "choose_kernels",
    "register_library",
    "ISA_ENV",
    "conv_isa",
]

import ctypes
import dataclasses
import functools
import logging
import os
import weakref
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from zonnx.errors import OptionError, did_you_mean

from .build import ABI_VERSION, library_path, source_key

logger = logging.getLogger(__name__)

KERNELS_ENV = "ZONNX_NPU_KERNELS"
KERNEL_CHOICES = ("auto", "native", "onnx")
#: ``avx-vnni`` / ``baseline`` caps the GEMM path of QConv kernels created afterwards (tests of every path).
ISA_ENV = "ZONNX_NATIVE_ISA"
_HOW = "build it with: python -m zonnx.tools.build_native (bash tools/dev.sh does it at setup)"
_registered: weakref.WeakSet = weakref.WeakSet()
_warned: list[bool] = []


@dataclasses.dataclass(frozen=True)
class NativeStatus:
    """The native library's state here: ``path`` when usable, else None, and one line saying why."""

    path: Path | None
    reason: str

    @property
    def available(self) -> bool:
        return self.path is not None

    @property
    def identity(self) -> str:
        """Part of the lowered-model cache key: which kernels a lowered model needs."""
        return f"native-{source_key()}-abi{ABI_VERSION}" if self.path is not None else "onnx"


def _abi_of(path: Path) -> int:
    lib = ctypes.CDLL(str(path))
    fn = lib.ZonnxNativeAbiVersion
    fn.restype = ctypes.c_int64
    return int(fn())


def conv_isa(status: NativeStatus | None = None) -> str:
    """The GEMM path a QConv kernel created now takes: ``avx512-vnni``, ``avx-vnni`` or ``portable`` (by the CPU,
    capped by ``$ZONNX_NATIVE_ISA`` = ``avx-vnni`` | ``baseline``)."""
    status = status or native_status()
    if status.path is None:
        raise OptionError(f"no native kernels: {status.reason}.")
    fn = ctypes.CDLL(str(status.path)).ZonnxNativeConvIsa
    fn.restype = ctypes.c_int64
    return {2: "avx512-vnni", 1: "avx-vnni"}.get(int(fn()), "portable")


def _probe(path: Path) -> None:
    """One RequantU8 node in a real session: ((x*3 + 5) >> 2 rounded half up) + 1."""
    node = helper.make_node(
        "RequantU8", ["x"], ["y"], domain="zonnx.native", terms=1, mult=[3], cnst=[5], shift=[2],
        mode=0, zs=1, lo=0, hi=255, caxis_from_end=0, wide=0,
    )  # fmt: skip
    graph = helper.make_graph(
        [node],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.INT32, [4])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [4])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("zonnx.native", 1)]
    )
    model.ir_version = 10
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(path))
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = np.array([-7, 0, 1, 100], np.int32)
    got = sess.run(None, {"x": x})[0]
    want = np.clip(((x.astype(np.int64) * 3 + 5 + 2) >> 2) + 1, 0, 255)
    if not np.array_equal(got, want):
        raise RuntimeError(f"probe computed {got.tolist()}, expected {want.tolist()}")


@functools.lru_cache(maxsize=1)
def native_status() -> NativeStatus:
    """Whether the library for the current sources is built, of this ABI and working (module docstring)."""
    path = library_path()
    if not path.is_file():
        return NativeStatus(
            None, f"the native kernel library is not built for these sources ({path}); {_HOW}"
        )
    try:
        abi = _abi_of(path)
    except (OSError, AttributeError) as e:
        return NativeStatus(None, f"{path} is not a zonnx kernel library ({e}); delete it and {_HOW}")
    if abi != ABI_VERSION:
        return NativeStatus(
            None, f"{path} has ABI version {abi}, this zonnx needs {ABI_VERSION}; delete it and {_HOW}"
        )
    try:
        _probe(path)
    except Exception as e:  # ORT's own exception types, or a wrong probe result
        return NativeStatus(None, f"{path} failed its check in ONNX Runtime ({str(e).strip()[:200]}); {_HOW}")
    return NativeStatus(path, f"native kernels {path}")


def choose_kernels(option: str = "auto") -> NativeStatus:
    """The kernels an NPU session uses for provider option ``kernels`` (module docstring)."""
    choice = str(option or "auto").lower()
    if choice == "auto":
        env = os.environ.get(KERNELS_ENV, "").strip().lower()
        if env and env not in KERNEL_CHOICES:
            raise OptionError(
                f"{KERNELS_ENV}={env!r}: use one of {', '.join(KERNEL_CHOICES)}."
                + did_you_mean(env, KERNEL_CHOICES)
            )
        choice = env or "auto"
    if choice not in KERNEL_CHOICES:
        raise OptionError(
            f"provider option kernels: must be one of {', '.join(KERNEL_CHOICES)}, got {option!r}."
            + did_you_mean(choice, KERNEL_CHOICES)
        )
    if choice == "onnx":
        return NativeStatus(None, "pure-ONNX lowering (kernels=onnx)")
    status = native_status()
    if choice == "native" and not status.available:
        raise OptionError(f"kernels=native: {status.reason}.")
    if not status.available and not _warned:
        _warned.append(True)
        logger.warning("NPU sessions run on the pure-ONNX lowering (slower): %s", status.reason)
    return status


def register_library(
    sess_options: ort.SessionOptions | None, status: NativeStatus
) -> ort.SessionOptions | None:
    """``sess_options`` (a new one when None) with the library registered once; unchanged without a library."""
    if status.path is None:
        return sess_options
    so = sess_options if sess_options is not None else ort.SessionOptions()
    if so not in _registered:  # registering twice makes ORT refuse the session ("Domain already set")
        so.register_custom_ops_library(str(status.path))
        _registered.add(so)
    return so
