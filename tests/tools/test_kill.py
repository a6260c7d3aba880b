"""SIGKILL at any moment (issue 17, item 8): each writing command is killed inside its save and in the
middle of its work; its destination is then untouched (the previous file, byte for byte) or complete,
and after one more successful run no zonnx temporary is left in the folder."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from zonnx import zoo
from zonnx.build_npu import target_quantize_kwargs
from zonnx.quantization.calibration.readers import ListReader

_PREVIOUS = b"previous contents\n"
_ZONNX = str(Path(sys.executable).with_name("zonnx"))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import zonnx

    d = tmp_path_factory.mktemp("kill-inputs")
    shutil.copy(zoo.get("digits_cnn"), d / "m.onnx")
    feeds = zoo.sample_inputs("digits_cnn", 8)
    np.savez(d / "c.npz", input=np.concatenate([f["input"] for f in feeds]))
    zonnx.quantize_static(
        str(d / "m.onnx"), str(d / "q.onnx"), ListReader(feeds), **target_quantize_kwargs("dpu-b4096")
    )
    return {"m": d / "m.onnx", "q": d / "q.onnx", "c": d / "c.npz"}


#: command line (with {m} {q} {c} inputs and {o} the destination), the destination's name, and the
#: ``zonnx.faults`` point inside its save.
COMMANDS = {
    "optimize": (["optimize", "{m}", "{o}"], "out.onnx", "save-model"),
    "quantize": (["quantize", "{m}", "{o}", "--calib", "{c}"], "out.onnx", "save-model"),
    "compile": (["compile", "{q}", "-o", "{o}"], "out.onnx", "save-model"),
    "run": (["run", "{q}", "-i", "{c}", "-o", "{o}"], "out.npz", "save-bytes"),
}


def _intact_or_complete(path: Path) -> None:
    """The destination holds the previous bytes, or a whole file of its kind."""
    data = path.read_bytes()
    if data == _PREVIOUS:
        return
    if path.suffix == ".onnx":
        onnx.checker.check_model(onnx.ModelProto.FromString(data), full_check=True)
    else:
        with np.load(path) as arrays:
            assert arrays.files


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".zonnx-" in p.name)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_killed_command_leaves_the_destination_intact_or_complete(
    inputs: dict[str, Path], tmp_path: Path, command: str
) -> None:
    template, name, point = COMMANDS[command]
    dest = tmp_path / name
    args = [a.format(m=inputs["m"], q=inputs["q"], c=inputs["c"], o=dest) for a in template]
    env = dict(os.environ, ZONNX_CACHE_DIR=str(tmp_path / "cache"))
    before = {k: p.read_bytes() for k, p in inputs.items()}

    # 1. inside the save (half the temporary written), the destination holding a previous file
    dest.write_bytes(_PREVIOUS)
    killed = subprocess.run(
        [_ZONNX, *args], capture_output=True, env=dict(env, ZONNX_KILL_AT=f"{point}:{name}")
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert dest.read_bytes() == _PREVIOUS
    assert _temporaries(tmp_path), "the kill point is not inside the save: no temporary was left"

    # 2. in the middle of the work, at half of a full run's time
    started = time.perf_counter()
    full = subprocess.run([_ZONNX, *args], capture_output=True, env=env)
    assert full.returncode == 0, full.stderr
    duration = time.perf_counter() - started
    dest.write_bytes(_PREVIOUS)
    proc = subprocess.Popen([_ZONNX, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    time.sleep(duration / 2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _intact_or_complete(dest)

    # 3. one more successful run sweeps what the killed ones left
    final = subprocess.run(
        [str(Path(sys.executable).with_name("zonnx")), *args], capture_output=True, env=env
    )
    assert final.returncode == 0, final.stderr
    _intact_or_complete(dest)
    assert dest.read_bytes() != _PREVIOUS
    assert _temporaries(tmp_path) == []
    assert {k: p.read_bytes() for k, p in inputs.items()} == before
