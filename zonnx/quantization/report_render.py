"""The per-layer report's numbers (running sums -> TensorStats -> LayerReport), stable JSON and rich tables."""

from __future__ import annotations

__all__ = ["REPORT_VERSION", "TensorStats", "LayerReport", "MetricSums", "render_report", "fmt_db"]

import dataclasses
import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from zonnx.errors import ModelSaveError
from zonnx.inspection.render import PLAIN_BOX
from zonnx.ir.io import write_bytes_atomic

logger = logging.getLogger(__name__)

#: Version of the JSON layout written by ``LayerReport.to_json``.
REPORT_VERSION = 1
#: Rows of the unmatched/skipped notes shown before "... and N more".
MAX_NOTES = 10
_TEXT_FIELDS = ("tensor", "quant_tensor", "node", "op_type", "via")
_PIPE_MAX_WIDTH = 400


@dataclasses.dataclass
class TensorStats:
    """How one float tensor compares with its quantized counterpart over every sample.

    ``tensor`` is the float model's name, ``node``/``op_type`` its producer there ('' and 'input' for a
    graph input); ``quant_tensor`` is the quantized model's value compared and ``via`` how it was found
    (the dequantizing op, '<op> codes', or 'output'); ``shape`` is the last sample's.
    """

    tensor: str
    quant_tensor: str
    node: str
    op_type: str
    via: str
    shape: list[int] = dataclasses.field(default_factory=list)
    elements: int = 0
    cosine: float = 1.0
    euclid: float = 1.0
    sqnr_db: float = math.inf
    max_abs_error: float = 0.0
    mean_abs_error: float = 0.0
    nonfinite: int = 0


