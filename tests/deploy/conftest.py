"""A small config build of the digits CNN, shared by the report and Ray tests (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from zonnx.deploy import BuildRun, load_build_config, run_config

SMALL = """\
out_dir = "out"
[model]
source = "digits_cnn"
[optimize]
verify = false
[quantize]
samples = 32
[compile]
target = "{target}"
[evaluate]
dataset = "digits"
samples = {samples}
batch = 25
"""


def write_config(folder: Path, target: str = "dpu-b4096", samples: int = 100, extra: str = "") -> Path:
    """A build.toml in ``folder`` for the digits CNN (few samples, no per-pass verification)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "build.toml"
    path.write_text(SMALL.format(target=target, samples=samples) + extra)
    return path


def build(path: Path, **kwargs) -> BuildRun:
    return run_config(load_build_config(path), Console(width=120, record=True), **kwargs)


@pytest.fixture(scope="session")
def digits_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BuildRun]:
    path = write_config(tmp_path_factory.mktemp("digits_build"))
    return path, build(path)
