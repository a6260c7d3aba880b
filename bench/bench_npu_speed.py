"""Speed of a compiled ResNet-18 NPU program lowered to native ORT integer ops, against ORT's own QDQ int8
execution of the same quantized model (peer), per target; the numpy reference executor's speed too.

Ours runs the whole-model program (integer codes in, integer codes out) through ``program_to_model``;
the peer runs the QDQ int8 model (per-channel u8s8, float in and out) with ORT's default optimizations
for every target (the DPU program comes from a FixNeuron model of the same network). Every timed
ORT output is first checked bit for bit against the numpy reference on the same input.
"""

from __future__ import annotations

__all__ = ["bench_npu_speed", "build_programs"]

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantFormat, QuantType

import zonnx
from bench.bench_zoo_ort import session
from bench.runner import HIGHER, BenchContext, Measurement
from zonnx import zoo
from zonnx.backend.compiler import Program, compile_subgraph, whole_model_subgraph
from zonnx.backend.runtime import run_program
from zonnx.backend.runtime.ort_lowering import program_to_model
from zonnx.quantization.calibration.readers import ListReader

#: (quantized format, target): QDQ float scales on the multiplier targets, FixNeuron on the DPU.
CASES = [("qdq", "bm1684x"), ("qdq", "zhouyi-x2"), ("fix", "dpu-b4096")]


def _quantize(src: Path, dst: Path, feeds: list[dict], fmt: str) -> Path:
    if fmt == "qdq":
        args = dict(
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
    else:
        args = dict(
            quant_format=zonnx.VitisQuantFormat.FixNeuron,
            calibrate_method=zonnx.PowerOfTwoMethod.NonOverflow,
            extra_options={"Target": "dpu-b4096"},
        )
    zonnx.quantize_static(str(src), str(dst), ListReader(feeds), **args)
    return dst


def build_programs(tmp: Path, cases: list[tuple[str, str]], n_calib: int = 4) -> dict:
    """{(fmt, target): (quantized path, Program)} for the ResNet-18 zoo model (always writes qdq.onnx)."""
    src = zoo.get("resnet18")
    calib = zoo.sample_inputs("resnet18", n_calib, seed=1)
    paths = {fmt: _quantize(src, tmp / f"{fmt}.onnx", calib, fmt) for fmt in {"qdq"} | {f for f, _ in cases}}
    out = {}
    for fmt, target in cases:
        model = onnx.load(paths[fmt])
        names, ins, outs = whole_model_subgraph(model)
        out[(fmt, target)] = (paths[fmt], compile_subgraph(model, names, ins, outs, target))
    return out


def _input_codes(program: Program, x: np.ndarray) -> np.ndarray:
    info = program.inputs[0]
    q = np.rint(x.astype(np.float64) / info.scale[0]) + info.zero_point[0]
    return np.clip(q, info.qmin, info.qmax).astype(info.dtype)


def _measure(ctx: BenchContext, target: str, qpath: Path, program: Program, tmp: Path) -> list[Measurement]:
    x = zoo.sample_inputs("resnet18", 1)[0]["input"]
    model_path = tmp / f"npu_{target}.onnx"
    onnx.save(program_to_model(program, name="npu"), model_path)
    ours = session(model_path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    peer = session(qpath, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    q = _input_codes(program, x)
    feed = {ours.get_inputs()[0].name: q}
    ref_feed = {program.inputs[0].name: q}
    ref = run_program(program, ref_feed)[program.outputs[0].name]
    if not np.array_equal(ours.run(None, feed)[0].astype(np.int64), ref):
        raise AssertionError(f"{target}: the ORT lowering differs from the numpy reference")
    t_ours, t_peer = ctx.time_pair(lambda: ours.run(None, feed), lambda: peer.run(None, {"input": x}))
    t_ref = ctx.time(lambda: run_program(program, ref_feed))
    common = dict(unit="images/s", direction=HIGHER, peer="ORT QDQ int8", peer_value=1 / t_peer.median)
    return [
        Measurement(f"resnet18 NPU program in ORT, {target}", 1 / t_ours.median, target=0.8, **common),
        Measurement(f"resnet18 NPU program, numpy reference, {target}", 1 / t_ref.median, **common),
    ]


def bench_npu_speed(ctx: BenchContext) -> list[Measurement]:
    """Images/s (batch 1) of the lowered program vs ORT QDQ int8 per target (target 0.8x), and numpy's."""
    cases = CASES[:1] if ctx.quick else CASES
    results = []
    with tempfile.TemporaryDirectory(prefix="zonnx-npu-bench-") as d:
        tmp = Path(d)
        for (_, target), (_, program) in build_programs(tmp, cases).items():
            results += _measure(ctx, target, tmp / "qdq.onnx", program, tmp)
    return results
