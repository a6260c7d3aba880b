"""What every benchmark output states before its figures: the host (CPU model, cores, the integer instruction
set and path from ``zonnx.hostcpu``), the versions of everything timed, and per benchmark its models with
their provenance (pretrained, trained here, random weights), sample counts and seeds.

A figure without these cannot be compared with another: speeds depend on the CPU and the versions,
accuracies on the model's provenance and the data drawn.
"""

from __future__ import annotations

__all__ = ["Setup", "host_cpu", "versions", "model_line", "host_lines", "setup_lines"]

import dataclasses
import importlib.metadata
import os
import sys
from collections.abc import Mapping

from zonnx import zoo
from zonnx.hostcpu import cpu_name, host_int

_PACKAGES = ("zonnx", "onnx", "onnxruntime", "onnx-ir", "numpy", "torch")


@dataclasses.dataclass(frozen=True)
class Setup:
    """One benchmark's inputs: zoo models (or a description), sample counts by role, and seeds by role."""

    models: tuple[str, ...]
    samples: Mapping[str, int] = dataclasses.field(default_factory=dict)
    seeds: Mapping[str, int] = dataclasses.field(default_factory=dict)
    note: str = ""


def host_cpu() -> str:
    """The CPU's model name (/proc/cpuinfo, else platform) and the cores this process may use."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu_name()}, {cores} cores"


def versions() -> dict[str, str]:
    """Python and the installed versions of the packages the benchmarks time."""
    out = {"python": sys.version.split()[0]}
    for pkg in _PACKAGES:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def model_line(name: str) -> str:
    """``name`` with its provenance: a zoo model says where its weights come from; other names pass through."""
    if name not in zoo.ZOO:
        return name
    origin = {
        "pretrained": "pretrained third-party weights",
        "trained here": "trained here at first use",
        "random": "random weights",
    }[zoo.provenance(name)]
    return f"{name} [{origin}]: {zoo.ZOO[name].description}"


def host_lines() -> list[str]:
    """The lines naming the host and the versions (the same for every benchmark of a run)."""
    host = host_int()
    vers = ", ".join(f"{k} {v}" for k, v in versions().items())
    threads = os.environ.get("ZONNX_THREADS", "0 (ORT's choice)")
    return [
        f"host: {host_cpu()}; integer ISA {host.isa}, integer path {host.path}; ZONNX_THREADS {threads}",
        f"versions: {vers}",
    ]


def setup_lines(name: str, setup: Setup | None) -> list[str]:
    """The lines naming one benchmark's models (with provenance), sample counts and seeds."""
    if setup is None:
        return [f"{name}: (this benchmark does not describe its setup)"]
    lines = [f"{name}: model {model_line(m)}" for m in setup.models]
    counts = ", ".join(f"{k} {v}" for k, v in setup.samples.items()) or "-"
    seeds = ", ".join(f"{k} {v}" for k, v in setup.seeds.items()) or "-"
    lines.append(f"{name}: samples {counts}; seeds {seeds}" + (f"; {setup.note}" if setup.note else ""))
    return lines
