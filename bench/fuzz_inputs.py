"""Seeded mutation fuzzer of the CLI: broken models, calibration files and target files through every command.

``python -m bench.fuzz_inputs --cases 2000 --seed 0`` builds valid seeds (the digits CNN, its
dpu-b4096 quantized model, a calibration ``.npz`` and a copy of a target file), then for each case
picks a command (or a Python entry point: ``@session`` for ``zonnx.InferenceSession``,
``@quantize_static``), mutates one of its input files (``bench.fuzz_mutations``) and runs it in a worker
process (``bench.fuzz_worker``). A case fails when:

- a traceback escapes (anything but a ``ZonnxError`` or a usage error),
- it hangs longer than ``--timeout`` seconds (the worker is killed and restarted),
- an input file changed, or
- it exited non-zero and left a file behind, or exited 0 and left a zonnx temporary behind.

Case ``i`` draws from ``random.Random(f"{seed}:{i}")``, so any case replays alone (``--only I``).
The CI runs a fixed slice (``tests/bench/test_fuzz_slice.py``); the full figure is in docs/benchmarks.md.
"""

from __future__ import annotations

__all__ = ["CaseResult", "CliWorker", "FuzzSummary", "make_seeds", "plan_case", "run_fuzz", "main"]

import argparse
import dataclasses
import hashlib
import json
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.fuzz_mutations import mutate
from bench.header import host_lines

#: (command template, the placeholders it reads); {D} is the case folder.
COMMANDS: list[list[str]] = [
    ["inspect", "{M}"],
    ["inspect", "{Q}"],
    ["optimize", "{M}", "{D}/o.onnx"],
    ["quantize", "{M}", "{D}/q.onnx", "--calib", "{C}"],
    ["quantize", "{M}", "{D}/q.onnx", "--calib", "{C}", "--target", "{T}"],
    ["compile", "{Q}", "-o", "{D}/c.onnx", "--target", "{T}"],
    ["run", "{Q}", "--target", "{T}", "-i", "{C}", "-o", "{D}/y.npz"],
    ["profile", "{Q}", "--target", "{T}"],
    ["build", "{M}", "-o", "{D}/out", "--calib", "{C}", "--target", "{T}", "--no-verify"],
    ["@session", "{Q}", "{T}", "{C}"],
    ["@quantize_static", "{M}", "{D}/q.onnx", "{C}"],
]
_KINDS = {"M": "onnx", "Q": "onnx", "C": "npz", "T": "toml"}
_FILES = {"M": "model.onnx", "Q": "model_q.onnx", "C": "calib.npz", "T": "target.toml"}


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """What one case did and which rules it broke (empty ``problems`` = passed)."""

    index: int
    args: list[str]
    mutation: str
    exit_code: int | None
    problems: list[str]
    detail: str = ""


@dataclasses.dataclass
class FuzzSummary:
    """Counts over a run, by rule."""

    cases: int = 0
    tracebacks: int = 0
    hangs: int = 0
    inputs_changed: int = 0
    files_left: int = 0
    exits: dict[int, int] = dataclasses.field(default_factory=dict)
    failures: list[CaseResult] = dataclasses.field(default_factory=list)
    results: list[CaseResult] = dataclasses.field(default_factory=list)

    def add(self, result: CaseResult) -> None:
        self.cases += 1
        code = -1 if result.exit_code is None else result.exit_code
        self.exits[code] = self.exits.get(code, 0) + 1
        for problem in result.problems:
            setattr(self, problem, getattr(self, problem) + 1)
        self.results.append(result)
        if result.problems:
            self.failures.append(result)


def make_seeds(folder: Path) -> dict[str, Path]:
    """Valid inputs: digits CNN float and dpu-b4096 quantized models, 8 calibration samples, a target file."""
    import numpy as np

    import zonnx
    from zonnx import zoo
    from zonnx.backend.targets import TARGETS_DIR
    from zonnx.build_npu import target_quantize_kwargs
    from zonnx.quantization.calibration.readers import ListReader

    folder.mkdir(parents=True, exist_ok=True)
    seeds = {key: folder / name for key, name in _FILES.items()}
    shutil.copyfile(zoo.get("digits_cnn"), seeds["M"])
    feeds = zoo.sample_inputs("digits_cnn", 8)
    np.savez(seeds["C"], input=np.concatenate([f["input"] for f in feeds]))
    shutil.copyfile(TARGETS_DIR / "dpu-b4096.toml", seeds["T"])
    kwargs = target_quantize_kwargs("dpu-b4096")
    zonnx.quantize_static(str(seeds["M"]), str(seeds["Q"]), ListReader(feeds), **kwargs)
    return seeds


