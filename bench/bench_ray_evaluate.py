"""Evaluation through the config build's executor: 2 local Ray workers against in process, same work.

The work: the PP-OCRv4 recognizer compiled for zhouyi-x2 (quantized once on 8 rendered lines, min/max),
run on held-out rendered lines through the NPU session in batches of 4 (``evaluate_models``, one task
per batch), for the fake-quantized and the NPU model. Ours: ``RayExecutor`` on a local Ray with 2 CPUs
(started once, untimed; each worker opens the models on its first task, in the warmup); peer: the
in-process ``LocalExecutor``. The scores must be equal (checked every run). Figure: lines per second;
the ratio ours / peer is the speed-up. ``--quick``: 8 lines and 1 repeat.
"""

from __future__ import annotations

__all__ = ["bench_ray_evaluate"]

import tempfile
from pathlib import Path

from bench.runner import HIGHER, BenchContext, Measurement


def _models(work: Path) -> dict[str, Path]:
    from zonnx import zoo
    from zonnx.backend.compile_api import compile_model
    from zonnx.build_npu import target_quantize_kwargs
    from zonnx.quantization.api import quantize_static
    from zonnx.quantization.calibration.readers import ListReader
    from zonnx.zoo.text_images import rec_inputs

    src = zoo.get("ppocr_rec")
    kwargs = target_quantize_kwargs("zhouyi-x2")
    kwargs["extra_options"]["ReportSamples"] = 0
    quantize_static(src, work / "int8.onnx", ListReader(rec_inputs(8, seed=1)), **kwargs)
    compile_model(work / "int8.onnx", "zhouyi-x2").save(work / "npu.onnx")
    return {"float": src, "int8": work / "int8.onnx", "npu": work / "npu.onnx"}


def bench_ray_evaluate(ctx: BenchContext) -> list[Measurement]:
    from zonnx.deploy.evaluate import RayExecutor, evaluate_models
    from zonnx.quantization.search.executor import LocalExecutor
    from zonnx.zoo.text_images import rec_inputs

    lines = 8 if ctx.quick else 48
    repeat = 1 if ctx.quick else min(ctx.repeat, 3)
    samples = rec_inputs(lines, seed=7)
    with tempfile.TemporaryDirectory(prefix="zonnx-bench-ray-") as tmp:
        models = _models(Path(tmp))
        ray = RayExecutor(num_cpus=2)
        try:
            results = {}

            def run(executor, key: str) -> None:
                results[key] = evaluate_models(models, samples, "char-accuracy", batch=4, executor=executor)

            ours, peer = BenchContext(repeat, 1, ctx.quick).time_pair(lambda: run(ray, "ray"),
                                                                     lambda: run(LocalExecutor(), "local"))  # fmt: skip
        finally:
            ray.close()
    same = results["ray"]["scores"] == results["local"]["scores"]
    if not same:
        raise AssertionError(f"Ray and in-process scores differ: {results['ray']} vs {results['local']}")
    note = f"{lines} lines x 3 models, batches of 4; scores equal: {results['ray']['scores']}"
    return [
        Measurement(
            "evaluation, 2 Ray workers",
            lines / ours.median,
            "lines/s",
            HIGHER,
            peer="in process",
            peer_value=lines / peer.median,
            note=note,
        ),  # fmt: skip
    ]
