"""Calibration time and memory on ResNet-18: zonnx's streaming collector against ORT's create_calibrator.

Model: the zoo ResNet-18 (1x3x224x224) with BatchNormalization folded into Conv by ORT's basic offline
optimization, as a quantizer sees it after pre-processing. Tensors: the ones ORT's calibrator picks
(every float input/output of every node, weights excluded), for both tools. Times are the whole
calibration (augmenting the model, creating the session, running every sample, computing every range)
as a multiple of one float inference sweep over the same samples (ORT default session created once,
one run per sample). Runs alternate (float, ours, ORT, ...) and the best of ``repeat`` is kept, which
keeps the ratios steady on a busy machine. Peak RSS is measured in a fresh process per run, with a
reader that makes each image when asked so the data set itself takes no memory.

Histogram methods (Percentile, Entropy) run twice for zonnx: with its default strided sample of about
16384 values per tensor and batch (``CalibHistogramSample``, "sampled") and counting every value as ORT
does (``CalibHistogramSample=None``, "full", equal work); both against ORT in the same rounds.

Run ``python -m bench.bench_calibration [--quick]`` or through ``python -m bench.runner calibration``.
"""

from __future__ import annotations

__all__ = ["bench_calibration", "main", "prepare_model", "tensor_names", "rss_run"]

import argparse
import contextlib
import io
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from bench.header import host_lines, setup_lines
from bench.runner import LOWER, BenchContext, Measurement, peak_rss
from zonnx import zoo
from zonnx.quantization.calibration.collector import DEFAULT_HIST_SAMPLE, collect
from zonnx.quantization.calibration.methods import compute_range
from zonnx.quantization.calibration.readers import ListReader

logger = logging.getLogger(__name__)

SAMPLES = 32
BIG = 256
#: Targets from the issue: calibration time / float sweep time.
TARGETS = {"minmax": 1.3, "percentile": 1.6}
#: Peak RSS with BIG samples / with SAMPLES samples.
MEMORY_TARGET = 1.2
_ORT_METHOD = {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy"}
_HISTOGRAM = ("percentile", "entropy")


def prepare_model(folder: Path) -> Path:
    """The zoo ResNet-18 with BatchNormalization folded (ORT basic level, written offline)."""
    out = folder / "resnet18_folded.onnx"
    if not out.is_file():
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(out)
        opts.log_severity_level = 3
        ort.InferenceSession(str(zoo.get("resnet18-random")), opts, providers=["CPUExecutionProvider"])
    return out


def tensor_names(path: Path) -> list[str]:
    """ORT's rule: float inputs/outputs of every node with a known type, initializers excluded."""
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    g = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.output, *g.input]}
    inits = {i.name for i in g.initializer}
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    names = [
        t for n in g.node for t in [*n.input, *n.output] if t and t not in inits and types.get(t) in floats
    ]
    return list(dict.fromkeys(names))


class LazyImages:
    """A reader making image ``i`` (seed ``i``) only when asked: the data set holds no memory."""

    def __init__(self, n: int) -> None:
        self.n, self.i = n, 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.i >= self.n:
            return None
        from zonnx.zoo.torch_models import smooth_images

        self.i += 1
        return {"input": smooth_images(1, seed=self.i)}


def ours(
    path: Path, names: list[str], reader: object, method: str, hist_sample: int | None = DEFAULT_HIST_SAMPLE
) -> dict[str, tuple[float, float]]:
    model = onnx.load(str(path))
    stats = collect(model, names, reader, methods_needed={method}, hist_sample=hist_sample)
    return {t: compute_range(s, method) for t, s in stats.items()}


def peer(path: Path, reader: object, method: str, folder: str) -> dict[str, object]:
    from onnxruntime.quantization import CalibrationMethod, create_calibrator

    with contextlib.redirect_stdout(io.StringIO()):  # ORT's histogram calibrators print progress
        cal = create_calibrator(
            path,
            augmented_model_path=str(Path(folder) / "augmented.onnx"),
            calibrate_method=getattr(CalibrationMethod, _ORT_METHOD[method]),
        )
        cal.collect_data(reader)
        return dict(cal.compute_data().data)


def rss_run(tool: str, method: str, n: int, model_path: str) -> None:
    """One calibration in this process (for peak_rss): ``tool`` is "ours" or "ort"."""
    logging.disable(logging.WARNING)
    path = Path(model_path)
    if tool == "ours":
        ours(path, tensor_names(path), LazyImages(n), method)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            peer(path, LazyImages(n), method, tmp)


