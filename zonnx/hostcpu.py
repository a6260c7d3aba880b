"""Which of ORT's CPU integer kernels are exact on this host, and the integer path zonnx uses here.

On x86 without VNNI, ORT's u8 x s8 GEMM and convolution kernels (MatMulInteger, QLinearConv,
QLinearMatMul, and the QDQ groups ORT fuses into them) add pairs of products in saturating 16-bit
registers: 64 products of 255 x 127 give 1,048,544 instead of 2,072,640. u8 x u8 (weights shifted by
+128, zero point 128), s8 x s8 and s8 x u8 are exact there; with VNNI or AMX every form is exact.

The rule zonnx follows: the fast u8 x s8 form only where the host's integer instruction set adds
products in 32 bits (AVX-512 VNNI, AVX-VNNI, AMX-INT8) *and* a one-node probe in ORT confirms it; u8 x
u8 everywhere else, including hosts whose instruction set cannot be classified (one warning line).
``ZONNX_INT_PATH=u8u8`` forces the exact-everywhere form (tests use it to cover both paths on any
host); ``ZONNX_INT_PATH=u8s8`` is refused where the probe saturates.

On a u8 x u8 host, models that zonnx hands to ORT as they are (QOperator and integer ops, QDQ groups
ORT would fuse into them: reference runs, per-layer reports, CPU parts of NPU sessions) first get
their int8 weights re-encoded as uint8 + 128 (``exact-int-weights`` pass, ``verify.exact_integer_form``),
which keeps every product. ORT's own switch for this, ``session.x64quantprecision``, only acts at the
extended optimization level, misses the channels-last QLinearConv, and failed at session creation on a
lowered NPU model here, so zonnx does not use it.
"""

from __future__ import annotations

__all__ = [
    "IntPath",
    "HostInt",
    "host_isa",
    "cpu_name",
    "probe_u8s8_exact",
    "host_int",
    "choose_path",
    "int_path",
    "INT_PATH_ENV",
]

import dataclasses
import functools
import logging
import os
import platform
from typing import Literal

import numpy as np

from zonnx.errors import ZonnxError

logger = logging.getLogger(__name__)

IntPath = Literal["u8s8", "u8u8"]
INT_PATH_ENV = "ZONNX_INT_PATH"

#: Instruction sets whose u8 x s8 dot products accumulate in 32 bits (no 16-bit pair saturation).
_WIDE_ISAS = ("amx-int8", "avx512-vnni", "avx-vnni")
#: numpy's CPUID feature names -> our ISA names, best first.
_NUMPY_FEATURES = (
    ("AVX512_SPR", "amx-int8"),  # Sapphire Rapids class (confirmed by /proc/cpuinfo's amx_int8)
    ("AVX512VNNI", "avx512-vnni"),
    ("AVX512BW", "avx512bw"),
    ("AVX2", "avx2"),
    ("SSE41", "sse4.1"),
)
_CPUINFO_FLAGS = (
    ("amx_int8", "amx-int8"),
    ("avx512_vnni", "avx512-vnni"),
    ("avx_vnni", "avx-vnni"),
    ("avx512bw", "avx512bw"),
    ("avx2", "avx2"),
    ("sse4_1", "sse4.1"),
)


@dataclasses.dataclass(frozen=True)
class HostInt:
    """What this host's CPU does with 8-bit integer products, and the form zonnx's lowering uses."""

    isa: str  # amx-int8, avx512-vnni, avx-vnni, avx512bw, avx2, sse4.1, or unknown (...)
    u8s8_exact: bool  # the probe: ORT's u8 x s8 kernels gave the exact sums here
    path: IntPath
    reason: str

    def describe(self) -> str:
        """One line: instruction set, whether u8 x s8 is exact, and the path used."""
        exact = "exact" if self.u8s8_exact else "SATURATES (16-bit pairs)"
        return (
            f"integer ISA {self.isa}; ORT u8 x s8: {exact}; zonnx integer path: {self.path} ({self.reason})"
        )


