"""Timing and memory helpers for the benchmarks: timed calls, interleaved rounds, peak memory."""

from __future__ import annotations

__all__ = [
    "TimingStats",
    "MemoryStats",
    "time_call",
    "time_interleaved",
    "time_pair",
    "peak_rss",
    "traced_peak",
]

import dataclasses
import multiprocessing
import resource
import statistics
import time
import tracemalloc
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from zonnx.errors import OptionError


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
