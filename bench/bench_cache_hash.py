"""What keying the compile cache on content costs on a large model: hashing against loading it at all.

The NPU session identifies a source model by the sha256 of its bytes and of every external-data file
(``zonnx.ir.large.model_digest``) on every creation, so an in-place edit is never served an old
program (issue 17, item 15). The work: a float MatMul chain with 604 MB of weights (two 8192 x 8192 and
one 8192 x 2048 float32 matrices, seeded), saved once with its weights as external data, as large models
come. Ours: ``model_digest(path)`` (read and hash the model and its ``.data``). Peer: creating an
``onnxruntime.InferenceSession`` on the same file, which any session pays anyway. Timed in the same
rounds; the ratio is hashing time over the cheapest possible session start. ``--quick``: 42 MB.
"""

from __future__ import annotations

__all__ = ["bench_cache_hash"]

import tempfile
from pathlib import Path

import numpy as np

from bench.runner import LOWER, BenchContext, Measurement


def _chain(path: Path, big: int, small: int) -> int:
    """Save x @ W1 @ W2 @ W3 (W1, W2: big x big; W3: big x small, then small) with external data."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        rng.standard_normal((big, big), np.float32),
        rng.standard_normal((big, big), np.float32),
        rng.standard_normal((big, small), np.float32),
    ]
    nodes = [helper.make_node("MatMul", [f"t{i}", f"w{i}"], [f"t{i + 1}"]) for i in range(3)]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, big])],
        [helper.make_tensor_value_info("t3", TensorProto.FLOAT, [1, small])],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save_model(model, path, save_as_external_data=True, location=path.name + ".data")
    return sum(w.nbytes for w in weights)


def bench_cache_hash(ctx: BenchContext) -> list[Measurement]:
    import onnxruntime as ort

    from zonnx.ir.large import model_digest

    big, small = (2048, 1024) if ctx.quick else (8192, 2048)
    repeat = min(ctx.repeat, 5)
    with tempfile.TemporaryDirectory(prefix="zonnx-bench-hash-") as tmp:
        path = Path(tmp) / "chain.onnx"
        nbytes = _chain(path, big, small)
        ctx.describe([f"MatMul chain, {nbytes / 1e6:.0f} MB float32 weights, external data (seeded, generated)"],
                     seeds={"weights": 0})  # fmt: skip
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        times = BenchContext(repeat, 1, ctx.quick).time_interleaved(
            {
                "hash": lambda: model_digest(path),
                "ort": lambda: ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]),
            }
        )
    ours, peer = times["hash"].median, times["ort"].median
    return [
        Measurement(
            f"content key of a {nbytes / 1e6:.0f} MB model vs ORT session creation",
            ours,
            "s",
            LOWER,
            peer="ORT InferenceSession on the file",
            peer_value=peer,
            note=f"{nbytes / 1e6 / ours:.0f} MB/s hashed",
        )
    ]
