"""The trained BERT classifier (zoo ``bert_encoder``) quantized per NPU target and for generic int8:
topic accuracy and output cosine against float, fake-quant and on the simulated NPU.

Model: ``bert_encoder`` (4 x 128 post-LN BERT, attention mask, GELU, pooler + 32-topic classifier,
trained here on synthetic sentences), its input shapes fixed to [1, 64] and ``zonnx.optimize``-d as
``zonnx build`` does. Calibration, search-evaluation and test sentences are disjoint held-out draws.

Rows (each quantized from the same calibration sentences):

- generic int8 without a target: ORT's ``quantize_static`` (QDQ, its defaults: u8 activations, s8
  per-tensor weights) and zonnx's defaults (``per_channel=True``, ``QuantPlacement="kernels"``); zonnx
  A16W8 (int16 activations) and zonnx with SmoothQuant;
- per target (dpu-b4096, zhouyi-x2, bm1684x): the plain ``--target`` recipe
  (``target_quantize_kwargs``: zhouyi-x2 carries ``ResidualStream16``, int16 around LayerNorms), the
  recipe + SmoothQuant, and ``quantize_with_budget`` (budget 1 point of ``cosine`` against float,
  i.e. cosine >= 0.99, the issue's target; at least 90% of MACs on the NPU; the input shapes fixed);
  every target model also compiled and run by ``zonnx.InferenceSession`` with the NPU provider. A
  compile or NPU failure is a row of its own (the fake-quant row stays).

Figures per row: topic accuracy on the test sentences (peer: float's), mean cosine of the logits
against float's, and for target rows the same on the simulated NPU and the compiled NPU share of MACs.

``bench_bert_accuracy_6x384`` (``python -m bench.runner bert_accuracy_6x384``) runs the same rows on the
issue's size, zoo ``bert_encoder-random`` (6 x 384, 12 heads, FFN 1536, attention mask, GELU, post-LN,
masked mean pooling; fixed-seed weights with 4 LayerNorm outlier channels, input [1, 128]). Training it
on the topic task was measured at 4-5 s per step of 64 sentences on one loaded core: the 200 steps the
4 x 128 model needs would take about 15 minutes, so its weights stay random. Figure per row: the
embedding cosine against float (the issue's metric; targets: generic int8 >= 0.9962, NNCF's best on
MiniLM in the issue's run, not in this one; each target >= 0.99 on the simulated NPU with >= 90% of
MACs there). The name adds the centered cosine (float's mean embedding over the test sentences removed),
which on these random weights is far stricter (see bench_traps).

Run alone: ``python -m bench.runner bert_accuracy`` (``--quick``: fewer sentences, one target, no search).
"""

from __future__ import annotations

__all__ = ["bench_bert_accuracy", "bench_bert_accuracy_6x384", "TARGETS"]

import dataclasses
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import zonnx
from bench.runner import HIGHER, BenchContext, Measurement
from zonnx import zoo
from zonnx.backend.compile_api import compile_model
from zonnx.build_npu import target_quantize_kwargs
from zonnx.inspection.macs import fix_input_shapes
from zonnx.quantization.api import build_config
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.search.run import quantize_with_budget
from zonnx.zoo.bert import SEQ_LEN as LARGE_SEQ_LEN
from zonnx.zoo.bert import bert_inputs
from zonnx.zoo.bert_trained import SEQ_LEN, topic_batch

logger = logging.getLogger(__name__)

MODEL = "bert_encoder"
#: The issue's size (6 x 384, 12 heads, sequence 128): fixed-seed random weights (see ``zonnx.zoo.bert``).
LARGE = "bert_encoder-random"
TARGETS = ("dpu-b4096", "zhouyi-x2", "bm1684x")
BUDGET = 1.0
METRIC = "cosine"
MIN_NPU_SHARE = 0.9
#: NNCF 3.4's best embedding cosine on MiniLM-L6 (the issue's run, not this one): generic int8's target.
NNCF_BEST_COSINE = 0.9962
TARGET_COSINE = 0.99
SHAPES = {"input_ids": [1, SEQ_LEN], "attention_mask": [1, SEQ_LEN]}
LARGE_SHAPES = {"input_ids": [1, LARGE_SEQ_LEN], "attention_mask": [1, LARGE_SEQ_LEN]}
Feed = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class _Spec:
    """A benchmarked model: zoo name, fixed input shapes, and ``split(n, seed) -> (feeds, labels | None)``."""

    name: str
    shapes: dict[str, list[int]]
    split: Callable[[int, int], tuple[list[Feed], np.ndarray | None]]


def _static(folder: Path, spec: _Spec) -> Path:
    model = onnx.load(zoo.get(spec.name))
    fix_input_shapes(model, 1, spec.shapes)
    out = folder / f"{spec.name}.static.onnx"
    onnx.save(zonnx.optimize(model), out)
    return out


