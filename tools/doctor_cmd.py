"""``zonnx doctor``: the versions zonnx runs with and what this host's CPU does with 8-bit integer products."""

from __future__ import annotations

__all__ = ["doctor"]

import json
import platform
import sys

import typer

from zonnx import __version__
from zonnx.backend.native import ISA_ENV, KERNELS_ENV, conv_isa, native_status
from zonnx.hostcpu import INT_PATH_ENV, host_int
from zonnx.tools.console import console


def _versions() -> dict[str, str]:
    import numpy
    import onnx
    import onnxruntime

    return {
        "zonnx": __version__,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def doctor(json_: bool = typer.Option(False, "--json", help="Print the facts as JSON.")) -> None:
    """Print versions, the host's integer instruction set, whether ORT's u8 x s8 kernels are exact here,
    and the integer path zonnx's NPU lowering and reference runs use on this host, and whether NPU sessions
    run on the native kernel library or the pure-ONNX lowering (and why).

    Without VNNI, ORT's u8 x s8 kernels add products in saturating 16-bit pairs; zonnx then uses u8 x u8
    weights, which are exact on every CPU. Set ZONNX_INT_PATH=u8u8 to force that form anywhere.
    """
    host = host_int()
    kernels = native_status()
    facts = {
        **_versions(),
        "machine": platform.machine(),
        "integer_isa": host.isa,
        "ort_u8s8_exact": host.u8s8_exact,
        "integer_path": host.path,
        "why": host.reason,
        "npu_kernels": "native" if kernels.available else "onnx",
        "npu_kernels_why": kernels.reason,
        "npu_conv_gemm": conv_isa(kernels) if kernels.available else None,
    }
    if json_:
        sys.stdout.write(json.dumps(facts, indent=1) + "\n")
        return
    for key in ("zonnx", "python", "numpy", "onnx", "onnxruntime", "machine"):
        console.print(f"{key:<16} {facts[key]}", markup=False)
    console.print(f"{'integer ISA':<16} {host.isa}", markup=False)
    verdict = "exact" if host.u8s8_exact else "saturates (16-bit pairs; quantized models run as u8 x u8 here)"
    console.print(f"{'ORT u8 x s8':<16} {verdict}", markup=False)
    console.print(f"{'integer path':<16} {host.path}: {host.reason}", markup=False)
    console.print(f"{'':<16} (set {INT_PATH_ENV}=u8u8 to force the form exact on every CPU)", markup=False)
    which = "native (C++ custom ops)" if kernels.available else "pure-ONNX lowering"
    console.print(f"{'NPU kernels':<16} {which}: {kernels.reason}", markup=False)
    console.print(f"{'':<16} (provider option kernels or {KERNELS_ENV}=native|onnx forces one)", markup=False)
    if kernels.available:
        gemm = facts["npu_conv_gemm"]
        console.print(
            f"{'conv GEMM':<16} {gemm} (fused QConv; {ISA_ENV}=avx-vnni|baseline caps it)", markup=False
        )
