"""Peer quantizers in their own virtualenvs: created on demand, pinned, never a dependency of zonnx.

Each peer gets ``bench/.peers-venv/<peer>`` (git-ignored), made with ``python -m venv`` and
``pip install`` of the peer's pinned packages plus the onnx and onnxruntime versions zonnx's own
environment has (pyproject.toml pins them), so the peer calibrates with the same ORT that evaluates
every model. A file in the venv records what was installed; a venv whose record differs from the
wanted pins is made again. A peer that cannot be installed (no network, a timeout, a resolver error)
raises ``PeerUnavailable`` with the reason, and the benchmark prints it and goes on without that peer.

A peer script (``bench/peers/<peer>_quantize.py``) runs as a subprocess of that venv's interpreter:
``FLOAT.onnx CALIB.npz OUT.onnx [flags]`` -> the quantized model and one JSON line on stdout.
"""

from __future__ import annotations

__all__ = [
    "PEERS_ROOT",
    "PEERS",
    "PeerSpec",
    "PeerUnavailable",
    "pinned_runtime",
    "ensure_venv",
    "run_peer",
    "save_feeds",
]

import dataclasses
import importlib.metadata
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

PEERS_ROOT = Path(__file__).resolve().parent / ".peers-venv"
SCRIPTS = Path(__file__).resolve().parent / "peers"
_RECORD = "zonnx-peer-requirements.txt"


class PeerUnavailable(RuntimeError):
    """A peer could not be installed or run; the message says why, in one line."""


@dataclasses.dataclass(frozen=True)
class PeerSpec:
    """A peer quantizer: its pinned packages, its script in bench/peers, and how long pip may take."""

    name: str
    packages: tuple[str, ...]
    script: str
    install_timeout: float = 900.0


#: The peers. torch is pinned for AIMET-ONNX to zonnx's own version (aimet-onnx needs torch at import).
PEERS: dict[str, PeerSpec] = {
    "nncf": PeerSpec("nncf", ("nncf==3.4.0",), "nncf_quantize.py"),
    "aimet": PeerSpec("aimet", ("aimet-onnx==2.42.0", "torch==2.13.0"), "aimet_quantize.py", 1500.0),
}


def pinned_runtime() -> tuple[str, ...]:
    """``onnx==X`` and ``onnxruntime==Y`` at the versions installed here (zonnx's pins)."""
    return tuple(f"{pkg}=={importlib.metadata.version(pkg)}" for pkg in ("onnx", "onnxruntime"))


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
    return lines[-1].strip() if lines else "(no output)"


def ensure_venv(spec: PeerSpec, root: Path = PEERS_ROOT) -> Path:
    """Return the interpreter of the peer's venv, creating and installing it first when needed."""
    venv = root / spec.name
    wanted = "\n".join((*spec.packages, *pinned_runtime())) + "\n"
    record = venv / _RECORD
    if _python(venv).is_file() and record.is_file() and record.read_text() == wanted:
        return _python(venv)
    if venv.exists():
        shutil.rmtree(venv)
    root.mkdir(parents=True, exist_ok=True)
    logger.warning("installing peer %s into %s (%s)", spec.name, venv, " ".join(wanted.split()))
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [
            str(_python(venv)),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *wanted.split(),
        ],
    ]
    for cmd in steps:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=spec.install_timeout)
        except subprocess.TimeoutExpired as e:
            shutil.rmtree(venv, ignore_errors=True)
            raise PeerUnavailable(
                f"{spec.name}: '{' '.join(cmd[:4])} ...' did not finish in {spec.install_timeout:.0f} s."
            ) from e
        if done.returncode:
            shutil.rmtree(venv, ignore_errors=True)
            raise PeerUnavailable(f"{spec.name}: {' '.join(cmd[2:4])} failed: {_last_line(done.stderr)}")
    record.write_text(wanted)
    return _python(venv)


def save_feeds(feeds: Sequence[Mapping[str, np.ndarray]], path: Path) -> Path:
    """Write feeds as one .npz keyed "<index>.<input name>" (the peer scripts' calibration format)."""
    np.savez(path, **{f"{i}.{name}": arr for i, feed in enumerate(feeds) for name, arr in feed.items()})
    return path


def run_peer(python: Path, spec: PeerSpec, args: Sequence[str], timeout: float = 1800.0) -> dict[str, Any]:
    """Run the peer's script with ``args``; return its JSON summary or raise PeerUnavailable with the error."""
    cmd = [str(python), str(SCRIPTS / spec.script), *args]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise PeerUnavailable(f"{spec.name}: {spec.script} did not finish in {timeout:.0f} s.") from e
    if done.returncode:
        logger.debug("%s stderr:\n%s", spec.script, done.stderr)
        raise PeerUnavailable(
            f"{spec.name}: {spec.script} exited {done.returncode}: {_last_line(done.stderr)}"
        )
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError) as e:
        raise PeerUnavailable(f"{spec.name}: {spec.script} printed no JSON summary line.") from e
