"""Print a retargeting report: the tensors whose grid changed most, then the one-line summary."""

from __future__ import annotations

__all__ = ["render_retarget"]

from typing import Any

from rich.table import Table

from zonnx.quantization.prequant.retarget import RetargetReport


def render_retarget(console: Any, report: RetargetReport, top: int = 10) -> None:
    """Table of the ``top`` snapped or calibrated tensors (largest step change first) and the summary."""
    rows = [c for c in report.changes if c.action != "kept"]
    rows.sort(key=lambda c: -(c.step_ratio or 0.0))
    if rows:
        table = Table(
            title=f"grids re-expressed for the target ({len(rows)} of {len(report.changes)} changed)"
        )
        for col in ("tensor", "role", "action", "source grid", "target grid", "step x", "weight SQNR dB"):
            table.add_column(col)
        for c in rows[:top]:
            table.add_row(
                c.tensor, c.role, c.action, c.source, c.target,
                f"{c.step_ratio:.3g}" if c.step_ratio is not None else "-",
                f"{c.weight_sqnr_db:.1f}" if c.weight_sqnr_db is not None else "-",
            )  # fmt: skip
        console.print(table)
    console.print(report.summary(), markup=False)
