"""``zonnx quantize --shards N [--ray]``: which executor runs the calibration shards and the search's tasks.

Rules. ``--shards N`` (N > 1) cuts the calibration batches into N contiguous shards, one task each
(``extra_options CalibShards``); the statistics are folded in batch order, so they, the ranges and the
scales equal one process's bit for bit whatever runs the tasks. Without ``--ray`` the tasks run in this
process one after the other (the driver then holds one shard's records at a time). ``--ray`` runs them
as Ray tasks on a local Ray started for the command, or on the cluster at ``--ray-address``; with
``--accuracy-budget`` the search's tasks go there too: the sensitivity tasks (``--measure-layers``) and
its trials, as many per round as Ray has CPUs (``search/budget.py``). An option that would change
nothing is refused: ``--ray`` with no task to send, ``--shards`` when saved statistics or a table
replace calibration.
"""

from __future__ import annotations

__all__ = ["quantize_executor"]

import logging
from typing import Any

from zonnx.errors import OptionError

logger = logging.getLogger(__name__)


def quantize_executor(
    shards: int,
    ray: bool,
    ray_address: str | None,
    *,
    budget: float | None,
    skips_calibration: bool,
) -> Any:
    """The executor for ``quantize_static``'s ``calibration_executor`` and the search (None: in process)."""
    if shards > 1 and skips_calibration:
        raise OptionError(
            f"--shards {shards} cuts calibration, which --load-stats / --load-table replace; drop one of them."
        )
    ray = ray or bool(ray_address)
    if not ray:
        return None
    if shards == 1 and budget is None:
        raise OptionError(
            "--ray runs the --shards tasks (N > 1) and the --accuracy-budget search's tasks on Ray; add one of "
            "them or drop --ray."
        )
    try:
        import ray as _ray  # noqa: F401 - only asks whether Ray is installed
    except ImportError:
        raise OptionError(
            "--ray: Ray is not installed; pip install 'zonnx[ray]', or drop --ray to run the shards in process "
            "(same statistics)."
        ) from None
    from zonnx.deploy.evaluate import RayExecutor

    return RayExecutor(ray_address or "", fallback="drop --ray / --ray-address to run the tasks in process")
