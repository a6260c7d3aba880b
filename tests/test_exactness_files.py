"""tools/exactness.sh runs the exactness subset only from the test modules its grep pattern finds
(collecting every module under qemu costs minutes): a test marked in a way the pattern misses would
silently drop out of the emulated runs, so this fails first (one native collection of the suite, ~25 s)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SCRIPT = (ROOT / "tools" / "exactness.sh").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def exactness_ids() -> list[str]:
    """Node ids of every test the whole suite selects with ``-m exactness``."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-m",
            "exactness",
            "-p",
            "no:cacheprovider",
            "tests",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    assert len(ids) > 100, "the exactness subset looks empty: was the marker renamed?"
    return ids


def test_every_exactness_test_lives_in_a_file_the_emulated_run_collects(exactness_ids: list[str]) -> None:
    pattern = re.search(r"grep -rlE --include='test_\*\.py' '([^']+)' tests", SCRIPT)
    assert pattern is not None, "tools/exactness.sh no longer finds its files with grep -rlE"
    files = {line.split("::", 1)[0] for line in exactness_ids}
    missed = sorted(
        f for f in files if not re.search(pattern.group(1), (ROOT / f).read_text(encoding="utf-8"))
    )
    assert not missed, f"exactness tests that tools/exactness.sh would not collect: {missed}"
