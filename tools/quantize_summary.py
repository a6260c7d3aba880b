"""The summary `zonnx quantize` prints after a run: one row per fact about the written model."""

from __future__ import annotations

__all__ = ["summary_table"]

from pathlib import Path
from typing import Any

from rich.table import Table

from zonnx.inspection.render import PLAIN_BOX

_PLURAL = {"activation": "activations", "weight": "weights", "bias": "biases"}


def summary_table(result: Any, seconds: float, output: Path) -> Table:
    """The table `zonnx quantize` prints: output, scheme, counts, target rules, each recovery step, time."""
    cfg = result.config
    table = Table(title="quantization", box=PLAIN_BOX, title_justify="left")
    table.add_column("item")
    table.add_column("value")
    rows = [
        ("output", str(output)),
        ("format", getattr(cfg.quant_format, "name", str(cfg.quant_format))),
        ("calibration", getattr(cfg.calibrate_method, "name", str(cfg.calibrate_method))),
        (
            "types",
            f"activations {cfg.activation_type}, weights {cfg.weight_type}"
            + (", per channel" if cfg.per_channel else ""),
        ),
        ("placement", cfg.extra.quant_placement if not cfg.extra.target else f"target {cfg.extra.target}"),
        ("opset", str(result.opset)),
        ("quantized", ", ".join(f"{v} {_PLURAL.get(k, k)}" for k, v in sorted(result.counts.items()))),
        ("nodes left float", str(len(result.plan.skipped))),
        *_recovery_rows(result),
        ("time", f"{seconds:.2f} s"),
    ]
    if getattr(result, "target_prep", None) is not None:
        rows.append(
            (
                "target preparation",
                ", ".join(f"{k} x{v}" for k, v in result.target_prep.most_common()) or "no change needed",
            )
        )
    if result.refinement is not None:
        changes = result.refinement.counts
        rows.append(
            ("target rules", ", ".join(f"{k} x{v}" for k, v in changes.most_common()) or "no change needed")
        )
    for name, record in result.recovery.items():
        if name == "smooth_quant":
            continue  # a row of its own (_recovery_rows)
        if name == "fast_finetune":
            before = sum(o.loss_before for o in record.layers)
            after = sum(o.loss_after if o.kept else o.loss_before for o in record.layers)
            rows.append(
                (
                    "fast finetune",
                    f"{record.algorithm}: {record.tuned} layers on {record.samples} samples, layer MSE "
                    f"{before:.4g} -> {after:.4g}, {record.seconds:.1f} s",
                )
            )
        else:
            rows.append(
                (name.replace("_", " "), record.summary() if hasattr(record, "summary") else str(record))
            )
    for key, value in rows:
        table.add_row(key, value)
    return table


def _recovery_rows(result: Any) -> list[tuple[str, str]]:
    sq = result.recovery.get("smooth_quant")
    if not sq:
        return []
    return [
        (
            "smooth quant",
            f"alpha {sq['alpha']:g}: {sq['smoothed']} activations ({sq['folded']} folded, "
            f"{sq['inserted']} Mul inserted)",
        )
    ]
