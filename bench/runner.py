"""Benchmark runner: an explicit registry of benchmarks, timing/memory helpers, table/markdown/JSON output.

Run ``python -m bench.runner [NAMES...] [--quick] [--json out.json] [--markdown]``.
"""

from __future__ import annotations

__all__ = [
    "HIGHER",
    "LOWER",
    "Measurement",
    "BenchContext",
    "Benchmark",
    "BenchResult",
    "TimingStats",
    "MemoryStats",
    "REGISTRY",
    "time_call",
    "time_pair",
    "time_interleaved",
    "peak_rss",
    "traced_peak",
    "run_benchmarks",
    "render_table",
    "header",
    "to_markdown",
    "to_json",
    "main",
]

import argparse
import dataclasses
import importlib
import json
import logging
import multiprocessing
import resource
import statistics
import sys
import time
import traceback
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.header import Setup, host_lines, setup_lines
from zonnx.errors import OptionError, did_you_mean

logger = logging.getLogger(__name__)

HIGHER = "higher is better"
LOWER = "lower is better"


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One figure of ours against a peer measured in the same run.

    ``ratio`` is always ours / peer. ``target`` applies to the ratio when there is a peer, otherwise to
    the value: with ``direction`` HIGHER the figure passes when it is >= target, with LOWER when <= target.
    Without a target there is no verdict (``passed`` is None).
    """

    name: str
    value: float
    unit: str
    direction: str = HIGHER
    peer: str | None = None
    peer_value: float | None = None
    target: float | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if self.direction not in (HIGHER, LOWER):
            raise OptionError(f"measurement {self.name!r}: direction must be {HIGHER!r} or {LOWER!r}.")
        if (self.peer is None) != (self.peer_value is None):
            raise OptionError(f"measurement {self.name!r}: give both peer and peer_value, or neither.")

    @property
    def ratio(self) -> float | None:
        if self.peer_value is None:
            return None
        if self.peer_value == 0:
            return float("inf") if self.value > 0 else float("nan")
        return self.value / self.peer_value

    @property
    def compared(self) -> float:
        """The number the target is checked against: the ratio with a peer, else the value."""
        ratio = self.ratio
        return self.value if ratio is None else ratio

    @property
    def passed(self) -> bool | None:
        if self.target is None:
            return None
        if self.direction == HIGHER:
            return self.compared >= self.target
        return self.compared <= self.target

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(ratio=self.ratio, passed=self.passed)
        return d


@dataclasses.dataclass(frozen=True)
class TimingStats:
    """Wall-clock seconds per call over ``repeat`` timed calls (after the warmup calls)."""

    median: float
    min: float
    mean: float
    repeat: int


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """Peak memory of a call in bytes: ``peak`` for the whole process, ``delta`` above the peak before it."""

    peak: int
    baseline: int

    @property
    def delta(self) -> int:
        return max(0, self.peak - self.baseline)


def time_call(fn: Callable[[], object], repeat: int = 10, warmup: int = 2) -> TimingStats:
    """Call ``fn`` ``warmup`` times untimed, then ``repeat`` times timed with perf_counter."""
    if repeat < 1 or warmup < 0:
        raise OptionError(f"time_call: repeat must be >= 1 and warmup >= 0 (got {repeat}, {warmup}).")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return TimingStats(statistics.median(times), min(times), statistics.fmean(times), repeat)


def time_interleaved(
    fns: Mapping[str, Callable[[], object]], repeat: int = 10, warmup: int = 2
) -> dict[str, TimingStats]:
    """Time several functions in rounds (a, b, c, a, b, c, ...) so a change in machine load hits all alike.

    Every ratio between two of the results then compares timings taken in the same rounds of one run.
    """
    if repeat < 1 or warmup < 0:
        raise OptionError(f"time_interleaved: repeat must be >= 1 and warmup >= 0 (got {repeat}, {warmup}).")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - start)
    return {
        k: TimingStats(statistics.median(t), min(t), statistics.fmean(t), repeat) for k, t in times.items()
    }


def time_pair(
    ours: Callable[[], object], peer: Callable[[], object], repeat: int = 10, warmup: int = 2
) -> tuple[TimingStats, TimingStats]:
    """Time two functions alternately (ours, peer, ours, ...) so a change in machine load hits both alike."""
    if repeat < 1 or warmup < 0:
        raise OptionError(f"time_pair: repeat must be >= 1 and warmup >= 0 (got {repeat}, {warmup}).")
    t = time_interleaved({"ours": ours, "peer": peer}, repeat, warmup)
    return t["ours"], t["peer"]


def _status_kib(field: str) -> int | None:
    """A ``Vm*`` figure of /proc/self/status in KiB (None off Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _rss_child(fn: Callable[..., object], args: tuple[Any, ...], queue: Any) -> None:
    # ru_maxrss survives fork+exec (a spawn child starts with its parent's peak), so use VmHWM, the peak
    # of this process's own memory, reset to the current RSS just before the call where the kernel allows.
    try:
        Path("/proc/self/clear_refs").write_text("5")
        before = _status_kib("VmRSS")
    except OSError:
        before = _status_kib("VmHWM")
    if before is None:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    try:
        fn(*args)
    except BaseException as e:  # report any failure back to the parent instead of hanging it
        queue.put(("error", f"{type(e).__name__}: {e}"))
        return
    after = _status_kib("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put(("ok", (after * 1024, before * 1024)))


def peak_rss(fn: Callable[..., object], *args: Any, timeout: float = 600.0) -> MemoryStats:
    """Run ``fn(*args)`` in a fresh 'spawn' child and return its peak resident set size.

    ``fn`` must be importable (a module-level function). The baseline is the child's resident size just
    before the call (interpreter and imports), so ``delta`` is what the call itself added at its peak.
    """
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_rss_child, args=(fn, args, queue))
    proc.start()
    try:
        status, payload = queue.get(timeout=timeout)
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
    if status != "ok":
        raise RuntimeError(f"peak_rss: {getattr(fn, '__name__', fn)} failed in the child: {payload}")
    peak, baseline = payload
    return MemoryStats(peak=peak, baseline=baseline)


def traced_peak(fn: Callable[..., object], *args: Any) -> MemoryStats:
    """Peak bytes allocated through Python's allocator (numpy arrays included) while ``fn`` runs.

    In-process and cheap, but blind to native allocations (ORT, torch): use peak_rss for those.
    """
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        fn(*args)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return MemoryStats(peak=peak, baseline=base)


@dataclasses.dataclass(frozen=True)
class BenchContext:
    """What every benchmark gets: timed repeats, untimed warmups, and quick mode (smaller, for smoke runs)."""

    repeat: int = 10
    warmup: int = 2
    quick: bool = False
    #: What the running benchmark declared with ``describe`` (taken by run_benchmarks after each one).
    described: list[Setup] = dataclasses.field(default_factory=list, compare=False, repr=False)

    def describe(
        self,
        models: Sequence[str],
        samples: Mapping[str, int] | None = None,
        seeds: Mapping[str, int] | None = None,
        note: str = "",
    ) -> None:
        """Declare the models, sample counts and seeds this benchmark uses (printed above its figures)."""
        self.described.append(Setup(tuple(models), dict(samples or {}), dict(seeds or {}), note))

    def time(self, fn: Callable[[], object]) -> TimingStats:
        return time_call(fn, self.repeat, self.warmup)

    def time_pair(
        self, ours: Callable[[], object], peer: Callable[[], object]
    ) -> tuple[TimingStats, TimingStats]:
        return time_pair(ours, peer, self.repeat, self.warmup)

    def time_interleaved(self, fns: Mapping[str, Callable[[], object]]) -> dict[str, TimingStats]:
        return time_interleaved(fns, self.repeat, self.warmup)


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A registered benchmark: ``target`` is a callable or a lazy "module:function" reference."""

    name: str
    target: str | Callable[[BenchContext], list[Measurement]]
    description: str = ""

    def load(self) -> Callable[[BenchContext], list[Measurement]]:
        if callable(self.target):
            return self.target
        module, _, func = self.target.partition(":")
        return getattr(importlib.import_module(module), func)


@dataclasses.dataclass
class BenchResult:
    """A benchmark's measurements, wall time, and the error text when it raised."""

    name: str
    measurements: list[Measurement]
    seconds: float
    error: str | None = None
    setup: Setup | None = None

    @property
    def failed(self) -> bool:
        return any(m.passed is False for m in self.measurements)


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


def run_benchmarks(
    names: Sequence[str] | None,
    ctx: BenchContext,
    registry: Mapping[str, Benchmark] = REGISTRY,
) -> list[BenchResult]:
    """Run the named benchmarks (all when ``names`` is empty), catching each one's failure."""
    names = list(names or []) or list(registry)
    for name in names:
        if name not in registry:
            raise OptionError(
                f"unknown benchmark {name!r}.{did_you_mean(name, registry)} Known: {', '.join(registry)}."
            )
    results = []
    for name in names:
        start = time.perf_counter()
        ctx.described.clear()
        try:
            measurements = list(registry[name].load()(ctx))
            error = None
        except Exception as e:
            logger.debug("benchmark %s failed:\n%s", name, traceback.format_exc())
            measurements, error = [], f"{type(e).__name__}: {e}"
        setup = ctx.described[-1] if ctx.described else None
        results.append(BenchResult(name, measurements, time.perf_counter() - start, error, setup))
    return results


def _num(v: float | None) -> str:
    """Four significant digits, without exponents for everyday magnitudes (12,345 not 1.234e+04)."""
    if v is None:
        return "-"
    if 1e4 <= abs(v) < 1e15:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def _rows(results: Sequence[BenchResult]) -> list[list[str]]:
    rows = []
    for r in results:
        if r.error:
            rows.append([r.name, "ERROR", r.error, "-", "-", "-", "-"])
        for m in r.measurements:
            peer = f"{m.peer}: {_num(m.peer_value)} {m.unit}" if m.peer is not None else "-"
            ratio = f"{_num(m.ratio)}x" if m.ratio is not None else "-"
            sign = ">=" if m.direction == HIGHER else "<="
            target = f"{sign} {_num(m.target)}" if m.target is not None else "-"
            verdict = {None: "-", True: "pass", False: "FAIL"}[m.passed]
            rows.append([r.name, m.name, f"{_num(m.value)} {m.unit}", peer, ratio, target, verdict])
    return rows


_HEADERS = ["benchmark", "measurement", "ours", "peer", "ratio (ours/peer)", "target", "verdict"]


def render_table(results: Sequence[BenchResult]) -> Table:
    """A rich table with one row per measurement (ratios, targets and verdicts)."""
    table = Table(title="zonnx benchmarks")
    for h in _HEADERS:
        table.add_column(h, justify="right" if h in ("ours", "ratio (ours/peer)") else "left")
    style = {"pass": "green", "FAIL": "bold red", "ERROR": "bold red"}
    for row in _rows(results):
        key = row[6] if row[1] != "ERROR" else "ERROR"
        table.add_row(*row, style=style.get(key))
    return table


def header(results: Sequence[BenchResult], ctx: BenchContext) -> list[str]:
    """Host, versions, timing settings, and each benchmark's models (with provenance), samples and seeds."""
    lines = [*host_lines(), f"timing: repeat {ctx.repeat}, warmup {ctx.warmup}, quick {ctx.quick}"]
    for r in results:
        lines += setup_lines(r.name, r.setup)
    return lines


def to_markdown(results: Sequence[BenchResult], ctx: BenchContext | None = None) -> str:
    """The same table as GitHub markdown, to paste into docs/benchmarks.md (after the header, as a list)."""
    lines = [f"- {h}" for h in header(results, ctx)] + [""] if ctx is not None else []
    lines += ["| " + " | ".join(_HEADERS) + " |", "|" + "---|" * len(_HEADERS)]
    for row in _rows(results):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    notes = note_lines(results)
    if notes:
        lines += ["", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"


def note_lines(results: Sequence[BenchResult]) -> list[str]:
    """Each measurement's note, as "benchmark, measurement: note" (printed under the table)."""
    return [f"note on {r.name}, {m.name}: {m.note}" for r in results for m in r.measurements if m.note]


def to_json(results: Sequence[BenchResult], ctx: BenchContext) -> dict[str, Any]:
    """Results as plain data: context, then per benchmark its seconds, error and measurements."""
    return {
        "context": {"repeat": ctx.repeat, "warmup": ctx.warmup, "quick": ctx.quick},
        "python": sys.version.split()[0],
        "header": header(results, ctx),
        "benchmarks": [
            {
                "name": r.name,
                "seconds": r.seconds,
                "error": r.error,
                "measurements": [m.as_dict() for m in r.measurements],
            }
            for r in results
        ],
    }


def main(argv: Sequence[str] | None = None, registry: Mapping[str, Benchmark] = REGISTRY) -> int:
    """CLI entry: exit 1 when a benchmark raised (or, with --strict, missed a target), else 0."""
    parser = argparse.ArgumentParser(prog="python -m bench.runner", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (smoke run)")
    parser.add_argument("--repeat", type=int, default=None, help="timed repeats (default 10, quick 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed warmup calls (default 2, quick 1)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table instead of rich")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a measurement misses its target")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # piped output: do not squeeze the table into 80 columns
    if args.list:
        for b in registry.values():
            console.print(f"{b.name}: {b.description}")
        return 0
    ctx = BenchContext(
        repeat=args.repeat or (3 if args.quick else 10),
        warmup=args.warmup if args.warmup is not None else (1 if args.quick else 2),
        quick=args.quick,
    )
    try:
        results = run_benchmarks(args.names, ctx, registry)
    except OptionError as e:
        console.print(f"error: {e}", style="red", markup=False, highlight=False)
        return 2
    if args.markdown:
        print(to_markdown(results, ctx), end="")
    else:
        for line in header(results, ctx):
            console.print(line, markup=False, highlight=False)
        console.print(render_table(results))
        for line in note_lines(results):
            console.print(line, markup=False, highlight=False)
    if args.json:
        args.json.write_text(json.dumps(to_json(results, ctx), indent=2) + "\n")
    if any(r.error for r in results):
        return 1
    return 1 if args.strict and any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
