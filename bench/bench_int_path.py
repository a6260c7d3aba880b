"""What exactness costs: the u8 x u8 integer forms against ORT's u8 x s8 kernels, one convolution at a time
and on whole ResNet-18 NPU programs, timed alternately in one process.

u8 x s8 saturates on x86 without VNNI (``zonnx.hostcpu``), so on such a host the peer is ORT's fast but
inexact kernel and ours the exact form zonnx uses there (target: at most 15% slower, ratio >= 0.87). On
a VNNI host zonnx keeps u8 x s8 (exact there), so the lines only show what u8 x u8 would cost and carry
no target. Every whole-model
line checks the u8 x u8 lowering against the numpy reference bit for bit first and says whether the
u8 x s8 one is exact on this host.
"""

from __future__ import annotations

__all__ = ["bench_int_path"]

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from bench.bench_npu_speed import build_programs
from bench.bench_zoo_ort import session
from bench.runner import HIGHER, BenchContext, Measurement
from zonnx import zoo
from zonnx.backend.runtime.ort_lowering import program_to_model
from zonnx.backend.runtime.reference import run_program
from zonnx.hostcpu import host_int

_MS = "com.microsoft"
_TARGET = 1 / 1.15  # exactness costs at most 15%


def _one_node(node: onnx.NodeProto, x: np.ndarray, out_type: int, inits: dict[str, np.ndarray]) -> bytes:
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", out_type, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(_MS, 1)])
    model.ir_version = 10
    return model.SerializeToString()


def _runner(data: bytes, x: np.ndarray) -> Callable[[], object]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, {"x": x})


def _weights(w: np.ndarray, path: str, per_channel: int = 0) -> tuple[np.ndarray, np.ndarray]:
    shape = (per_channel,) if per_channel else ()
    if path == "u8u8":
        return (w.astype(np.int16) + 128).astype(np.uint8), np.full(shape, 128, np.uint8)
    return w, np.zeros(shape, np.int8)


def _layers(rng: np.random.Generator) -> dict[str, Callable[[str], tuple[bytes, np.ndarray]]]:
    """ResNet/MobileNet-shaped layers, each as a function of the integer path."""
    x_nhwc = rng.integers(0, 256, (1, 56, 56, 64), dtype=np.uint8)
    col = rng.integers(0, 256, (3136, 576), dtype=np.uint8)
    w_mm = rng.integers(-128, 128, (576, 64), dtype=np.int8)
    w_conv = rng.integers(-128, 128, (64, 64, 3, 3), dtype=np.int8)
    w_dw = rng.integers(-128, 128, (64, 1, 3, 3), dtype=np.int8)

    def mm(path: str) -> tuple[bytes, np.ndarray]:
        w, wz = _weights(w_mm, path)
        node = helper.make_node("MatMulInteger", ["x", "w", "xz", "wz"], ["y"])
        return _one_node(node, col, TensorProto.INT32, {"w": w, "xz": np.uint8(3), "wz": wz}), col

    def qconv(w0: np.ndarray, group: int) -> Callable[[str], tuple[bytes, np.ndarray]]:
        def make(path: str) -> tuple[bytes, np.ndarray]:
            w, wz = _weights(w0, path, 64)
            node = helper.make_node(
                "QLinearConv",
                ["x", "one", "xz", "w", "ws", "wz", "one", "xz"],
                ["y"],
                pads=[1, 1, 1, 1],
                group=group,
                channels_last=1,
                domain=_MS,
            )
            inits = {
                "one": np.float32(1),
                "xz": np.uint8(3),
                "w": w,
                "ws": np.full(64, 2.0**-14, np.float32),
                "wz": wz,
            }
            return _one_node(node, x_nhwc, TensorProto.UINT8, inits), x_nhwc

        return make

    return {
        "MatMulInteger 3136x576 @ 576x64 (im2col of a 3x3 64->64 conv)": mm,
        "QLinearConv 3x3 64->64, 56x56, channels-last": qconv(w_conv, 1),
        "QLinearConv depthwise 3x3 x64, 56x56, channels-last": qconv(w_dw, 64),
    }