def plan_case(
    index: int, seed: int, seeds: dict[str, Path], folder: Path
) -> tuple[list[str], str, dict[str, Path]]:
    """Case ``index``: copy the seeds into ``folder``, mutate one input of a random command, return its args."""
    rng = random.Random(f"{seed}:{index}")
    template = rng.choice(COMMANDS)
    used = sorted({key for arg in template for key in _KINDS if "{" + key + "}" in arg})
    victim = rng.choice(used)
    folder.mkdir(parents=True)
    inputs = {}
    for key in used:
        path = folder / _FILES[key]
        data = seeds[key].read_bytes()
        if key == victim:
            data, label = mutate(_KINDS[key], data, rng)
            mutation = f"{_FILES[key]}: {label}"
        path.write_bytes(data)
        inputs[key] = path
    values = {key: str(path) for key, path in inputs.items()} | {"D": str(folder)}
    return [arg.format(**values) for arg in template], mutation, inputs


def _digests(paths: dict[str, Path]) -> dict[str, str]:
    return {key: hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else "" for key, p in paths.items()}


class CliWorker:
    """One ``bench.fuzz_worker`` process; restarted after a hang."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "bench.fuzz_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=self.env,
            cwd=Path(__file__).resolve().parent.parent,
        )

    def run(self, args: list[str], cwd: Path, timeout: float) -> dict[str, object] | None:
        """The worker's answer, or None after ``timeout`` seconds (the worker is then killed)."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"args": args, "cwd": str(cwd)}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            return None
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def _judge(
    index: int,
    args: list[str],
    mutation: str,
    answer: dict | None,
    folder: Path,
    inputs: dict[str, Path],
    before: dict[str, str],
    listing: set[str],
) -> CaseResult:
    """Apply the four rules to one finished case."""
    problems, detail = [], "" if answer is None else str(answer["stderr"]).strip()[-300:]
    code = None if answer is None else int(answer["exit"])
    if answer is None:
        problems.append("hangs")
    elif answer["traceback"]:
        problems.append("tracebacks")
        detail = str(answer["traceback"]).strip().splitlines()[-1]
    if _digests(inputs) != before:
        problems.append("inputs_changed")
    added = {p.name for p in folder.iterdir()} - listing
    litter = added if code not in (0, None) else {name for name in added if ".zonnx-" in name}
    if litter:
        problems.append("files_left")
        detail = f"left {sorted(litter)}; {detail}"
    return CaseResult(index, args, mutation, code, problems, detail)


def run_fuzz(
    cases: int,
    seed: int = 0,
    *,
    jobs: int = 2,
    timeout: float = 60.0,
    only: list[int] | None = None,
    keep: Path | None = None,
) -> FuzzSummary:
    """Run ``cases`` seeded cases on ``jobs`` workers and count rule violations."""
    root = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="zonnx-fuzz-"))
    env = dict(os.environ, ZONNX_CACHE_DIR=str(root / "npu-cache"), PYTHONWARNINGS="ignore")
    seeds = make_seeds(root / "seeds")
    indices = list(only) if only else list(range(cases))
    summary, lock = FuzzSummary(), threading.Lock()

    def work() -> None:
        worker = CliWorker(env)
        try:
            while True:
                with lock:
                    if not indices:
                        return
                    index = indices.pop(0)
                folder = root / f"case{index:05d}"
                args, mutation, inputs = plan_case(index, seed, seeds, folder)
                before, listing = _digests(inputs), {p.name for p in folder.iterdir()}
                answer = worker.run(args, folder, timeout)
                result = _judge(index, args, mutation, answer, folder, inputs, before, listing)
                with lock:
                    summary.add(result)
                if not result.problems:
                    shutil.rmtree(folder, ignore_errors=True)
        finally:
            worker.close()

    threads = [threading.Thread(target=work) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not keep and not summary.failures:
        shutil.rmtree(root, ignore_errors=True)
    summary.failures.sort(key=lambda r: r.index)
    return summary


def main(argv: list[str] | None = None) -> int:
    """CLI: print the counts and each failing case; exit 1 when any rule was broken."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--only", type=int, nargs="*", help="replay these case indices")
    parser.add_argument("--keep", type=Path, help="work folder to keep (failing cases stay there anyway)")
    parser.add_argument("--verbose", action="store_true", help="print every case with its last stderr line")
    ns = parser.parse_args(argv)
    for line in host_lines():
        print(f"- {line}")
    start = time.perf_counter()
    s = run_fuzz(ns.cases, ns.seed, jobs=ns.jobs, timeout=ns.timeout, only=ns.only, keep=ns.keep)
    if ns.verbose:
        for r in sorted(s.results, key=lambda r: r.index):
            last = r.detail.splitlines()[-1] if r.detail else ""
            print(f"case {r.index} exit {r.exit_code} {r.mutation} :: {r.args[0]} :: {last[:160]}")
    for r in s.failures:
        print(
            f"case {r.index} [{', '.join(r.problems)}] {r.mutation} :: zonnx {' '.join(r.args)} :: {r.detail}"
        )
    print(
        f"seed {ns.seed}: {s.cases} cases in {time.perf_counter() - start:.0f} s; tracebacks {s.tracebacks}, "
        f"hangs {s.hangs}, inputs changed {s.inputs_changed}, files left {s.files_left}; exit codes {dict(sorted(s.exits.items()))}"
    )
    return 1 if s.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
