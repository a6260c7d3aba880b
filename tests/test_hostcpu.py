"""The host's integer instruction set, ORT's u8 x s8 behaviour on it, and the integer path zonnx picks."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from zonnx import hostcpu
from zonnx.errors import ZonnxError
from zonnx.hostcpu import choose_path, host_int, host_isa, probe_u8s8_exact

pytestmark = pytest.mark.exactness


def test_isa_is_classified_and_the_path_is_exact_here() -> None:
    host = host_int()
    assert host.isa == host_isa()
    assert host.path in ("u8s8", "u8u8")
    if host.path == "u8s8":  # only where ORT's u8 x s8 kernels were seen to be exact
        assert host.u8s8_exact and host.isa in ("amx-int8", "avx512-vnni", "avx-vnni")
    if host.isa in ("avx2", "avx512bw"):  # ORT's u8 x s8 kernels add products in saturating int16 pairs
        assert not host.u8s8_exact and host.path == "u8u8"
    assert host.isa in host.describe() and host.path in host.describe()


def test_probe_is_a_real_ort_run() -> None:
    """The probe's verdict matches a direct MatMulInteger run of the same worst case."""
    import onnxruntime as ort

    sess = ort.InferenceSession(hostcpu._probe_model(64), providers=["CPUExecutionProvider"])
    y = sess.run(None, {"a": np.full((2, 64), 255, np.uint8)})[0]
    assert probe_u8s8_exact() == bool(np.all(y == 64 * 255 * 127))
    if not probe_u8s8_exact():
        assert int(y[0, 0]) == 32 * 32767  # 32 saturated pairs: the documented failure


@pytest.mark.parametrize("exact", [True, False])
def test_choosing_and_forcing_a_path(exact: bool) -> None:
    assert choose_path("avx512-vnni", exact).path == ("u8s8" if exact else "u8u8")
    assert choose_path("amx-int8", exact).path == ("u8s8" if exact else "u8u8")
    for isa in ("avx2", "sse4.1", "avx512bw", "unknown (aarch64)"):
        assert choose_path(isa, exact).path == "u8u8"
    assert choose_path("avx512-vnni", exact, "u8u8").path == "u8u8"
    if exact:
        assert choose_path("avx2", exact, "u8s8").path == "u8s8"
    else:
        with pytest.raises(ZonnxError, match="u8s8 refused.*saturate.*avx2"):
            choose_path("avx2", exact, "u8s8")
    with pytest.raises(ZonnxError, match="use auto, u8u8 or u8s8"):
        choose_path("avx2", exact, "fast")


def test_forced_path_in_a_new_process() -> None:
    """``ZONNX_INT_PATH`` reaches ``int_path()`` (a native child: qemu-user does not follow exec)."""
    env = {**os.environ, hostcpu.INT_PATH_ENV: "u8u8"}
    code = "from zonnx.hostcpu import int_path; print(int_path())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "u8u8", out.stderr
