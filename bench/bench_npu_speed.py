"""Speed of ResNet-18 compiled for each NPU target and run through ``zonnx.InferenceSession``, against plain
ORT running the same quantized QDQ model (peer), per target; the bare program and the numpy reference too.

Per target the model is quantized in the target's own form as QDQ (per-channel u8s8 float scales for the
multiplier targets; power-of-two int8 via ``Target`` for the DPU), so ours and the peer run the same
file: ours through the NPU provider (float in, float out: the boundary quantize/dequantize included),
the peer through ORT's CPU provider with its QDQ fusions. ORT runs int8-activation (s8s8) and
power-of-two QDQ models much slower than its favourite form, so two more lines compare against ResNet-18
as per-channel u8s8 QDQ (ORT's fastest int8 model of the network): the session, and the compiled
program alone (integer codes in and out, no boundary quantize/dequantize). Every timed ORT output is first
checked bit for bit against the numpy reference executor on the same input.

Per target all five runners (NPU session, same model in ORT, ORT's fastest int8, the program alone, the
numpy reference) are timed in the same rounds, so every ratio follows from the printed numbers. Session
creation is timed in fresh processes (``python -c``, imports done before the clock starts, the lazily
imported backend included): cold on an empty cache directory (compiling), warm on the filled one (best of 3
processes).

Kernels: the session runs on the native kernel library when it is built (``zonnx.backend.native``); two
more lines per target time the session on the native kernels and on the pure-ONNX lowering
(``kernels`` provider option), each interleaved with ORT's fastest int8 form, so both ratios come from
one run; the same two lines for MobileNetV2 (quantized in the target's form, against MobileNetV2 as
per-channel u8s8 QDQ). With $ZONNX_THREADS=1 the native-kernel lines and the 16-bit line are repeated
in thread CPU time (``_cpu_pair``: same alternation, ``time.thread_time``), which a loaded shared host
does not skew. On zhouyi-x2 ResNet-18 with 16-bit activations is timed against its own 8-bit program (same
session kind, interleaved), and so is the A16W8 transformer (``transformer-random``, its sequence length
fixed by the ``input_shapes`` provider option, so every MAC is on the NPU) against the same call with int8
activations.
"""

from __future__ import annotations

__all__ = ["bench_npu_speed", "build_programs"]

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantFormat, QuantType

import zonnx
from bench.bench_zoo_ort import session
from bench.runner import HIGHER, LOWER, BenchContext, Measurement, time_call
from zonnx import zoo
from zonnx.backend.compile_api import compile_model
from zonnx.backend.compiler import Program
from zonnx.backend.compiler.lower import compile_subgraph, whole_model_subgraph
from zonnx.backend.native import native_status, register_library
from zonnx.backend.runtime.ort_lowering import program_to_model
from zonnx.backend.runtime.reference import run_program
from zonnx.build_npu import target_quantize_kwargs
from zonnx.hostcpu import host_int
from zonnx.quantization.calibration.readers import ListReader


def _cpu_pair(
    ctx: BenchContext, ours: Callable[[], object], peer: Callable[[], object]
) -> tuple[float, float] | None:
    """Median thread CPU seconds of ``ours`` and ``peer``, timed alternately like ``time_pair``; None unless
    both run on one intra-op thread ($ZONNX_THREADS=1), where ORT computes on the calling thread so its
    CPU time is the whole run's. On a loaded host wall-clock medians favour the shorter call (it fits a
    time slice more often); CPU time does not depend on the other processes' share."""
    if os.environ.get("ZONNX_THREADS") != "1":
        return None
    for _ in range(ctx.warmup):
        ours()
        peer()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(ctx.repeat):
        for fn, acc in zip((ours, peer), times, strict=True):
            start = time.thread_time()
            fn()
            acc.append(time.thread_time() - start)
    return statistics.median(times[0]), statistics.median(times[1])


#: (quantized format, target): QDQ in each target's own form (``_quantize``).
CASES = [("qdq", "bm1684x"), ("qdq", "zhouyi-x2"), ("qdq", "dpu-b4096")]


def _quantize(src: Path, dst: Path, feeds: list[dict], fmt: str, target: str) -> Path:
    """QDQ (or FixNeuron for ``fmt == "fix"``) in the scheme the target accepts (``target_quantize_kwargs``)."""
    kwargs = target_quantize_kwargs(
        target, zonnx.VitisQuantFormat.FixNeuron if fmt == "fix" else QuantFormat.QDQ
    )
    zonnx.quantize_static(str(src), str(dst), ListReader(feeds), **kwargs)
    return dst


