"""PP-OCRv4 rec character accuracy quantized for each NPU target with the target's recipe, against float.

Per target: ``quantize_static(**target_quantize_kwargs(T))`` (the recipe ``zonnx build`` and
``zonnx quantize --target`` use) on 48 rendered calibration lines; character accuracy strict and with
leading/trailing spaces stripped on 100 other lines (fake-quant, ORT with basic optimizations); the
share of MACs the backend's partitioner proposes for the NPU (capability + partition, no compilation);
the collapse warning's verdict. The peer is the float model on the same lines. Quick: 16 / 40 lines.

Run alone: ``python -m bench.runner target_accuracy``.
"""

from __future__ import annotations

__all__ = ["bench_target_accuracy", "TARGETS"]

import logging
import time
from pathlib import Path

import onnx
import onnxruntime as ort

import zonnx
from bench.runner import HIGHER, BenchContext, Measurement
from zonnx import zoo
from zonnx.build_npu import target_quantize_kwargs
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.search.scorer import npu_mac_share
from zonnx.zoo.text_images import char_accuracy, ctc_greedy_decode, rec_samples

logger = logging.getLogger(__name__)

TARGETS = ("dpu-b4096", "zhouyi-x2", "bm1684x")


def _accuracy(model: Path | onnx.ModelProto, lines: list) -> tuple[float, float]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    preds = [p for _, feed in lines for p in ctc_greedy_decode(sess.run(None, feed)[0])]
    truth = [text for text, _ in lines]
    stripped = char_accuracy([p.replace(" ", "") for p in preds], [t.replace(" ", "") for t in truth])
    return char_accuracy(preds, truth), stripped


def bench_target_accuracy(ctx: BenchContext) -> list[Measurement]:
    """One measurement per target: char accuracy of its quantized model against float's."""
    n_calib, n_test = (16, 40) if ctx.quick else (48, 100)
    ctx.describe(["ppocr_rec"], {"calibration lines": n_calib, "test lines": n_test}, {"lines": 11})
    src = zoo.get("ppocr_rec")
    samples = rec_samples(n_calib + n_test, seed=11)
    calib, test = [feed for _, feed in samples[:n_calib]], samples[n_calib:]
    float_acc, float_stripped = _accuracy(src, test)
    out = []
    for target in TARGETS:
        start = time.perf_counter()
        result = zonnx.quantize_static(src, None, ListReader(calib), **target_quantize_kwargs(target))
        seconds = time.perf_counter() - start
        acc, stripped = _accuracy(result.model, test)
        share = npu_mac_share(result.model, target)
        out.append(
            Measurement(
                f"PP-OCRv4 rec {target}: char accuracy; partitioner proposes {100 * share:.0f}% of MACs for the NPU; warned "
                f"{'yes' if result.warnings else 'no'}",
                acc,
                "acc",
                HIGHER,
                peer="float",
                peer_value=float_acc,
                note=(
                    f"spaces removed {stripped:.4f} (float {float_stripped:.4f}); {n_calib} calibration / "
                    f"{n_test} test lines; NPU MAC share {share:.2f} (partitioner); quantize {seconds:.0f} s; "
                    f"collapse warning: {'yes' if result.warnings else 'no'}"
                ),
            )
        )
    return out