def _encode(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _decode(fields: Mapping[str, Any]) -> TensorStats:
    return TensorStats(
        **{k: float(v) if isinstance(v, str) and k not in _TEXT_FIELDS else v for k, v in fields.items()}
    )


@dataclasses.dataclass
class LayerReport:
    """Float vs quantized, per tensor: ``layers`` sorted worst first (lowest SQNR, then cosine), the
    model ``outputs`` in order, then one reason per dequantizing node left ``unmatched`` and per tensor
    ``skipped`` (not float, or shapes that differ)."""

    samples: int
    layers: list[TensorStats]
    outputs: list[TensorStats]
    unmatched: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    float_model: str | None = None
    quant_model: str | None = None
    data: str = ""  # which samples: held out or in-sample, how many of how many (set by quantize_static)

    @property
    def worst(self) -> TensorStats | None:
        return self.layers[0] if self.layers else None

    def get(self, tensor: str) -> TensorStats:
        """The layer entry of float tensor ``tensor``; KeyError names the tensor when it is not matched."""
        for stats in self.layers:
            if stats.tensor == tensor:
                return stats
        raise KeyError(f"tensor {tensor!r} is not in the report")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict with stable keys; inf and nan are written as the strings 'inf', '-inf', 'nan'."""

        def rows(items: list[TensorStats]) -> list[dict[str, Any]]:
            return [{k: _encode(v) for k, v in dataclasses.asdict(s).items()} for s in items]

        return {
            "version": REPORT_VERSION,
            "float_model": self.float_model,
            "quant_model": self.quant_model,
            "samples": self.samples,
            "data": self.data,
            "matched": len(self.layers),
            "layers": rows(self.layers),
            "outputs": rows(self.outputs),
            "unmatched": list(self.unmatched),
            "skipped": list(self.skipped),
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=1)

    @classmethod
    def from_json(cls, text: str) -> LayerReport:
        data = json.loads(text)
        return cls(
            data["samples"],
            [_decode(r) for r in data["layers"]],
            [_decode(r) for r in data["outputs"]],
            data["unmatched"],
            data["skipped"],
            data["float_model"],
            data["quant_model"],
            data.get("data", ""),
        )

    def render(self, console: Console | None = None, top: int = 15) -> None:
        """Print the ``top`` worst layers and the outputs (rich tables; plain ASCII when piped)."""
        render_report(self, console, top=top)

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the JSON atomically (temporary file beside ``path``, then rename)."""
        out = Path(path)
        folder = out.parent if str(out.parent) else Path(".")
        if not folder.is_dir():
            raise ModelSaveError(f"{out}: folder {folder} does not exist; create it first.")
        try:
            return write_bytes_atomic(out, self.to_json().encode())
        except OSError as e:
            raise ModelSaveError(
                f"{out}: cannot write the report ({e.strerror}); nothing was written."
            ) from None


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """float64 dot product by einsum, not BLAS: OpenBLAS's threaded ddot ran 70x slower (16 ms vs
    0.2 ms for 800k elements) on a loaded 2-core host, which made the report most of quantize_static."""
    return float(np.einsum("i,i->", a, b))


@dataclasses.dataclass
class MetricSums:
    """Running float64 sums of one float/quantized tensor pair; nothing else is kept between samples."""

    n: int = 0
    xx: float = 0.0
    qq: float = 0.0
    xq: float = 0.0
    ee: float = 0.0
    abs_e: float = 0.0
    max_e: float = 0.0
    nonfinite: int = 0

    def update(self, x: np.ndarray, q: np.ndarray) -> None:
        xs, qs = np.asarray(x).ravel(), np.asarray(q).ravel()
        # no copy when already float64 (dequantized codes); x64/q64 are only read below
        x64, q64 = np.asarray(xs, dtype=np.float64), np.asarray(qs, dtype=np.float64)
        if not (np.isfinite(xs).all() and np.isfinite(qs).all()):  # checked on the input type: cheaper
            bad = ~(np.isfinite(x64) & np.isfinite(q64))
            self.nonfinite += int(bad.sum())
            x64, q64 = np.where(bad, 0.0, x64), np.where(bad, 0.0, q64)
        e = np.subtract(x64, q64)
        self.n += x64.size
        self.xx += _dot(x64, x64)
        self.qq += _dot(q64, q64)
        self.xq += _dot(x64, q64)
        self.ee += _dot(e, e)
        abs_e = np.abs(e, out=e)  # e is not needed any more: |e| in place, one buffer less
        self.abs_e += float(abs_e.sum())
        self.max_e = max(self.max_e, float(abs_e.max()) if abs_e.size else 0.0)

    def fill(self, stats: TensorStats) -> TensorStats:
        """Write the metrics (see zonnx.quantization.report) into ``stats`` and return it."""
        norm = math.sqrt(self.xx * self.qq)
        stats.cosine = (
            1.0 if self.xx == self.qq == 0 else (min(1.0, max(-1.0, self.xq / norm)) if norm > 0 else 0.0)
        )
        mid = math.sqrt(max(self.xx + 2 * self.xq + self.qq, 0.0)) / 2
        stats.euclid = 1.0 if self.ee == 0 else (1 - math.sqrt(self.ee) / mid if mid > 0 else -math.inf)
        stats.sqnr_db = (
            math.inf if self.ee == 0 else (10 * math.log10(self.xx / self.ee) if self.xx > 0 else -math.inf)
        )
        stats.elements, stats.nonfinite = self.n, self.nonfinite
        stats.max_abs_error, stats.mean_abs_error = self.max_e, self.abs_e / self.n if self.n else 0.0
        return stats


def fmt_db(value: float) -> str:
    """SQNR as text: '42.10', 'inf' or '-inf'."""
    return f"{value:.2f}" if math.isfinite(value) else str(value)


def _table(console: Console, title: str, *columns: str) -> Table:
    plain = not console.is_terminal
    table = Table(
        title=title,
        title_justify="left",
        box=PLAIN_BOX if plain else box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        header_style="" if plain else "bold",
        title_style="" if plain else "bold cyan",
    )
    for col in columns:
        table.add_column(
            col, justify="left" if col in ("tensor", "node (op)", "via") else "right", overflow="fold"
        )
    return table


def _row(table: Table, rank: str, s: TensorStats) -> None:
    node = f"{s.node} ({s.op_type})" if s.node else s.op_type
    table.add_row(
        rank,
        Text(s.tensor),
        Text(node),
        Text(s.via),
        f"{s.cosine:.6f}",
        fmt_db(s.sqnr_db),
        f"{s.max_abs_error:.4g}",
        f"{s.mean_abs_error:.4g}",
    )


def _print(console: Console, table: Table) -> None:
    """Print a table; piped output gets the width the table needs instead of folding at 80 columns."""
    if not console.is_terminal:
        need = console.measure(table, options=console.options.update_width(_PIPE_MAX_WIDTH)).maximum
        if need > console.width:
            console = Console(file=console.file, width=need, color_system=None, highlight=False)
    console.print(table)


def _notes(console: Console, title: str, notes: list[str]) -> None:
    if not notes:
        return
    console.print(Text(f"{title} ({len(notes)}):"))
    for note in notes[:MAX_NOTES]:
        console.print(Text(f"- {note}"), soft_wrap=True)
    if len(notes) > MAX_NOTES:
        console.print(Text(f"- ... and {len(notes) - MAX_NOTES} more (see the JSON report)"))


def render_report(report: LayerReport, console: Console | None = None, *, top: int = 15) -> None:
    """Print a one-line summary, the ``top`` worst layers, the model outputs, then unmatched/skipped notes."""
    console = console or Console(highlight=False)
    columns = ("#", "tensor", "node (op)", "via", "cosine", "SQNR dB", "max abs err", "mean abs err")
    worst = report.worst
    summary = (
        f"per-layer accuracy, float vs quantized: {len(report.layers)} tensors on {report.samples} "
        f"sample(s); worst {worst.tensor!r} at {fmt_db(worst.sqnr_db)} dB" if worst else
        f"per-layer accuracy, float vs quantized: no quantized tensor matched on {report.samples} sample(s)"
    )  # fmt: skip
    console.print(Text(summary + (f" ({report.data})" if report.data else "")), soft_wrap=True)
    if report.layers and top > 0:
        shown = report.layers[:top]
        table = _table(
            console, f"Worst {len(shown)} of {len(report.layers)} layers (lowest SQNR first)", *columns
        )
        for i, stats in enumerate(shown, 1):
            _row(table, str(i), stats)
        _print(console, table)
    if report.outputs:
        table = _table(console, "Model outputs", *columns)
        for stats in report.outputs:
            _row(table, "", stats)
        _print(console, table)
    _notes(console, "Dequantizing nodes not matched", report.unmatched)
    _notes(console, "Tensors skipped", report.skipped)