def build_programs(tmp: Path, cases: list[tuple[str, str]], n_calib: int = 4) -> dict:
    """{(fmt, target): (quantized path, Program)} for the ResNet-18 zoo model."""
    src = zoo.get("resnet18-random")
    calib = zoo.sample_inputs("resnet18-random", n_calib, seed=1)
    out = {}
    for fmt, target in cases:
        path = _quantize(src, tmp / f"{fmt}_{target}.onnx", calib, fmt, target)
        model = onnx.load(path)
        names, ins, outs = whole_model_subgraph(model)
        out[(fmt, target)] = (path, compile_subgraph(model, names, ins, outs, target))
    return out


def _input_codes(program: Program, x: np.ndarray) -> np.ndarray:
    info = program.inputs[0]
    q = np.rint(x.astype(np.float64) / info.scale[0]) + info.zero_point[0]
    return np.clip(q, info.qmin, info.qmax).astype(info.dtype)


def _fastest_ort_int8(tmp: Path, model: str = "resnet18-random") -> Path:
    """The zoo model as ORT's fastest int8 form (per-channel u8s8 QDQ): a second, harder peer."""
    dst = tmp / f"u8s8_{model}.onnx"
    if not dst.exists():
        zonnx.quantize_static(
            str(zoo.get(model)),
            str(dst),
            ListReader(zoo.sample_inputs(model, 4, seed=1)),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,  # ORT's default is s8s8, which it runs 2-3x slower here
            weight_type=QuantType.QInt8,
        )
    return dst