def _isa_from_numpy() -> str | None:
    """The best integer ISA by CPUID, as numpy detected it at import (CPUID itself: right under emulation)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # pragma: no cover - numpy < 2
        try:
            from numpy.core._multiarray_umath import __cpu_features__ as features
        except ImportError:
            return None
    if not features:
        return None
    for key, name in _NUMPY_FEATURES:
        if features.get(key):
            return name
    return "x86-64" if "SSE2" in features else None


def _isa_from_cpuinfo() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), None)
    if not flags:
        return None
    for flag, name in _CPUINFO_FLAGS:
        if flag in flags:
            return name
    return "x86-64"


@functools.cache
def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` or the machine type elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_isa() -> str:
    """The host's best integer instruction set (``unknown (<machine>)`` when it cannot be classified)."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return f"unknown ({machine or 'no machine name'})"
    isa, flags = _isa_from_numpy(), _isa_from_cpuinfo()
    if isa == "amx-int8" and flags != "amx-int8":
        isa = "avx512-vnni"  # numpy's Sapphire Rapids group does not name AMX itself
    elif isa == "avx2" and flags == "avx-vnni":
        isa = "avx-vnni"  # numpy does not detect AVX-VNNI; the kernel's flags do (the probe still decides)
    return isa or flags or "unknown (x86_64, no CPUID features)"


def _probe_model(k: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    b = numpy_helper.from_array(np.full((k, 4), 127, np.int8), "b")
    zp = numpy_helper.from_array(np.array(0, np.uint8), "zp")
    node = helper.make_node("MatMulInteger", ["a", "b", "zp"], ["y"])
    graph = helper.make_graph(
        [node],
        "u8s8_probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [None, 4])],
        [b, zp],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def probe_u8s8_exact() -> bool:
    """Whether ORT's MatMulInteger u8 x s8 adds 255 x 127 products exactly here (pairs overflow int16)."""
    import onnxruntime as ort

    k = 64
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(_probe_model(k), opts, providers=["CPUExecutionProvider"])
    got = sess.run(None, {"a": np.full((8, k), 255, np.uint8)})[0]
    return bool(np.all(got.astype(np.int64) == k * 255 * 127))


def choose_path(isa: str, u8s8_exact: bool, forced: str = "auto") -> HostInt:
    """The integer path for a host with instruction set ``isa`` and probe result ``u8s8_exact``.

    ``forced`` is ``ZONNX_INT_PATH`` (auto, u8u8 or u8s8); u8s8 is refused where the probe saturated.
    """
    forced = forced.strip().lower() or "auto"
    if forced not in ("auto", "u8s8", "u8u8"):
        raise ZonnxError(f"{INT_PATH_ENV}={forced!r} is not an integer path; use auto, u8u8 or u8s8.")
    if forced == "u8s8" and not u8s8_exact:
        raise ZonnxError(
            f"{INT_PATH_ENV}=u8s8 refused: ORT's u8 x s8 kernels saturate on this host ({isa}); "
            "unset it or use u8u8."
        )
    if forced != "auto":
        return HostInt(isa, u8s8_exact, forced, f"forced by {INT_PATH_ENV}")  # type: ignore[arg-type]
    if isa.startswith("unknown"):
        return HostInt(isa, u8s8_exact, "u8u8", "unclassified host: the form exact everywhere")
    if isa in _WIDE_ISAS and u8s8_exact:
        return HostInt(isa, u8s8_exact, "u8s8", "32-bit dot products: u8 x s8 is exact and fastest")
    if isa in _WIDE_ISAS:
        return HostInt(isa, u8s8_exact, "u8u8", "the u8 x s8 probe saturated despite the ISA")
    if u8s8_exact:
        return HostInt(isa, u8s8_exact, "u8u8", "no VNNI: u8 x u8, exact on every kernel ORT may pick here")
    return HostInt(isa, u8s8_exact, "u8u8", "no VNNI: u8 x s8 saturates here, u8 x u8 is exact")


@functools.lru_cache(maxsize=1)
def host_int() -> HostInt:
    """This host's integer facts and path (computed once per process; see the module docstring)."""
    host = choose_path(host_isa(), probe_u8s8_exact(), os.environ.get(INT_PATH_ENV, "auto"))
    if host.isa.startswith("unknown"):
        logger.warning(
            "cannot classify this host's integer instruction set (%s): zonnx uses the u8 x u8 integer path, "
            "exact on every CPU",
            host.isa,
        )
    return host


def int_path() -> IntPath:
    """The integer form the NPU lowering uses for 8-bit weights on this host (``u8s8`` or ``u8u8``)."""
    return host_int().path
