"""Worst-case one-op programs (every product 255 x 127, where ORT's u8 x s8 kernels saturate without VNNI)
give the reference's bits on this host's integer path and on the u8 x u8 path, whatever the CPU.

These run in CI under emulated AVX2 (no VNNI) and SSE4.1 CPUs too (marker ``exactness``).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tests.backend.test_ort_lowering import _info, _program
from zonnx.backend.compiler import Op, quantize_multiplier
from zonnx.backend.runtime.ort_lowering import lower_program, program_to_model
from zonnx.backend.runtime.reference import run_program
from zonnx.hostcpu import host_int

pytestmark = pytest.mark.exactness
PATHS = [None, "u8u8"]  # None: this host's own path (u8s8 with VNNI, else u8u8)


def _exact(prog, feeds: dict[str, np.ndarray], path: str | None) -> dict[str, np.ndarray]:
    """Every program tensor from ORT equals the reference; returns the reference tensors."""
    ref = run_program(prog, feeds, debug=True)
    inner = [t for t in ref if t not in feeds]
    model = program_to_model(prog, name="p", expose=inner, int_path=path)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = sess.run(None, {f"p/{k}": v for k, v in feeds.items()})
    got = {o.name[2:]: v for o, v in zip(sess.get_outputs(), outs, strict=True)}
    isa = host_int().isa
    for t in inner:
        diff = int(np.sum(got[t].astype(np.int64) != ref[t]))
        assert diff == 0, f"program {prog.name!r}, tensor {t!r}: {diff} codes differ on {isa} (path {path})"
    return ref


def _kinds(prog, path: str | None) -> set[str]:
    return {n.op_type for n in lower_program(prog, name="p", int_path=path).nodes}


def _conv_op(w: np.ndarray, group: int, multiplier: np.ndarray, shift: np.ndarray, pads: int = 1) -> Op:
    attrs = {
        "strides": [1, 1],
        "pads": [pads] * 4,
        "dilations": [1, 1],
        "group": group,
        "pad_value": 0,
        "zp_out": 0,
        "lo": -128,
        "hi": 127,
        "round_mode": "half_up",
    }
    o = w.shape[0]
    params = {"w": w, "bias": np.zeros(o, np.int64), "multiplier": multiplier, "shift": shift}
    return Op("conv", "c", ["x"], ["y"], attrs, params)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("group", "pof2"), [(1, True), (1, False), (16, True), (4, False)])
def test_conv_with_saturating_products(path: str | None, group: int, pof2: bool) -> None:
    """Codes 127 (stored 255) times weights 100 (a pair of products exceeds int16): QLinearConv (power-of-two), im2col + MatMulInteger
    (general multiplier), depthwise QLinearConv and grouped ConvInteger all give the exact sums."""
    c = 16
    w = np.full((c, c // group, 3, 3), 100, np.int8)
    w[:, :, 0, 0] = 99  # not all equal, so a wrong tap order would show too
    k = (c // group) * 9
    acc = k * 127 * 100
    if pof2:  # y = acc / 2^s within int8
        s = max(0, int(np.ceil(np.log2(acc / 120))))
        mult, shift = np.ones(c, np.int64), np.full(c, s)
    else:
        m, s = quantize_multiplier(90.0 / acc, 15)
        mult, shift = np.full(c, m), np.full(c, s)
    prog = _program([_conv_op(w, group, mult, shift)], [_info("x", "int8"), _info("y", "int8")])
    x = np.full((1, c, 6, 6), 127, np.int8)
    ref = _exact(prog, {"x": x}, path)
    assert 60 <= int(ref["y"][0, 0, 3, 3]) <= 120  # an unsaturated interior output: the test can fail
    kinds = _kinds(prog, path)
    if group == 1 and not pof2:
        assert "MatMulInteger" in kinds
    elif pof2:
        assert "QLinearConv" in kinds


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dt_in", ["int8", "int16"])
def test_matmul_with_saturating_products(path: str | None, dt_in: str) -> None:
    """A matmul of 64 products 255 x 127 per output (and the byte-plane form for 16-bit inputs)."""
    k, n = 64, 8
    w = np.full((k, n), 127, np.int8)
    w[0] = -128
    hi = 127 if dt_in == "int8" else 32767
    acc = (k - 1) * hi * 127
    m, s = quantize_multiplier(100.0 / acc, 31)
    op = Op(
        "matmul",
        "m",
        ["x"],
        ["y"],
        {"zp_out": 0, "lo": -128, "hi": 127, "round_mode": "half_up"},
        {"w": w, "bias": np.zeros(n, np.int64), "multiplier": np.array([m]), "shift": np.array([s])},
    )
    prog = _program([op], [_info("x", dt_in), _info("y", "int8")])
    x = np.full((4, k), hi, dt_in)
    ref = _exact(prog, {"x": x}, path)
    assert 80 <= int(ref["y"][0, 0]) <= 120
    assert "MatMulInteger" in _kinds(prog, path)


def test_lowering_uses_the_host_path() -> None:
    """u8 x s8 weights appear only on the u8s8 path; the u8u8 path has no int8 weight initializer."""
    w = np.full((8, 8, 3, 3), 100, np.int8)
    prog = _program([_conv_op(w, 1, np.full(8, 3), np.full(8, 20))], [_info("x", "int8"), _info("y", "int8")])
    for path in ("u8s8", "u8u8"):
        low = lower_program(prog, name="p", int_path=path)
        int8 = [i.name for i in low.initializers if i.data_type == 3 and i.dims]
        assert bool(int8) == (path == "u8s8"), (path, int8)


@pytest.mark.parametrize("kernels", ["native", "onnx"])
def test_a_warm_session_opens_its_stored_executable_exactly(tmp_path, kernels: str) -> None:
    """The cache stores the lowered executable in this host's exact integer form (u8 x u8 weights where
    ORT's u8 x s8 kernels saturate) and a warm session opens it as stored: cold, warm and the numpy
    reference executor give the same bits on this CPU."""
    import zonnx
    from zonnx import zoo
    from zonnx.quantization.calibration.readers import ListReader

    feeds = zoo.sample_inputs("digits_cnn", 4, seed=2)
    q = tmp_path / "digits_u8s8.onnx"
    zonnx.quantize_static(
        str(zoo.get("digits_cnn")), str(q), ListReader(feeds), per_channel=True,
        activation_type="uint8", weight_type="int8", extra_options={"Target": "zhouyi-x2"},
    )  # fmt: skip

    def session(**extra: str) -> zonnx.InferenceSession:
        opts = {"target": "zhouyi-x2", "cache_dir": str(tmp_path / "cache"), **extra}
        return zonnx.InferenceSession(
            str(q), providers=[("ZonnxNPUExecutionProvider", opts), "CPUExecutionProvider"]
        )

    cold, warm = session(kernels=kernels), session(kernels=kernels)
    ref = session(executor="reference", enable_cache="0")
    assert not cold.from_cache and warm.from_cache and warm.executor == "ort"
    for f in feeds:
        want = ref.run(None, f)[0]
        assert np.array_equal(cold.run(None, f)[0], want), host_int().isa
        assert np.array_equal(warm.run(None, f)[0], want), host_int().isa