# zonnx imports its backend lazily (zonnx.InferenceSession is a module __getattr__): touching the name
# imports it (about 0.7 s here, most of it onnx_ir's sympy) before the clock, as the docstring says.
_CREATE = """
import json, sys, time
import zonnx
zonnx.InferenceSession
path, target, cache = sys.argv[1:4]
start = time.perf_counter()
zonnx.InferenceSession(path, providers=["ZonnxNPUExecutionProvider", "CPUExecutionProvider"],
                       provider_options=[{"target": target, "cache_dir": cache}, {}])
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def fresh_process_creation(qpath: Path, target: str, cache: str) -> float:
    """Seconds to create one NPU session in a new Python process (zonnx imported before the clock starts)."""
    done = subprocess.run(
        [sys.executable, "-c", _CREATE, str(qpath), target, cache],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"session creation in a fresh process failed ({target}): {done.stderr.strip()[-400:]}"
        )
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def _creation(target: str, qpath: Path, tmp: Path) -> list[Measurement]:
    """Compile time (best of 3) and session creation in fresh processes: cold (compiling) vs warm (cache hit)."""
    compile_s = time_call(lambda: compile_model(qpath, target), repeat=3, warmup=0).min
    cache = tempfile.mkdtemp(prefix="zonnx-npu-cache-", dir=tmp)
    cold = fresh_process_creation(qpath, target, cache)  # the first process compiles and fills the cache
    warm = min(fresh_process_creation(qpath, target, cache) for _ in range(3))
    return [
        Measurement(
            f"resnet18-random compile time, {target}",
            compile_s,
            "s",
            LOWER,
            target=10.0,
            note="target < 10 s",
        ),
        Measurement(
            f"resnet18-random session creation in a fresh process, warm cache vs cold, {target}",
            warm,
            "s",
            LOWER,
            peer="cold (compiling)",
            peer_value=cold,
            target=0.1,
            note="target: warm at least 10x faster; warm is the best of 3 processes",
        ),
    ]


def _npu_session(qpath: Path, target: str, tmp: Path, **extra: str) -> zonnx.InferenceSession:
    """An NPU session with $ZONNX_THREADS intra-op threads, like the ORT peers (``bench_zoo_ort.session``)."""
    opts = {"target": target, "cache_dir": str(tmp / "cache"), "min_nodes": "1", **extra}
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(os.environ.get("ZONNX_THREADS", "0"))
    return zonnx.InferenceSession(
        str(qpath),
        so,
        providers=["ZonnxNPUExecutionProvider", "CPUExecutionProvider"],
        provider_options=[opts, {}],
    )


def _kernels(
    ctx: BenchContext, target: str, qpath: Path, tmp: Path, model: str = "resnet18-random"
) -> list[Measurement]:
    """The NPU session on the native kernels and on the pure-ONNX lowering, each vs ORT's fastest int8."""
    x = zoo.sample_inputs(model, 1)[0]["input"]
    fast = session(_fastest_ort_int8(tmp, model), ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    out = []
    sessions = {"onnx": _npu_session(qpath, target, tmp, kernels="onnx")}
    if native_status().available:
        sessions["native"] = _npu_session(qpath, target, tmp, kernels="native")
        a, b = (s.run(None, {"input": x})[0] for s in sessions.values())
        if not np.array_equal(a, b):
            raise AssertionError(f"{model} {target}: native kernels and the ONNX lowering differ")
    for kind, sess in sessions.items():
        t_ours, t_fast = ctx.time_pair(
            lambda s=sess: s.run(None, {"input": x}), lambda: fast.run(None, {"input": x})
        )
        out.append(
            Measurement(
                f"{model.split('-')[0]} NPU session, {kind} kernels, {target}, vs ORT's fastest int8",
                1 / t_ours.median,
                "images/s",
                HIGHER,
                peer="ORT QDQ u8s8 per-channel",
                peer_value=1 / t_fast.median,
                target=1.0,
            )
        )
        cpu = _cpu_pair(ctx, lambda s=sess: s.run(None, {"input": x}), lambda: fast.run(None, {"input": x}))
        if cpu is not None and kind == "native":
            out.append(
                Measurement(
                    f"{model.split('-')[0]} NPU session, native kernels, {target}, vs ORT's fastest int8, "
                    "thread CPU time",
                    1 / cpu[0],
                    "images/s",
                    HIGHER,
                    peer="ORT QDQ u8s8 per-channel",
                    peer_value=1 / cpu[1],
                    target=1.0,
                )
            )
    return out


def _quantize_bits(model: str, dst: Path, bits: int) -> Path:
    """``model`` for zhouyi-x2 with ``bits``-bit activations and int8 weights (the same call for 8 and 16)."""
    zonnx.quantize_static(
        str(zoo.get(model)),
        str(dst),
        ListReader(zoo.sample_inputs(model, 4, seed=1)),
        activation_type=f"int{bits}",
        weight_type="int8",
        extra_options={"Target": "zhouyi-x2"},
    )
    return dst


def _int16_vs_int8(ctx: BenchContext, tmp: Path, model: str, path8: Path | None = None) -> list[Measurement]:
    """``model`` with 16-bit activations vs its 8-bit program on zhouyi-x2, both NPU sessions (target <= 2x);
    the 8-bit program is ``path8`` (ResNet-18: the target's recipe) or the same call with int8 activations."""
    short = model.split("-")[0]
    path16 = _quantize_bits(model, tmp / f"int16_zhouyi_{short}.onnx", 16)
    path8 = path8 or _quantize_bits(model, tmp / f"int8_zhouyi_{short}.onnx", 8)
    feed = zoo.sample_inputs(model, 1)[0]
    # static shapes, as the model is compiled for the NPU (the transformer's sequence length is dynamic)
    shapes = ";".join(f"{k}:{','.join(map(str, v.shape))}" for k, v in feed.items())
    s16 = _npu_session(path16, "zhouyi-x2", tmp, input_shapes=shapes)
    s8 = _npu_session(path8, "zhouyi-x2", tmp, input_shapes=shapes)
    ref = _npu_session(path16, "zhouyi-x2", tmp, executor="reference", input_shapes=shapes)
    if s16.executor != "ort" or not all(
        np.array_equal(a, b) for a, b in zip(s16.run(None, feed), ref.run(None, feed), strict=True)
    ):
        raise AssertionError(
            f"zhouyi-x2 int16 {model}: the NPU session is not on ORT or differs from the reference"
        )
    t16, t8 = ctx.time_pair(lambda: s16.run(None, feed), lambda: s8.run(None, feed))
    kind = "native" if s16.kernels is not None and s16.kernels.available else "onnx"
    out = [
        Measurement(
            f"{short} 16-bit activations, {kind} kernels, zhouyi-x2, time vs its 8-bit program",
            t16.median * 1e3,
            "ms",
            LOWER,
            peer="8-bit program",
            peer_value=t8.median * 1e3,
            target=2.0,
        )
    ]
    cpu = _cpu_pair(ctx, lambda: s16.run(None, feed), lambda: s8.run(None, feed))
    if cpu is not None:
        out.append(
            Measurement(
                f"{short} 16-bit activations, {kind} kernels, zhouyi-x2, time vs its 8-bit program, "
                "thread CPU time",
                cpu[0] * 1e3,
                "ms",
                LOWER,
                peer="8-bit program",
                peer_value=cpu[1] * 1e3,
                target=2.0,
            )
        )
    return out


def _measure(ctx: BenchContext, target: str, qpath: Path, program: Program, tmp: Path) -> list[Measurement]:
    x = zoo.sample_inputs("resnet18-random", 1)[0]["input"]
    prog_path = tmp / f"npu_{target}.onnx"
    status = native_status()
    onnx.save(program_to_model(program, name="npu", native=status.available), prog_path)
    bare_opts = register_library(ort.SessionOptions(), status)
    bare_opts.intra_op_num_threads = int(os.environ.get("ZONNX_THREADS", "0"))
    bare = ort.InferenceSession(str(prog_path), bare_opts, providers=["CPUExecutionProvider"])
    peer = session(qpath, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    npu = _npu_session(qpath, target, tmp)
    q = _input_codes(program, x)
    feed = {bare.get_inputs()[0].name: q}
    ref_feed = {program.inputs[0].name: q}
    ref = run_program(program, ref_feed)[program.outputs[0].name]
    if not np.array_equal(bare.run(None, feed)[0].astype(np.int64), ref):
        raise AssertionError(
            f"{target}: the ORT lowering differs from the numpy reference on {program.outputs[0].name!r} "
            f"({host_int().describe()})"
        )
    check = zonnx.InferenceSession(
        str(qpath),
        providers=["ZonnxNPUExecutionProvider", "CPUExecutionProvider"],
        provider_options=[
            {"target": target, "cache_dir": str(tmp / "cache"), "executor": "reference", "min_nodes": "1"},
            {},
        ],
    )
    if not np.array_equal(npu.run(None, {"input": x})[0], check.run(None, {"input": x})[0]):
        raise AssertionError(
            f"{target}: the NPU session differs from the same session on the numpy reference"
        )
    fast = session(_fastest_ort_int8(tmp), ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    t = ctx.time_interleaved(
        {
            "npu": lambda: npu.run(None, {"input": x}),
            "peer": lambda: peer.run(None, {"input": x}),
            "fast": lambda: fast.run(None, {"input": x}),
            "bare": lambda: bare.run(None, feed),
            "ref": lambda: run_program(program, ref_feed),
        }
    )
    t_ours, t_peer, t_fast, t_bare, t_ref = (t[k] for k in ("npu", "peer", "fast", "bare", "ref"))
    common = dict(unit="images/s", direction=HIGHER, peer="ORT QDQ int8")
    return [
        Measurement(
            f"resnet18-random zonnx.InferenceSession (NPU), {target}",
            1 / t_ours.median,
            target=0.8,
            peer_value=1 / t_peer.median,
            **common,
        ),
        Measurement(
            f"resnet18-random zonnx.InferenceSession (NPU), {target}, vs ORT's fastest int8",
            1 / t_ours.median,
            peer_value=1 / t_fast.median,
            **{**common, "peer": "ORT QDQ u8s8 per-channel"},
        ),
        Measurement(
            f"resnet18-random NPU program alone in ORT, {target}, vs ORT's fastest int8",
            1 / t_bare.median,
            peer_value=1 / t_fast.median,
            **{**common, "peer": "ORT QDQ u8s8 per-channel"},
        ),
        Measurement(
            f"resnet18-random NPU program, numpy reference, {target}",
            1 / t_ref.median,
            peer_value=1 / t_peer.median,
            **common,
        ),
    ]


def bench_npu_speed(ctx: BenchContext) -> list[Measurement]:
    """Images/s (batch 1) of the lowered program vs ORT QDQ int8 per target (target 0.8x), and numpy's."""
    cases = CASES[:1] if ctx.quick else CASES
    ctx.describe(
        ["resnet18-random", "mobilenetv2-random", "transformer-random"],
        {"calibration": 4, "timed image (batch 1)": 1, "targets": len(cases)},
        {"calibration": 1, "timed image": 0},
        "QDQ in each target's scheme (target_quantize_kwargs); ORT_ENABLE_ALL for the ORT peers",
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="zonnx-npu-bench-") as d:
        tmp = Path(d)
        for (_, target), (qpath, program) in build_programs(tmp, cases).items():
            results += _kernels(ctx, target, qpath, tmp)
            mobilenet = _quantize(
                zoo.get("mobilenetv2-random"),
                tmp / f"mobilenetv2_{target}.onnx",
                zoo.sample_inputs("mobilenetv2-random", 4, seed=1),
                "qdq",
                target,
            )
            results += _kernels(ctx, target, mobilenet, tmp, "mobilenetv2-random")
            if target == "zhouyi-x2":
                results += _int16_vs_int8(ctx, tmp, "resnet18-random", qpath)
                results += _int16_vs_int8(ctx, tmp, "transformer-random")  # the A16W8 transformer
            if not ctx.quick:
                results += _measure(ctx, target, qpath, program, tmp) + _creation(target, qpath, tmp)
    return results