def _split(n: int, seed: int) -> tuple[list[Feed], np.ndarray | None]:
    batch, topics = topic_batch(n, seed)
    return [{k: v[i : i + 1] for k, v in batch.items()} for i in range(n)], topics


def _split_large(n: int, seed: int) -> tuple[list[Feed], np.ndarray | None]:
    return bert_inputs(n, seed=seed, seq_len=LARGE_SEQ_LEN), None


TRAINED = _Spec(MODEL, SHAPES, _split)
RANDOM_6X384 = _Spec(LARGE, LARGE_SHAPES, _split_large)


def _logits(sess: Any, feeds: list[Feed]) -> np.ndarray:
    return np.concatenate([sess.run(None, f)[0] for f in feeds]).astype(np.float64)


def _ort(model: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])


def _npu(model: Path, target: str, cache: Path) -> Any:
    return zonnx.InferenceSession(
        str(model),
        providers=["ZonnxNPUExecutionProvider", "CPUExecutionProvider"],
        provider_options=[{"target": target, "cache_dir": str(cache)}, {}],
    )


def _row_cos(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.mean(np.sum(got * ref, 1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))))


def _scores(logits: np.ndarray, ref: np.ndarray, topics: np.ndarray | None) -> tuple[float, float]:
    """(topic accuracy, mean row cosine of the outputs against float's); without topics the first figure
    is the centered cosine (float's mean over the test samples removed from both)."""
    cos = _row_cos(logits, ref)
    if topics is None:
        mean = ref.mean(0)
        return _row_cos(logits - mean, ref - mean), cos
    return float(np.mean(logits.argmax(1) == topics)), cos


class _Bench:
    """Shared data of one run: the static float model, splits, float figures, a work folder."""

    def __init__(self, folder: Path, spec: _Spec, n_calib: int, n_eval: int, n_test: int) -> None:
        self.folder, self.spec = folder, spec
        self.src = _static(folder, spec)
        self.calib, _ = spec.split(n_calib, 1)
        self.search_eval, _ = spec.split(n_eval, 2)
        self.test, self.topics = spec.split(n_test, 3)
        self.ref = _logits(_ort(self.src), self.test)
        self.float_acc = _scores(self.ref, self.ref, self.topics)[0]

    def _measure(
        self, label: str, where: str, acc: float, cos: float, target: str | None, note: str
    ) -> Measurement:
        """A topic-accuracy row (trained model, peer float) or an embedding-cosine row (target: the issue's)."""
        name = self.spec.name
        if self.topics is not None:
            text = f"{name} {label}: topic accuracy{where} (logits cosine {cos:.4f}"
            return Measurement(text, acc, "acc", HIGHER, "float", self.float_acc, note=note)
        goal = TARGET_COSINE if target is not None else NNCF_BEST_COSINE
        text = f"{name} {label}: embedding cosine{where} (centered {acc:.4f}"
        return Measurement(text, cos, "cos", HIGHER, "float", 1.0, target=goal, note=note)

    def row(self, label: str, model: Path, seconds: float, target: str | None = None) -> list[Measurement]:
        """Fake-quant (and, with a target, NPU) accuracy and cosine of ``model`` as measurements."""
        acc, cos = _scores(_logits(_ort(model), self.test), self.ref, self.topics)
        note = f"fake-quant cosine {cos:.4f}; quantize {seconds:.0f} s"
        first = self._measure(label, ", fake-quant", acc, cos, target, note)
        out = [dataclasses.replace(first, name=first.name + ")")]
        if target is None:
            return out
        try:
            share = compile_model(model, target).partition.mac_share
            npu_acc, npu_cos = _scores(
                _logits(_npu(model, target, self.folder / "cache"), self.test), self.ref, self.topics
            )
        except Exception as e:  # a failed compile is a figure of its own; the other rows still run
            logger.warning("%s %s: NPU failed: %s", self.spec.name, label, e)
            failed = f"{self.spec.name} {label}: on the NPU: failed: {type(e).__name__}: {e}"[:240]
            return out + [Measurement(failed, float("nan"), "acc", HIGHER, note=str(e))]
        npu = self._measure(label, " on the NPU", npu_acc, npu_cos, target, note)
        return out + [dataclasses.replace(npu, name=f"{npu.name}, {100 * share:.1f}% of MACs on the NPU)")]

    def quantize(self, tag: str, call: Callable[[Path], None]) -> tuple[Path, float]:
        out = self.folder / f"{tag}.onnx"
        start = time.perf_counter()
        call(out)
        return out, time.perf_counter() - start