def _best_times(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, tuple[float, float]]:
    """Alternate the calls ``repeat`` times; return each one's best (wall, cpu) seconds."""
    best = {k: (float("inf"), float("inf")) for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            w, c = time.perf_counter() - w0, time.process_time() - c0
            best[k] = (min(best[k][0], w), min(best[k][1], c))
    return best


def _available_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def bench_calibration(
    ctx: BenchContext, *, methods: tuple[str, ...] = ("minmax", "percentile"), memory: bool = True
) -> list[Measurement]:
    """Calibration/float-sweep time ratios for ours and ORT, and peak RSS 256 vs 32 samples."""
    logging.getLogger("root").setLevel(logging.ERROR)
    n = 8 if ctx.quick else SAMPLES
    repeat = 1 if ctx.quick else max(2, min(ctx.repeat, 3))
    ctx.describe(
        ["resnet18-random"],
        {"calibration": n, "timing rounds (best kept)": repeat},
        {"calibration": 0},
        "BN folded by ORT basic optimization; the tensors ORT's calibrator picks, for both tools",
    )
    out: list[Measurement] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = prepare_model(Path(tmp))
        names = tensor_names(path)
        feeds = zoo.sample_inputs("resnet18-random", n)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for f in feeds[:2]:
            sess.run(None, f)
        fns: dict[str, Callable[[], object]] = {"float": lambda: [sess.run(None, f) for f in feeds]}
        variants = [(m, "", DEFAULT_HIST_SAMPLE) for m in methods]
        variants += [(m, " full", None) for m in methods if m in _HISTOGRAM]
        for m, label, sample in variants:
            fns[f"ours {m}{label}"] = lambda m=m, sample=sample: ours(
                path, names, ListReader(feeds), m, sample
            )
        for m in methods:
            fns[f"ort {m}"] = lambda m=m: peer(path, ListReader(feeds), m, tmp)
        best = _best_times(fns, repeat)
        fw, fc = best["float"]
        out.append(Measurement("float sweep (ORT default session)", fw, "s", LOWER, note=f"{n} samples"))
        for m, label, _ in variants:
            (ow, oc), (pw, pc) = best[f"ours {m}{label}"], best[f"ort {m}"]
            kind = {
                "": " (sampled)" if m in _HISTOGRAM else "",
                " full": " (full: CalibHistogramSample None)",
            }
            note = (
                f"{len(names)} tensors, {n} samples; cpu time ratio ours {oc / fc:.2f}x, ORT {pc / fc:.2f}x"
            )
            out.append(
                Measurement(
                    f"calibration {m}{kind[label]} / float sweep",
                    ow / fw,
                    "x",
                    LOWER,
                    target=None if label else TARGETS.get(m),
                    note=note,
                )
            )
            out.append(
                Measurement(
                    f"calibration {m}{kind[label]} time",
                    ow,
                    "s",
                    LOWER,
                    peer="ORT create_calibrator",
                    peer_value=pw,
                    note=note,
                )
            )
        if memory and not ctx.quick:
            for m in methods:
                for tool in ("ours", "ort"):
                    if tool == "ort" and m != "minmax" and _available_gib() < 12:
                        logger.warning("skipping ORT %s with %d samples: under 12 GiB available", m, BIG)
                        continue
                    small = peak_rss(rss_run, tool, m, SAMPLES, str(path))
                    big = peak_rss(rss_run, tool, m, BIG, str(path))
                    label = "ours" if tool == "ours" else "ORT"
                    out.append(
                        Measurement(
                            f"{label} {m} peak RSS {BIG} / {SAMPLES} samples",
                            big.peak / small.peak,
                            "x",
                            LOWER,
                            target=MEMORY_TARGET if tool == "ours" else None,
                            note=f"{small.peak / 2**20:.0f} MiB -> {big.peak / 2**20:.0f} MiB",
                        )
                    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 samples, one repeat, no memory runs")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--methods", default="minmax,percentile", help="comma-separated: minmax, percentile, entropy"
    )
    ap.add_argument("--no-memory", action="store_true")
    args = ap.parse_args(argv)
    ctx = BenchContext(repeat=args.repeat, quick=args.quick)
    rows = bench_calibration(ctx, methods=tuple(args.methods.split(",")), memory=not args.no_memory)
    for line in [*host_lines(), *setup_lines("calibration", ctx.described[-1] if ctx.described else None)]:
        print(line)
    for r in rows:
        peer_txt = (
            f"  peer {r.peer_value:.3f}{r.unit} ratio {r.ratio:.2f}" if r.peer_value is not None else ""
        )
        verdict = "" if r.passed is None else ("  PASS" if r.passed else "  FAIL")
        print(f"{r.name:45s} {r.value:8.3f}{r.unit}{peer_txt}{verdict}   {r.note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
