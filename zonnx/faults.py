"""Fault injection for the kill tests: ``ZONNX_KILL_AT=<point>[:<file name>]`` makes the process SIGKILL
itself there.

The points sit where a kill does the most harm (half-way through writing a temporary beside an output),
so a test can prove that such a kill leaves the destination untouched and that the next run sweeps the
temporary, without racing a timer against a save that takes a millisecond. Unset, it costs one lookup.
"""

from __future__ import annotations

__all__ = ["KILL_POINTS", "kill_point"]

import os
import signal

#: Where ``ZONNX_KILL_AT`` can stop the process.
KILL_POINTS = ("save-model", "save-bytes")


def kill_point(name: str, file_name: str) -> None:
    """SIGKILL this process when ``ZONNX_KILL_AT`` is ``name`` (a point of ``KILL_POINTS``) or
    ``name:file_name`` (only while writing the output called ``file_name``)."""
    wanted = os.environ.get("ZONNX_KILL_AT")
    if wanted is not None and wanted in (name, f"{name}:{file_name}"):
        os.kill(os.getpid(), signal.SIGKILL)