def _line(name: str, times: tuple, unit: str, peer: str, target: float | None, note: str) -> Measurement:
    """Throughput of ours (u8 x u8) against the peer (u8 x s8) from their interleaved timings."""
    t_ours, t_peer = times
    return Measurement(
        name,
        1 / t_ours.median,
        unit,
        HIGHER,
        peer=peer,
        peer_value=1 / t_peer.median,
        target=target,
        note=note,
    )


def _layer_lines(ctx: BenchContext, note: str, target: float | None) -> list[Measurement]:
    out = []
    for name, make in _layers(np.random.default_rng(0)).items():
        ours, peer = (_runner(*make(p)) for p in ("u8u8", "u8s8"))
        t_ours, t_peer = ctx.time_pair(ours, peer)
        out.append(
            _line(f"{name}: u8 x u8 vs u8 x s8", (t_ours, t_peer), "runs/s", "ORT u8 x s8", target, note)
        )
    return out


def _model_lines(ctx: BenchContext, note: str, target: float | None) -> list[Measurement]:
    cases = (
        [("qdq", "bm1684x")]
        if ctx.quick
        else [("qdq", "bm1684x"), ("qdq", "zhouyi-x2"), ("qdq", "dpu-b4096")]
    )
    x = zoo.sample_inputs("resnet18-random", 1)[0]["input"]
    out = []
    with tempfile.TemporaryDirectory(prefix="zonnx-int-path-") as d:
        tmp = Path(d)
        for (_, tname), (_, program) in build_programs(tmp, cases).items():
            info = program.inputs[0]
            q = np.clip(np.rint(x / info.scale[0]) + info.zero_point[0], info.qmin, info.qmax).astype(
                info.dtype
            )
            ref = run_program(program, {info.name: q})[program.outputs[0].name]
            sessions, exact = {}, {}
            for path in ("u8u8", "u8s8"):
                file = tmp / f"{tname}_{path}.onnx"
                onnx.save(program_to_model(program, name="npu", int_path=path), file)
                sessions[path] = session(file, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
                got = sessions[path].run(None, {f"npu/{info.name}": q})[0]
                exact[path] = bool(np.array_equal(got.astype(np.int64), ref))
            if not exact["u8u8"]:
                raise AssertionError(
                    f"{tname}: the u8 x u8 lowering differs from the numpy reference on "
                    f"{program.outputs[0].name!r} ({host_int().describe()})"
                )
            feed = {f"npu/{info.name}": q}
            t_ours, t_peer = ctx.time_pair(
                lambda s=sessions["u8u8"], f=feed: s.run(None, f),
                lambda s=sessions["u8s8"], f=feed: s.run(None, f),
            )
            exact_note = f"{note}; u8 x s8 exact here: {'yes' if exact['u8s8'] else 'NO'}"
            name = f"resnet18-random NPU program, {tname}: u8 x u8 vs u8 x s8"
            out.append(_line(name, (t_ours, t_peer), "images/s", "u8 x s8 lowering", target, exact_note))
    return out


def bench_int_path(ctx: BenchContext) -> list[Measurement]:
    """u8 x u8 (exact on every CPU) vs u8 x s8 (saturating without VNNI): layers and ResNet-18 programs."""
    host = host_int()
    ctx.describe(
        ["resnet18-random", "single layers with random integer codes"],
        {"calibration": 4, "timed image (batch 1)": 1, "targets": 1 if ctx.quick else 3},
        {"calibration": 1, "timed image": 0, "layer codes": 0},
        "each u8 x u8 form timed in the same rounds as its u8 x s8 peer",
    )
    note = f"host {host.isa}, zonnx uses {host.path} here"
    target = _TARGET if host.path == "u8u8" else None  # the cost is only paid where u8 x u8 is used
    return _layer_lines(ctx, note, target) + _model_lines(ctx, note, target)
