"""A chain of 20 zonnx FixNeuron functions in ORT against the same chain of QuantizeLinear/DequantizeLinear.

Run ``python bench/bench_custom_ops.py`` (prints ms per chain and the ratio) or ``python -m bench.runner
custom_ops``. The tensor is 1x64x56x56 float32; node i uses pos = 4 + i % 3. ORT's default optimizations
replace the peer's 20 Q/DQ pairs by one (its DoubleQDQPairsRemover, which is not exact when the scales
differ), so the peer runs with that one optimizer disabled; the collapsed figure is reported too. The
half_even FixNeuron chain computes exactly what the int8 QDQ chain computes (checked before timing).
"""

from __future__ import annotations

__all__ = ["SHAPE", "CHAIN", "chain_model", "session", "run", "bench_custom_ops", "main"]

import logging
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from zonnx.custom_ops import add_functions, make_node

logger = logging.getLogger(__name__)

SHAPE = (1, 64, 56, 56)
CHAIN = 20


def _pos(i: int) -> int:
    return 4 + i % 3


def chain_model(kind: str, n: int = CHAIN, round_mode: str = "half_even") -> onnx.ModelProto:
    """``kind`` "fixneuron": n zonnx FixNeuron nodes (int8 grid); "qdq": n QuantizeLinear/DequantizeLinear."""
    nodes, inits, prev = [], [], "x"
    for i in range(n):
        out = f"y{i}"
        if kind == "fixneuron":
            nodes.append(
                make_node("FixNeuron", [prev], [out], pos=_pos(i), bit_width=8, round_mode=round_mode)
            )
        else:
            inits += [
                numpy_helper.from_array(np.array(2.0 ** -_pos(i), np.float32), f"s{i}"),
                numpy_helper.from_array(np.array(0, np.int8), f"z{i}"),
            ]
            nodes.append(helper.make_node("QuantizeLinear", [prev, f"s{i}", f"z{i}"], [f"q{i}"]))
            nodes.append(helper.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [out]))
        prev = out
    graph = helper.make_graph(
        nodes,
        f"{kind}_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, list(SHAPE))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return add_functions(model) if kind == "fixneuron" else model


#: The ORT optimizer that merges back-to-back QDQ pairs of different scales (not exact).
PAIR_REMOVER = "DoubleQDQPairsRemover"


def session(model: onnx.ModelProto, disabled: tuple[str, ...] = ()) -> ort.InferenceSession:
    """A CPU session with ORT's default optimizations (less ``disabled``) and $ZONNX_THREADS threads."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = int(os.environ.get("ZONNX_THREADS", "0"))
    return ort.InferenceSession(
        model.SerializeToString(),
        opts,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=list(disabled),
    )


def _pair(
    ours: Callable[[], object], peer: Callable[[], object], repeat: int, warmup: int
) -> tuple[float, float]:
    """Median seconds of each, timed alternately so load changes hit both alike."""
    for _ in range(warmup):
        ours(), peer()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for fn, acc in ((ours, times[0]), (peer, times[1])):
            start = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def run(quick: bool = False, repeat: int | None = None, warmup: int = 3) -> dict[str, float]:
    """Milliseconds per chain: FixNeuron half_even and half_up (ours), int8 QDQ (peer), and setup times."""
    repeat = repeat or (5 if quick else 40)
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32) * 3
    feeds = {"x": x}
    figures: dict[str, float] = {}
    start = time.perf_counter()
    peer = session(chain_model("qdq"), disabled=(PAIR_REMOVER,))
    figures["qdq_setup_ms"] = (time.perf_counter() - start) * 1e3
    collapsed = session(chain_model("qdq"))
    figures["qdq_collapsed_ms"] = (
        _pair(lambda: collapsed.run(None, feeds), lambda: None, repeat, warmup)[0] * 1e3
    )
    for mode in ("half_even", "half_up"):
        start = time.perf_counter()
        ours = session(chain_model("fixneuron", round_mode=mode))
        figures[f"fixneuron_{mode}_setup_ms"] = (time.perf_counter() - start) * 1e3
        if mode == "half_even":
            same = np.array_equal(ours.run(None, feeds)[0], peer.run(None, feeds)[0])
            if not same:
                raise RuntimeError("FixNeuron half_even chain differs from the int8 QDQ chain")
        t_ours, t_peer = _pair(
            lambda s=ours: s.run(None, feeds), lambda: peer.run(None, feeds), repeat, warmup
        )
        figures[f"fixneuron_{mode}_ms"] = t_ours * 1e3
        figures[f"qdq_vs_{mode}_ms"] = t_peer * 1e3
        figures[f"ratio_{mode}"] = t_ours / t_peer
    return figures


def bench_custom_ops(ctx) -> list:  # noqa: ANN001 (BenchContext, imported lazily)
    """bench.runner entry: ms per 20-op chain, ours (FixNeuron functions) against ORT's QDQ (peer)."""
    from bench.runner import LOWER, Measurement

    ctx.describe([f"a chain of {CHAIN} ops on a 1x64x56x56 tensor"], {"input tensors": 1}, {"input": 0})
    figures = run(quick=ctx.quick, repeat=ctx.repeat, warmup=ctx.warmup)
    return [
        Measurement(
            f"{CHAIN} FixNeuron {mode} on 1x64x56x56",
            figures[f"fixneuron_{mode}_ms"],
            "ms",
            LOWER,
            peer="QuantizeLinear+DequantizeLinear",
            peer_value=figures[f"qdq_vs_{mode}_ms"],
            note=(
                f"session setup {figures[f'fixneuron_{mode}_setup_ms']:.0f} ms "
                f"vs {figures['qdq_setup_ms']:.0f} ms"
            ),
        )
        for mode in ("half_even", "half_up")
    ]


def main() -> None:
    quick = "--quick" in sys.argv[1:]
    figures = run(quick=quick)
    from bench.header import host_lines

    print("\n".join(host_lines()))
    print(f"chain of {CHAIN} ops on {'x'.join(map(str, SHAPE))} float32, ORT {ort.__version__}")
    for mode in ("half_even", "half_up"):
        ours, peer = figures[f"fixneuron_{mode}_ms"], figures[f"qdq_vs_{mode}_ms"]
        print(
            f"  FixNeuron {mode:9s} (function): {ours:7.3f} ms   QDQ (peer): {peer:7.3f} ms   "
            f"ratio ours/peer: {ours / peer:5.2f}"
        )
    print(
        "  QDQ with ORT's default pair removal (19 of 20 pairs dropped): "
        f"{figures['qdq_collapsed_ms']:.3f} ms"
    )
    print(
        f"  session setup: FixNeuron half_even {figures['fixneuron_half_even_setup_ms']:.0f} ms, "
        f"half_up {figures['fixneuron_half_up_setup_ms']:.0f} ms, QDQ {figures['qdq_setup_ms']:.0f} ms"
    )


if __name__ == "__main__":
    main()
