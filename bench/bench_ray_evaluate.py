"""Evaluation through the config build's executor: 2 local Ray workers against in process, same work.

The work: the PP-OCRv4 recognizer compiled for zhouyi-x2 (quantized once on 8 rendered lines, min/max),
run on held-out rendered lines through the NPU session in batches of 4 (``evaluate_models``, one task
per batch), for the fake-quantized and the NPU model. Ours: ``RayExecutor`` on a local Ray with 2 CPUs
(started once, untimed; each worker opens the models on its first task, in the warmup); peer: the
in-process ``LocalExecutor``. The scores must be equal (checked every run). Figure: lines per second;
the ratio ours / peer is the speed-up. ``--quick``: 8 lines and 1 repeat.

Second figure, on the same Ray: calibration of MobileNetV2 (random weights, 224x224; every float
activation, percentile + moments, so histograms too) on 32 samples (8 with ``--quick``) in 2 shards
(``collect_sharded``) against the one-process ``collect``; the statistics must be equal bit for bit.

Third figure: the accuracy-budget search (``quantize_with_budget``, digits CNN, per-channel int8 with
``QuantPlacement`` kernels, cosine, 32 calibration and 16 evaluation samples) with its trials on the
same Ray (2 probes per round, one per worker) against the same search in process with 2 probes per round:
the same candidates in the same order (checked every run), so the work is equal. Figure: searches per
minute, including quantizing and the baseline, which do not run on Ray.
"""

from __future__ import annotations

__all__ = ["bench_ray_evaluate"]

import tempfile
from pathlib import Path

from bench.runner import HIGHER, BenchContext, Measurement

#: Every rendered line is padded (or squeezed) to rapidocr's rec width, so the compiled model has static shapes.
REC_WIDTH = 320


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
    quantize_static(src, work / "int8.onnx", ListReader(rec_inputs(8, seed=1, width=REC_WIDTH)), **kwargs)
    # a fixed input shape, so the whole recognizer compiles for the NPU (dynamic shapes stay on the CPU)
    compiled = compile_model(work / "int8.onnx", "zhouyi-x2", input_shapes={"x": (1, 3, 48, REC_WIDTH)})
    compiled.save(work / "npu.onnx")
    if compiled.partition.mac_share < 0.99:
        raise AssertionError(
            f"only {compiled.partition.mac_share:.1%} of the recognizer's MACs compiled for the NPU"
        )
    return {"float": src, "int8": work / "int8.onnx", "npu": work / "npu.onnx"}


def _calibration(ctx: BenchContext, ray: object) -> Measurement:
    import math

    import numpy as np
    import onnx

    from zonnx import zoo
    from zonnx.quantization.calibration.collector import collect
    from zonnx.quantization.calibration.readers import ListReader
    from zonnx.quantization.calibration.shards import collect_sharded
    from zonnx.quantization.observe import float_activations

    model = onnx.shape_inference.infer_shapes(onnx.load(zoo.get("mobilenetv2-random")))
    names, n = float_activations(model), 8 if ctx.quick else 32
    feeds = zoo.sample_inputs("mobilenetv2-random", n)
    kw = {"methods_needed": ("percentile", "nstd")}
    out = {}

    def sharded() -> None:
        out["ray"] = collect_sharded(model, names, ListReader(feeds), executor=ray, shards=2, **kw)

    def local() -> None:
        out["local"] = collect(model, names, ListReader(feeds), **kw)

    ours, peer = BenchContext(1 if ctx.quick else min(ctx.repeat, 3), 1, ctx.quick).time_pair(sharded, local)
    for t in names:
        a, b = out["ray"][t], out["local"][t]
        same = (a.min, a.max, a.batches, a.ema_min, a.mean, a.m2) == (
            b.min,
            b.max,
            b.batches,
            b.ema_min,
            b.mean,
            b.m2,
        )
        if not (
            same
            and np.array_equal(a.hist.counts, b.hist.counts)
            and math.isclose(a.hist.width, b.hist.width, rel_tol=0)
        ):
            raise AssertionError(f"sharded statistics of {t} differ from the one-process ones")
    note = f"MobileNetV2 {len(names)} tensors, {n} samples, 2 shards; statistics equal bit for bit"
    return Measurement("calibration, 2 Ray shards", n / ours.median, "samples/s", HIGHER, peer="in process",
                       peer_value=n / peer.median, note=note)  # fmt: skip


def _search(ctx: BenchContext, ray: object, work: Path) -> Measurement:
    from zonnx import zoo
    from zonnx.quantization.api import build_config
    from zonnx.quantization.calibration.readers import ListReader
    from zonnx.quantization.search.run import quantize_with_budget

    path, feeds = zoo.get("digits_cnn"), zoo.sample_inputs("digits_cnn", 32)
    cfg = build_config(per_channel=True, extra_options={"QuantPlacement": "kernels"})
    kw = dict(budget=0.002, metric="cosine", eval_feeds=zoo.sample_inputs("digits_cnn", 16, seed=5))
    found = {}

    def search(tag: str, executor: object) -> None:
        extra = {"executor": executor} if executor is not None else {"trials_per_round": 2}
        found[tag] = quantize_with_budget(path, work / f"{tag}.onnx", ListReader(feeds), cfg, **kw, **extra)[
            1
        ]

    repeat = 1 if ctx.quick else min(ctx.repeat, 3)
    ours, peer = BenchContext(repeat, 1, ctx.quick).time_pair(lambda: search("ray", ray),
                                                             lambda: search("local", None))  # fmt: skip
    ray_c, local_c = ([(c.raised, c.score) for c in found[k].candidates] for k in ("ray", "local"))
    if ray_c != local_c:
        raise AssertionError(f"the search on Ray scored other candidates: {ray_c} vs {local_c}")
    note = f"digits_cnn, {len(local_c)} candidates, {found['local'].chosen.raised} layer(s) raised; equal both ways"
    return Measurement("budget search, trials on 2 Ray workers", 60 / ours.median, "searches/min", HIGHER,
                       peer="in process, 2 probes per round", peer_value=60 / peer.median, note=note)  # fmt: skip


def bench_ray_evaluate(ctx: BenchContext) -> list[Measurement]:
    from zonnx.deploy.evaluate import RayExecutor, evaluate_models
    from zonnx.quantization.search.executor import LocalExecutor
    from zonnx.zoo.text_images import rec_inputs

    lines = 8 if ctx.quick else 48
    repeat = 1 if ctx.quick else min(ctx.repeat, 3)
    ctx.describe(
        ["ppocr_rec", "mobilenetv2-random", "digits_cnn"],
        {"rec lines": lines, "timed repeats": repeat, "calibration samples": 8 if ctx.quick else 32},
        {"rec lines": 7},
        "rec: float, fake-quant and zhouyi-x2 NPU models evaluated in batches of 4; MobileNetV2: "
        "every float activation, percentile + moments, 2 shards",
    )
    samples = rec_inputs(lines, seed=7, width=REC_WIDTH)
    with tempfile.TemporaryDirectory(prefix="zonnx-bench-ray-") as tmp:
        models = _models(Path(tmp))
        ray = RayExecutor(num_cpus=2)
        try:
            results = {}

            def run(executor, key: str) -> None:
                results[key] = evaluate_models(models, samples, "char-accuracy", batch=4, executor=executor)

            ours, peer = BenchContext(repeat, 1, ctx.quick).time_pair(lambda: run(ray, "ray"),
                                                                     lambda: run(LocalExecutor(), "local"))  # fmt: skip
            calibration = _calibration(ctx, ray)
            search = _search(ctx, ray, Path(tmp))
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
        calibration,
        search,
    ]
