"""Render a pipeline report for people (rich table) and machines (dict): time, node counts, rewrites, misses."""

from __future__ import annotations

__all__ = ["render_pipeline_report", "pipeline_report_dict"]

from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from zonnx.inspection.render import PLAIN_BOX
from zonnx.passes.pipeline import PipelineReport


def _fmt_counter(c: Counter[str], limit: int = 4) -> str:
    items = [f"{k} x{v}" if v > 1 else k for k, v in c.most_common(limit)]
    more = len(c) - limit
    return ", ".join(items) + (f", +{more} more" if more > 0 else "")


def pipeline_report_dict(report: PipelineReport) -> dict[str, Any]:
    """A JSON-ready view of the report (stable keys)."""
    return {
        "rounds": report.rounds,
        "seconds": round(report.seconds, 4),
        "nodes_before": report.nodes_before,
        "nodes_after": report.nodes_after,
        "max_relative_error": report.max_error,
        "passes": [
            {
                "name": r.name,
                "seconds": round(r.seconds, 4),
                "nodes_before": r.nodes_before,
                "nodes_after": r.nodes_after,
                "removed": dict(r.removed),
                "added": dict(r.added),
                "changes": dict(r.changes.counts),
                "misses": r.changes.misses,
                "max_relative_error": r.max_error,
            }
            for r in report.records
        ],
        "outputs": [
            {"name": d.name, "max_abs": d.max_abs, "relative": d.relative, "cosine": d.cosine}
            for d in report.final_diffs or []
        ],
    }


def render_pipeline_report(report: PipelineReport, console: Console, *, show_misses: int = 5) -> None:
    """Print the per-pass table, then the misses (why rules did not fire), then the numeric check."""
    table = Table(
        title=f"passes ({report.rounds} round{'s' if report.rounds != 1 else ''}, {report.seconds:.2f} s)",
        box=PLAIN_BOX,
        title_justify="left",
    )
    for col, kw in [
        ("pass", {}),
        ("time ms", {"justify": "right"}),
        ("nodes", {"justify": "right"}),
        ("removed", {}),
        ("added", {}),
        ("changes", {}),
    ]:
        table.add_column(col, **kw)
    for r in report.records:
        table.add_row(
            r.name,
            f"{r.seconds * 1e3:.1f}",
            f"{r.nodes_before}->{r.nodes_after}",
            _fmt_counter(r.removed) or "-",
            _fmt_counter(r.added) or "-",
            _fmt_counter(r.changes.counts) or "-",
        )
    console.print(table)
    console.print(f"nodes: {report.nodes_before} -> {report.nodes_after}")
    misses = [(r.name, m) for r in report.records for m in r.changes.misses]
    if misses and show_misses:
        console.print(f"not rewritten ({len(misses)}; first {min(show_misses, len(misses))}):")
        for name, m in misses[:show_misses]:
            console.print(f"  {name}: {m}", markup=False)
    if report.final_diffs is not None:
        worst = max(report.final_diffs, key=lambda d: d.relative, default=None)
        if worst is not None:
            console.print(
                f"verify: max error {worst.max_abs:.3g} ({worst.relative:.3g} of output range) "
                f"on {worst.name!r}; cosine {min(d.cosine for d in report.final_diffs):.8f}",
                markup=False,
            )
