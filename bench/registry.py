"""The explicit registry of benchmarks: name, lazy "module:function" reference, one-line description."""

from __future__ import annotations

__all__ = ["Benchmark", "REGISTRY"]

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A registered benchmark: ``target`` is a callable or a lazy "module:function" reference."""

    name: str
    target: str | Callable[..., Any]
    description: str = ""

    def load(self) -> Callable[..., Any]:
        """The benchmark function (``fn(ctx: BenchContext) -> list[Measurement]``), imported on first use."""
        if callable(self.target):
            return self.target
        module, _, func = self.target.partition(":")
        return getattr(importlib.import_module(module), func)


#: Every benchmark, by name. Add new ones here (lazy references keep ``--help`` fast).
REGISTRY: dict[str, Benchmark] = {
    b.name: b
    for b in [
        Benchmark(
            "ray_evaluate",
            "bench.bench_ray_evaluate:bench_ray_evaluate",
            "build evaluation (PP-OCRv4 rec, zhouyi-x2 NPU): 2 local Ray workers vs in process",
        ),
        Benchmark(
            "smooth_quant",
            "bench.bench_smooth_quant:bench_smooth_quant",
            "SmoothQuant on the BERT zoo encoder: int8 embedding cosine with and without it",
        ),
        Benchmark(
            "prequant",
            "bench.bench_prequant:bench_prequant",
            "ResNet-18 and the trained MobileNetV2 quantized by ORT (and more sources) retargeted to every NPU: MAC "
            "share, cosine vs source, MobileNetV2 top-1",
        ),
        Benchmark(
            "large_model",
            "bench.bench_large_model:bench_large_model",
            "a MatMul chain with 2.2 GB of float weights: quantize_static time and peak RSS vs ORT's, then "
            "optimize --verify, compile and an NPU session",
        ),
        Benchmark(
            "large_cli",
            "bench.bench_large_cli:bench_large_cli",
            "every zonnx command from the CLI on the 2.2 GB chain (convert: a torch model of 2.2 GB): time, peak "
            "RSS over the weights, exit 0 with a loadable output",
        ),
        Benchmark(
            "npu_estimate",
            "bench.bench_npu_estimate:bench_npu_estimate",
            "estimated NPU cycles, time and DDR traffic (zonnx profile's cost model) of the zoo CNNs per target",
        ),
        Benchmark(
            "cache_hash",
            "bench.bench_cache_hash:bench_cache_hash",
            "sha256 content key of a 604 MB external-data model (the NPU cache's source identity) vs ORT "
            "session creation on the same file",
        ),
        Benchmark(
            "zoo_ort",
            "bench.bench_zoo_ort:bench_zoo_ort",
            "ORT float throughput of the CNN zoo models, graph optimizations off vs ORT default",
        ),
        Benchmark(
            "graph_tools",
            "bench.bench_graph_tools:bench_graph_tools",
            "inspect and optimize wall time on every zoo model vs onnx shape inference and onnxslim",
        ),
        Benchmark(
            "calib_plan",
            "bench.bench_calib_plan:bench_calib_plan",
            "calibration time with zonnx's own plan on ResNet-18 vs one float sweep (with and without session)",
        ),
        Benchmark(
            "quant_accuracy",
            "bench.bench_quant_accuracy:bench_quant_accuracy",
            "digits top-1 and PP-OCRv4 rec char accuracy: zonnx quantizer vs ORT's, same arguments and data",
        ),
        Benchmark(
            "quant_speed",
            "bench.bench_quant_speed:bench_quant_speed",
            "resnet18-random int8 QDQ from zonnx in plain ORT vs float and vs ORT's quantizer output, interleaved",
        ),
        Benchmark(
            "npu_speed",
            "bench.bench_npu_speed:bench_npu_speed",
            "ResNet-18 through zonnx.InferenceSession (NPU) vs ORT running the same QDQ model, per target",
        ),
        Benchmark(
            "int_path",
            "bench.bench_int_path:bench_int_path",
            "the exact u8 x u8 integer forms vs ORT's u8 x s8 kernels (inexact without VNNI): layers and "
            "ResNet-18 NPU programs",
        ),
        Benchmark(
            "npu_fidelity",
            "bench.bench_npu_fidelity:bench_npu_fidelity",
            "compiled NPU model vs its QDQ/FixNeuron model: output and per-layer LSB, cosine vs float, "
            "NPU MAC share, every zoo model x target",
        ),
        Benchmark(
            "custom_ops",
            "bench.bench_custom_ops:bench_custom_ops",
            "20 zonnx FixNeuron functions on 1x64x56x56 in ORT vs the same chain of QuantizeLinear/DequantizeLinear",
        ),
        Benchmark(
            "recovery",
            "bench.bench_recovery:bench_recovery",
            "trained digits CNN and mobilenetv2_digits, dpu-b4096 power-of-two: held-out top-1 and SQNR, plain "
            "MinMSE, + CLE, + bias correction, + AdaRound",
        ),
        Benchmark(
            "calibration",
            "bench.bench_calibration:bench_calibration",
            "resnet18-random calibration (MinMax, Percentile sampled and full) / float sweep and peak RSS 256 vs "
            "32 samples: zonnx vs ORT",
        ),
        Benchmark(
            "calib_sample",
            "bench.bench_calib_sample:bench_calib_sample",
            "PP-OCRv4 rec char accuracy and quantize time with histograms from zonnx's strided sample vs every "
            "value (CalibHistogramSample)",
        ),
        Benchmark(
            "fast_finetune",
            "bench.bench_fast_finetune:bench_fast_finetune",
            "dpu-b4096 fast finetune (adaround, adaquant): held-out SQNR vs PTQ alone on the trained yolo_det, wall "
            "time on resnet18-random",
        ),
        Benchmark(
            "target_accuracy",
            "bench.bench_target_accuracy:bench_target_accuracy",
            "PP-OCRv4 rec char accuracy quantized with each NPU target's recipe, against float, with the "
            "partitioner's NPU MAC share",
        ),
        Benchmark(
            "quantize_call",
            "bench.bench_quantize_call:bench_quantize_call",
            "resnet18-random: the whole quantize_static call / one float sweep (MinMax, Percentile), zonnx vs "
            "ORT's call in the same rounds",
        ),
        Benchmark(
            "ort_conformance",
            "bench.bench_ort_conformance:bench_ort_conformance",
            "ONNX Runtime's own quantization tests with zonnx.quantize_static patched in: passed / passed with "
            "ORT (snapshot from ZONNX_ORT_SNAPSHOT)",
        ),
        Benchmark(
            "traps",
            "bench.bench_traps:bench_traps",
            "BERT encoder (mask Add + Softmax, LayerNorm, residual stream) and YOLO-style detector (boxes next "
            "to sigmoid scores) per NPU target: fake-quant and simulated-NPU cosine vs float, NPU MAC share",
        ),
        Benchmark(
            "npu_budget",
            "bench.bench_npu_budget:bench_npu_budget",
            "PP-OCRv4 rec --accuracy-budget 0.5 char-accuracy per NPU target: the choice compiled and run on the "
            "simulated NPU against float, its NPU MAC share and the search time",
        ),
        Benchmark(
            "bert_accuracy",
            "bench.bench_bert_accuracy:bench_bert_accuracy",
            "trained BERT classifier (zoo bert_encoder): topic accuracy and logits cosine vs float, generic int8 "
            "(ORT, zonnx, A16W8, SmoothQuant) and per NPU target (recipe, + SmoothQuant, accuracy budget) on the "
            "simulated NPU",
        ),
        Benchmark(
            "bert_accuracy_6x384",
            "bench.bench_bert_accuracy:bench_bert_accuracy_6x384",
            "bert_accuracy on the issue's size (zoo bert_encoder-random, 6 x 384, random weights): embedding "
            "cosine vs float, generic int8 and per NPU target on the simulated NPU",
        ),
        Benchmark(
            "npu_budget_range",
            "bench.bench_npu_budget:bench_npu_budget_range",
            "npu_budget on the int8-only targets (bm1684x, dpu-b4096) with the per-tensor range search before "
            "float fall-back",
        ),
        Benchmark(
            "accuracy_peers",
            "bench.bench_accuracy_peers:bench_accuracy_peers",
            "PP-OCRv4 rec char accuracy and trained BERT topic accuracy / logits cosine: zonnx vs NNCF (and AIMET-ONNX), each "
            "peer in its own venv (bench/.peers-venv), same calibration and test data",
        ),
    ]
}
