"""A model past 2 GiB through zonnx: a MatMul -> Relu chain of 33 layers, 4096 wide (2.2 GB of float
weights in external data; quick: 4 layers, 1024 wide).

- ``quantize_static`` (8 samples, external data) time and peak RSS, ours vs ORT's own call with
  ``use_external_data_format=True``, each in a fresh process (``peak_rss``);
- ``zonnx optimize --verify``, ``compile`` and an NPU session (creation and one run) on the result, timed;
  session creation against ORT's session on its own QDQ model (target: <= 2x).
"""

from __future__ import annotations

__all__ = ["bench_large_model"]

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.runner import LOWER, BenchContext, Measurement, peak_rss


def make_chain(path: str, width: int, layers: int) -> None:
    """The chain, written with onnx's own external-data writer (weights in ``path.data``)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]),
            helper.make_node("Relu", [f"h{i}"], [f"r{i}"]),
        ]
        x = f"r{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, width])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save_model(
        model, path, save_as_external_data=True, location=Path(path).name + ".data", size_threshold=1024
    )


class _Reader:
    def __init__(self, width: int) -> None:
        rng = np.random.default_rng(1)
        self.it = iter([{"x": rng.standard_normal((1, width)).astype(np.float32)} for _ in range(8)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.it, None)


def quantize_ours(src: str, dst: str, width: int) -> float:
    from zonnx import quantize_static

    start = time.perf_counter()
    quantize_static(src, dst, _Reader(width), per_channel=True, use_external_data_format=True)
    return time.perf_counter() - start


def quantize_ort(src: str, dst: str, width: int) -> float:
    from onnxruntime.quantization import QuantFormat, quantize_static

    start = time.perf_counter()
    quantize_static(
        src,
        dst,
        _Reader(width),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        use_external_data_format=True,
    )
    return time.perf_counter() - start


def bench_large_model(ctx: BenchContext) -> list[Measurement]:
    import onnxruntime as ort

    import zonnx
    from zonnx.backend.compile_api import compile_model
    from zonnx.build_npu import target_quantize_kwargs

    width, layers = (1024, 4) if ctx.quick else (4096, 33)
    weights_gb = width * width * 4 * layers / 1e9
    out: list[Measurement] = []
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        src, ours, peer = f"{tmp}/m.onnx", f"{tmp}/q.onnx", f"{tmp}/q_ort.onnx"
        make_chain(src, width, layers)
        t0 = time.perf_counter()
        mem_ours = peak_rss(quantize_ours, src, ours, width, timeout=3600)
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        mem_peer = peak_rss(quantize_ort, src, peer, width, timeout=3600)
        t_peer = time.perf_counter() - t0
        out.append(Measurement(f"quantize_static {weights_gb:.2f} GB (process wall time)", t_ours, "s", LOWER,
                               peer="ORT", peer_value=t_peer, target=1.0))  # fmt: skip
        out.append(Measurement("quantize_static peak RSS / weight bytes", mem_ours.peak / 1e9 / weights_gb, "x", LOWER,
                               peer="ORT", peer_value=mem_peer.peak / 1e9 / weights_gb, note="target 1.5x"))  # fmt: skip
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "zonnx.tools.main", "optimize", src, f"{tmp}/o.onnx", "--verify"],
                              capture_output=True, text=True)  # fmt: skip
        out.append(Measurement("optimize --verify", time.perf_counter() - t0, "s", LOWER,
                               note="ok" if proc.returncode == 0 else f"failed: {proc.stderr.strip()[-200:]}"))  # fmt: skip
        qnpu = f"{tmp}/q_npu.onnx"
        zonnx.quantize_static(
            src, qnpu, _Reader(width), **target_quantize_kwargs("bm1684x"), use_external_data_format=True
        )
        t0 = time.perf_counter()
        compiled = compile_model(qnpu, "bm1684x")
        compiled.save(f"{tmp}/c.onnx")
        out.append(Measurement("compile bm1684x", time.perf_counter() - t0, "s", LOWER,
                               note=f"{100 * compiled.partition.mac_share:.1f}% of MACs on the NPU"))  # fmt: skip
        del compiled
        feed = {"x": np.ones((1, width), np.float32)}
        t0 = time.perf_counter()
        sess = zonnx.InferenceSession(f"{tmp}/c.onnx", providers=["ZonnxNPUExecutionProvider", "CPUExecutionProvider"],
                                      provider_options=[{"target": "bm1684x", "enable_cache": False}, {}])  # fmt: skip
        t_npu = time.perf_counter() - t0
        t0 = time.perf_counter()
        ort_sess = ort.InferenceSession(peer)
        t_ort = time.perf_counter() - t0
        out.append(Measurement("session creation on the compiled model", t_npu, "s", LOWER, peer="ORT on its QDQ",
                               peer_value=t_ort, target=2.0))  # fmt: skip
        t_run = ctx.time(lambda: sess.run(None, feed)).median
        t_ort_run = ctx.time(lambda: ort_sess.run(None, feed)).median
        out.append(
            Measurement(
                "one run, batch 1", 1000 * t_run, "ms", LOWER, peer="ORT int8", peer_value=1000 * t_ort_run
            )
        )
    return out
