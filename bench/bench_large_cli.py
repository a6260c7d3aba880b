"""Every ``zonnx`` command on a model past 2 GiB, run from the CLI as a user runs it, each in its own process.

Models: the MatMul -> Relu chain of ``bench_large_model`` (33 layers, 4096 wide: 2.21 GB of float weights
in external data) and, for ``convert``, a torch module defined as real ones are (33 ``nn.Linear(4096,
4096)`` + ReLU blocks in a ``model.py:Class`` file, 2.22 GB of float32 weights). Quick: 4 layers, 1024
wide, with ``ZONNX_PROTO_LIMIT`` lowered to 100 kB so the commands take the paths of a model past 2 GiB.

Per command: wall time of the process, its peak resident set size (``ru_maxrss`` of the child from
``os.wait4``, so mapped weight pages count; the chain is written by a spawned child, so this process, whose
peak every child's ``ru_maxrss`` starts from, stays small) over the bytes of the float weights it works on, and whether it
passed: exit code 0 and an output that loads (an ORT session from its path for plain models, a zonnx NPU
session for compiled ones, finite arrays for ``run``'s .npz; in a separate process). The peer of
``zonnx run`` on the compiled model is ORT creating a session on the QDQ model and running it once, in a
process of its own.
"""

from __future__ import annotations

__all__ = ["bench_large_cli"]

import dataclasses
import logging
import multiprocessing
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from bench.bench_large_model import make_chain
from bench.runner import HIGHER, LOWER, BenchContext, Measurement

logger = logging.getLogger(__name__)

TORCH_MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    class BigMlp(nn.Module):
        def __init__(self, width: int = {width}, depth: int = {depth}):
            super().__init__()
            torch.manual_seed(0)
            self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)])

        def forward(self, x):
            return self.blocks(x)
    """
)

_LOAD_ORT = "import sys, onnxruntime as ort; ort.InferenceSession(sys.argv[1])"
_LOAD_NPU = (
    "import sys, zonnx; zonnx.InferenceSession(sys.argv[1], providers=['ZonnxNPUExecutionProvider', "
    "'CPUExecutionProvider'], provider_options=[{'target': 'bm1684x', 'enable_cache': False}, {}])"
)
_LOAD_NPZ = "import sys, numpy as np; a = dict(np.load(sys.argv[1])); assert a and all(np.isfinite(v).all() for v in a.values())"
PEER = "ORT session + run on the QDQ model"
_ORT_RUN = (
    "import sys, numpy as np, onnxruntime as ort; s = ort.InferenceSession(sys.argv[1]); "
    "s.run(None, dict(np.load(sys.argv[2])))"
)


@dataclasses.dataclass(frozen=True)
class Proc:
    """One child process: exit code, wall seconds, peak RSS in bytes, the tail of its stderr."""

    code: int
    seconds: float
    peak: int
    tail: str


def run_child(args: list[str], cwd: str, env: dict[str, str]) -> Proc:
    """Run ``args``; its peak RSS is the child's own ``ru_maxrss`` (os.wait4), not the runner's."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        lines = [ln for ln in err.read().decode(errors="replace").strip().splitlines() if ln.strip()]
    return Proc(proc.returncode, seconds, usage.ru_maxrss * 1024, lines[-1][-240:] if lines else "")


def _zonnx() -> list[str]:
    exe = Path(sys.executable).with_name("zonnx")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "zonnx.tools.main"]


def _figures(
    name: str, p: Proc, loads: Proc | None, weight_bytes: int, peer: Proc | None
) -> list[Measurement]:
    """Wall time and peak RSS over the weights' bytes (against ``peer``'s, when given), and passed (exit 0
    and the output loads)."""
    ok = p.code == 0 and (loads is None or loads.code == 0)
    why = "" if ok else (f"exit {p.code}: {p.tail}" if p.code else f"output does not load: {loads.tail}")
    if why:
        logger.warning("%s: %s", name, why)
    vs = {"peer": PEER, "peer_value": peer.seconds} if peer is not None else {}
    mem = {"peer": PEER, "peer_value": peer.peak / weight_bytes} if peer is not None else {}
    return [
        Measurement(f"{name}: wall time", p.seconds, "s", LOWER, **vs),
        Measurement(f"{name}: peak RSS / weight bytes", p.peak / weight_bytes, "x", LOWER, **mem),
        Measurement(f"{name}: exit 0 and output loads", float(ok), "", HIGHER, target=1.0, note=why),
    ]