def _generic(b: _Bench) -> list[Measurement]:
    from onnxruntime.quantization import quantize_static as ort_quantize_static

    rows: list[tuple[str, Callable[[Path], None]]] = [
        (
            "ORT quantize_static int8 (defaults)",
            lambda o: ort_quantize_static(str(b.src), str(o), ListReader(b.calib)),
        ),
    ]
    base = {"per_channel": True, "extra_options": {"QuantPlacement": "kernels"}}
    for label, extra in [
        ("zonnx default int8", {}),
        ("zonnx int8 + SmoothQuant", {"SmoothQuant": True}),
    ]:
        kw = {**base, "extra_options": {**base["extra_options"], **extra}}
        rows.append((label, lambda o, kw=kw: zonnx.quantize_static(b.src, o, ListReader(b.calib), **kw)))
    a16 = {**base, "activation_type": "int16"}
    rows.append(("zonnx A16W8", lambda o: zonnx.quantize_static(b.src, o, ListReader(b.calib), **a16)))
    out = []
    for i, (label, call) in enumerate(rows):
        path, seconds = b.quantize(f"generic{i}", call)
        out += b.row(f"generic, {label}", path, seconds)
    return out


def _target(b: _Bench, target: str, search: bool) -> list[Measurement]:
    out = []
    plain = target_quantize_kwargs(target)
    smooth = target_quantize_kwargs(target)
    smooth["extra_options"]["SmoothQuant"] = True
    for label, kw in [("plain --target", plain), ("--target + SmoothQuant", smooth)]:
        path, seconds = b.quantize(
            f"{target}.{len(out)}",
            lambda o, kw=kw: zonnx.quantize_static(b.src, o, ListReader(b.calib), **kw),
        )
        out += b.row(f"{target} {label}", path, seconds, target)
    if search:
        found: dict[str, Any] = {}

        def budgeted(o: Path) -> None:
            _, found["result"], _ = quantize_with_budget(
                b.src,
                o,
                ListReader(b.calib),
                build_config(**target_quantize_kwargs(target)),
                budget=BUDGET,
                metric=METRIC,
                eval_feeds=b.search_eval,
                input_shapes=b.spec.shapes,
                min_npu_share=MIN_NPU_SHARE,
            )

        path, seconds = b.quantize(f"{target}.budget", budgeted)
        result = found["result"]
        verdict = "met" if result.met else "NOT met"
        label = (
            f"{target} --accuracy-budget {BUDGET:g} {METRIC} ({verdict}, {result.chosen.raised} layer(s) "
            f"{result.precision}, {len(result.candidates) + 1} candidates, {seconds:.0f} s)"
        )
        out += b.row(label, path, seconds, target)
    return out


def _run(ctx: BenchContext, spec: _Spec, sizes: tuple[int, int, int], note: str) -> list[Measurement]:
    n_calib, n_eval, n_test = sizes
    targets = TARGETS[1:2] if ctx.quick else TARGETS
    ctx.describe(
        [spec.name],
        {"calibration sentences": n_calib, "search sentences": n_eval, "test sentences": n_test},
        {"calibration": 1, "search": 2, "test": 3},
        note=f"input shapes fixed to {spec.shapes['input_ids']}{note}",
    )
    out: list[Measurement] = []
    with tempfile.TemporaryDirectory(prefix="zonnx-bert-acc-") as tmp:
        b = _Bench(Path(tmp), spec, n_calib, n_eval, n_test)
        out += _generic(b)
        for target in targets:
            try:
                out += _target(b, target, search=not ctx.quick)
            except Exception as e:  # one target's failure is a row of its own; the others still run
                logger.warning("bert_accuracy %s failed: %s", target, e)
                out.append(
                    Measurement(
                        f"{spec.name} {target}: failed: {type(e).__name__}: {e}"[:200], float("nan"), "acc"
                    )
                )
    return out


def bench_bert_accuracy(ctx: BenchContext) -> list[Measurement]:
    """Topic accuracy and logits cosine of the quantized trained BERT, generic int8 and per NPU target."""
    return _run(ctx, TRAINED, (16, 16, 32) if ctx.quick else (64, 64, 256), "")


def bench_bert_accuracy_6x384(ctx: BenchContext) -> list[Measurement]:
    """Embedding cosine of the quantized 6 x 384 encoder (random weights), generic int8 and per NPU target."""
    note = (
        f"; targets: generic int8 >= {NNCF_BEST_COSINE} (NNCF's best on MiniLM in the issue's run), "
        f"every target >= {TARGET_COSINE} with >= {MIN_NPU_SHARE:.0%} of MACs on the NPU"
    )
    return _run(ctx, RANDOM_6X384, (8, 8, 16) if ctx.quick else (32, 16, 64), note)


if __name__ == "__main__":
    import sys

    from bench.runner import main

    sys.exit(main(["bert_accuracy", *sys.argv[1:]]))
