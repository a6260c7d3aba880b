"""``zonnx doctor`` names the NPU kernels in use (native library or pure-ONNX lowering) and why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import run_cli
from zonnx.backend.native import conv_isa, native_status


def test_doctor_names_the_native_library() -> None:
    facts = json.loads(run_cli("doctor", "--json", check=True).stdout)
    status = native_status()
    assert facts["npu_kernels"] == ("native" if status.available else "onnx")
    assert facts["npu_kernels_why"] == status.reason
    assert facts["npu_conv_gemm"] == (conv_isa() if status.available else None)


def test_doctor_says_why_without_the_library(tmp_path: Path) -> None:
    """An empty native folder: doctor says the pure-ONNX lowering is in use and how to build the library."""
    env = {**os.environ, "ZONNX_NATIVE_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "zonnx.tools.main", "doctor"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # the console may wrap long lines
    assert "NPU kernels pure-ONNX lowering: the native kernel library is not built" in text
    assert "python -m zonnx.tools.build_native" in text