def bench_large_cli(ctx: BenchContext) -> list[Measurement]:
    width, layers = (1024, 4) if ctx.quick else (4096, 33)
    env = dict(os.environ)
    if ctx.quick:
        env["ZONNX_PROTO_LIMIT"] = "100000"
    chain_bytes = width * width * 4 * layers
    torch_bytes = (width * width + width) * 4 * layers
    ctx.describe(
        [f"MatMul->Relu chain {layers}x{width} ({chain_bytes / 1e9:.2f} GB)",
         f"torch BigMlp {layers}x Linear({width},{width}) ({torch_bytes / 1e9:.2f} GB)"],
        {"calibration": 8, "run": 1}, {"weights": 0, "calibration": 1, "run input": 2},
        note="each command a fresh process; peak RSS is the child's ru_maxrss",
    )  # fmt: skip
    zonnx = _zonnx()
    out: list[Measurement] = []
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        # in a child: a child's ru_maxrss starts at its parent's peak, so this process must stay small
        proc = multiprocessing.get_context("spawn").Process(
            target=make_chain, args=(f"{tmp}/m.onnx", width, layers)
        )
        proc.start()
        proc.join()
        rng = np.random.default_rng(1)
        np.savez(f"{tmp}/calib.npz", x=rng.standard_normal((8, width)).astype(np.float32))
        np.savez(f"{tmp}/in.npz", x=np.random.default_rng(2).standard_normal((1, width)).astype(np.float32))

        def step(name: str, args: list[str], output: str | None, compiled: bool = False,
                 peer: list[str] | None = None) -> None:  # fmt: skip
            p = run_child([*zonnx, *args], tmp, env)
            loads = None
            if output is not None and p.code == 0:
                code = _LOAD_NPZ if output.endswith(".npz") else _LOAD_NPU if compiled else _LOAD_ORT
                loads = run_child([sys.executable, "-c", code, output], tmp, env)
            against = run_child([sys.executable, "-c", *peer], tmp, env) if peer else None
            weights = torch_bytes if name.startswith("convert") else chain_bytes
            out.extend(_figures(name, p, loads, weights, against))

        step("inspect", ["inspect", "m.onnx"], None)
        step("optimize --verify", ["optimize", "m.onnx", "o.onnx", "--verify"], "o.onnx")
        _remove(tmp, "o.onnx")
        step("quantize --target bm1684x", ["quantize", "m.onnx", "q.onnx", "--calib", "calib.npz", "--target",
                                           "bm1684x"], "q.onnx")  # fmt: skip
        step(
            "compile bm1684x", ["compile", "q.onnx", "-t", "bm1684x", "-o", "c.onnx"], "c.onnx", compiled=True
        )
        step("run (compiled model, 1 input)", ["run", "c.onnx", "-i", "in.npz", "-o", "out.npz"], "out.npz",
             peer=[_ORT_RUN, "q.onnx", "in.npz"])  # fmt: skip
        _remove(tmp, "c.onnx", "q.onnx", "out.npz")
        step("build --target bm1684x", ["build", "m.onnx", "-o", "b", "--calib", "calib.npz", "--target",
                                        "bm1684x"], None)  # fmt: skip
        built = sorted(Path(tmp, "b").glob("*.onnx"))
        if built:  # the compiled model is the one named after the target twice
            compiled = [p for p in built if p.name.count("bm1684x") == 2]
            check = (
                run_child([sys.executable, "-c", _LOAD_NPU, str(compiled[0])], tmp, env) if compiled else None
            )
            out.append(Measurement("build: its compiled model loads", float(bool(check) and check.code == 0), "",
                                   HIGHER, target=1.0))  # fmt: skip
        _remove(tmp, "b", "m.onnx")
        Path(tmp, "big.py").write_text(TORCH_MODEL.format(width=width, depth=layers))
        step("convert model.py:Class (torch)", ["convert", "big.py:BigMlp", "-o", "big.onnx", "--input-shape",
                                                f"x:1,{width}"], "big.onnx")  # fmt: skip
    return out


def _remove(folder: str, *names: str) -> None:
    """Delete outputs (with their ``.data`` files) once measured, so the disk holds one large model at a time."""
    import shutil

    for name in names:
        for p in [Path(folder, name), *Path(folder).glob(name + ".*")]:
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
