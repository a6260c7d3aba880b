"""16-bit programs in ORT (byte planes, ``ort_wide``) equal the numpy reference; what ORT cannot run falls back."""

from __future__ import annotations

import concurrent.futures
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import zonnx
from tests.backend.native_support import KERNEL_IDS, KERNELS
from tests.backend.test_ort_lowering import _RANGES, _assert_exact, _info, _program
from zonnx.backend.compiler import Op, quantize_multiplier
from zonnx.backend.runtime.ort_lowering import lower_program
from zonnx.errors import ZonnxError
from zonnx.quantization.calibration.readers import ListReader

#: Bit-exactness on this CPU: CI also runs these under emulated AVX2 and SSE4.1 CPUs (tools/exactness.sh).
pytestmark = pytest.mark.exactness


def _params(rng: np.random.Generator, o: int, bits: int) -> dict:
    pairs = [quantize_multiplier(float(r), bits) for r in rng.uniform(1e-6, 4e-5, o)]
    return {"multiplier": np.array([p[0] for p in pairs]), "shift": np.array([p[1] for p in pairs])}


@pytest.mark.parametrize(
    ("dt_in", "w_bits", "group", "mode"),
    [
        ("int16", 8, 1, "half_up"),
        ("int16", 16, 1, "floor"),
        ("uint16", 16, 4, "half_up"),
        ("int8", 16, 1, "ceil"),
    ],
)
@pytest.mark.parametrize("native", KERNELS, ids=KERNEL_IDS)
def test_conv_and_matmul_16bit(dt_in: str, w_bits: int, group: int, mode: str, native: bool) -> None:
    rng = np.random.default_rng(w_bits + group)
    lim = 1 << (w_bits - 1)
    w = rng.integers(-lim, lim, size=(8, 8 // group, 3, 3))
    conv = Op(
        "conv",
        "c",
        ["x"],
        ["h"],
        {
            "strides": [2, 1],
            "pads": [1, 1, 0, 2],
            "dilations": [1, 1],
            "group": group,
            "pad_value": 5,
            "zp_out": -7,
            "lo": -32768,
            "hi": 32767,
            "round_mode": mode,
        },
        {"w": w, "bias": rng.integers(-(1 << 20), 1 << 20, 8), **_params(rng, 8, 15)},
    )
    flat = Op("flatten", "f", ["h"], ["hf"], {"axis": 1})
    k = 8 * 4 * 12  # output 4 x 12 (pads 1,1,0,2; stride 2,1)
    mm = Op(
        "matmul",
        "m",
        ["hf"],
        ["y"],
        {"zp_out": 3, "lo": -32768, "hi": 32767, "round_mode": mode},
        {
            "w": rng.integers(-lim, lim, size=(k, 6)),
            "bias": rng.integers(-9000, 9000, 6),
            **_params(rng, 6, 15),
        },
    )
    infos = [_info("x", dt_in, 5), _info("h", "int16", -7), _info("hf", "int16", -7), _info("y", "int16", 3)]
    lo, hi = _RANGES[dt_in]
    x = rng.integers(lo, hi + 1, size=(2, 8, 9, 11))
    x[0] = hi  # saturating accumulators
    prog = _program([conv, flat, mm], infos)
    kinds = {n.op_type for n in lower_program(prog, name="p").nodes}
    assert "ConvInteger" in kinds and "MatMulInteger" in kinds
    assert _assert_exact(prog, {"x": x.astype(dt_in)}, native) == 3


@pytest.mark.parametrize("native", KERNELS, ids=KERNEL_IDS)
def test_maxpool_16bit(native: bool) -> None:
    pool = Op(
        "maxpool",
        "p",
        ["x"],
        ["y"],
        {
            "kernel": [3, 3],
            "strides": [2, 2],
            "pads": [1, 1, 1, 1],
            "dilations": [1, 1],
            "ceil_mode": 0,
            "global": 0,
        },
        {},
    )
    x = np.random.default_rng(0).integers(-32768, 32768, size=(1, 3, 9, 9)).astype(np.int16)
    assert _assert_exact(_program([pool], [_info("x", "int16"), _info("y", "int16")]), {"x": x}, native) == 1


def _model(pool: str) -> onnx.ModelProto:
    """Conv -> Relu -> pool -> Conv, float, 1x3x16x16 (a small model to quantize to int16)."""
    rng = np.random.default_rng(1)
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [8, 3, 3, 3], rng.normal(0, 0.3, 216).tolist())
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [4, 8, 3, 3], rng.normal(0, 0.2, 288).tolist())
    pool_node = (
        helper.make_node("AveragePool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2])
        if pool == "avg"
        else helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2])
    )
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        pool_node,
        helper.make_node("Conv", ["p", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [w1, w2],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def _int16(tmp_path: Path, pool: str) -> tuple[Path, list[dict]]:
    src, out = tmp_path / f"{pool}.onnx", tmp_path / f"{pool}_a16.onnx"
    onnx.save(_model(pool), src)
    feeds = [
        {"x": np.random.default_rng(i).normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for i in range(4)
    ]
    zonnx.quantize_static(
        src,
        out,
        ListReader(feeds),
        activation_type="int16",
        weight_type="int8",
        extra_options={"Target": "zhouyi-x2"},
    )
    return out, feeds


def _session(path: Path, tmp_path: Path, executor: str) -> zonnx.InferenceSession:
    return zonnx.InferenceSession(
        str(path),
        providers=["ZonnxNPUExecutionProvider", "CPUExecutionProvider"],
        provider_options=[
            {"target": "zhouyi-x2", "cache_dir": str(tmp_path / "cache"), "executor": executor},
            {},
        ],
    )


def test_int16_model_runs_natively(tmp_path: Path) -> None:
    path, feeds = _int16(tmp_path, "max")
    native, ref = _session(path, tmp_path, "auto"), _session(path, tmp_path, "reference")
    assert native.executor == "ort" and native.partition.npu_nodes > 0
    for f in feeds:
        assert np.array_equal(native.run(None, f)[0], ref.run(None, f)[0])


def test_int16_model_concurrent_runs_equal_single_thread(tmp_path: Path) -> None:
    """8 threads calling run() on one 16-bit session (QConv16's per-thread plane buffer, MaxPoolI32) give
    the single-threaded results bit for bit."""
    path, feeds = _int16(tmp_path, "max")
    sess = _session(path, tmp_path, "auto")
    assert sess.kernels is not None and sess.kernels.available
    single = [sess.run(None, f)[0] for f in feeds]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        multi = list(pool.map(lambda f: sess.run(None, f)[0], feeds * 8))
    assert all(np.array_equal(a, b) for a, b in zip(single * 8, multi, strict=True))


def test_unlowerable_program_falls_back_to_reference(tmp_path: Path, caplog) -> None:
    """A windowed average pool on 16-bit codes has no exact ORT lowering: auto falls back, ort refuses."""
    path, feeds = _int16(tmp_path, "avg")
    with caplog.at_level(logging.WARNING):
        sess = _session(path, tmp_path, "auto")
    assert sess.executor == "reference" and "numpy reference executor instead" in caplog.text
    ref = _session(path, tmp_path, "reference")
    assert np.array_equal(sess.run(None, feeds[0])[0], ref.run(None, feeds[0])[0])
    with pytest.raises(ZonnxError, match="8-bit activations"):
        _session(path, tmp_path, "ort")
