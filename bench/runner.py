"""Benchmark runner: runs the registry's benchmarks (``registry.py``; timing and memory helpers in
``timing.py``, re-exported here) and prints table/markdown/JSON output.

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
import json
import logging
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.header import Setup, host_lines, setup_lines
from bench.registry import REGISTRY, Benchmark
from bench.timing import (
    MemoryStats,
    TimingStats,
    peak_rss,
    time_call,
    time_interleaved,
    time_pair,
    traced_peak,
)
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
