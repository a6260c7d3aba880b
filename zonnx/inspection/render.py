"""Print a ModelSummary: rich tables on a terminal, plain ASCII tables when piped, or JSON."""

from __future__ import annotations

__all__ = ["PLAIN_BOX", "render", "render_summary", "to_json", "human"]

import logging

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from zonnx.inspection.summary import ModelSummary

logger = logging.getLogger(__name__)

#: Header rule only, in ASCII: what tables look like when stdout is not a terminal.
PLAIN_BOX = box.Box("    \n    \n -  \n    \n    \n -  \n    \n    \n", ascii=True)
#: Rows of the unknown-shape table shown before "... and N more".
MAX_UNKNOWN_ROWS = 20
#: Widest a table gets when piped (wider cells fold).
_PIPE_MAX_WIDTH = 400


def human(n: float, unit: str = "", base: int = 1000) -> str:
    """Short form of a count: 1234567 -> '1.23 M'; with base 1024 and unit 'B' -> '1.18 MiB'."""
    prefixes = ["", "K", "M", "G", "T", "P"]
    value, i = float(n), 0
    while abs(value) >= base and i < len(prefixes) - 1:
        value /= base
        i += 1
    prefix = prefixes[i] + ("i" if base == 1024 and i else "")
    text = f"{int(value)}" if i == 0 else f"{value:.3g}"
    return f"{text} {prefix}{unit}".rstrip()


def to_json(summary: ModelSummary) -> str:
    """Stable JSON of the summary; the keys are documented on ModelSummary."""
    return summary.to_json()


def _table(
    console: Console, title: str, *columns: str, right: tuple[str, ...] = (), header: bool = True
) -> Table:
    plain = not console.is_terminal
    table = Table(
        title=title,
        min_width=len(title),
        show_header=header,
        title_justify="left",
        box=PLAIN_BOX if plain else box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        header_style="" if plain else "bold",
        title_style="" if plain else "bold cyan",
    )
    for col in columns:
        table.add_column(col, justify="right" if col in right else "left", overflow="fold")
    return table


def _t(value: object) -> Text:
    """Cell text that rich never parses as markup (tensor names may contain brackets)."""
    return Text(str(value))


def _shape(shape: list[int | str] | None) -> str:
    return "no shape" if shape is None else "[" + ", ".join(map(str, shape)) + "]"


def _header(summary: ModelSummary, console: Console) -> None:
    opsets = ", ".join(f"{d} {v}" for d, v in summary.opsets.items())
    producer = " ".join(p for p in (summary.producer_name, summary.producer_version) if p) or "unknown"
    lines = [
        f"model: {summary.path or '(in memory)'}",
        f"IR version {summary.ir_version}; opsets: {opsets}; producer: {producer}",
        f"graph {summary.graph_name!r}: {summary.nodes} nodes"
        + (f" ({summary.subgraph_nodes} in subgraphs)" if summary.subgraph_nodes else "")
        + f"; metadata keys: {', '.join(summary.metadata_keys) or 'none'}",
        f"parameters: {summary.parameters.count:,} ({human(summary.parameters.count)}) in "
        f"{summary.parameters.tensors} tensors, {human(summary.parameters.bytes, 'B', 1024)}",
        "MACs: " + _macs_total(summary),
        "quantization: " + _quant_line(summary),
    ]
    if console.is_terminal:
        console.rule(Text(f"zonnx inspect: {summary.graph_name or summary.path}"), style="cyan")
    for line in lines:
        console.print(_t(line), soft_wrap=True)
    console.print()


def _macs_total(summary: ModelSummary) -> str:
    macs = summary.macs
    if not macs.by_op:
        return "0 (no Conv, Gemm or MatMul-like ops)"
    known = f"{macs.total:,} ({human(macs.total)})"
    if macs.complete:
        return known
    if macs.total == 0:
        return f"unknown ({len(macs.unknown)} node(s) need shapes; see notes)"
    return f"at least {known}; {len(macs.unknown)} node(s) unknown (see notes)"


def _quant_line(summary: ModelSummary) -> str:
    q = summary.quantization
    if q.format == "none":
        return "none"
    parts = f" ({' + '.join(q.formats)})" if q.format == "mixed" else ""
    return f"{q.format}{parts}, {', '.join(q.dtypes) or 'dtypes unknown'}"


def _io_table(summary: ModelSummary, console: Console) -> Table:
    table = _table(console, "Inputs and outputs", "", "name", "dtype", "shape")
    for kind, infos in (("input", summary.inputs), ("output", summary.outputs)):
        for info in infos:
            table.add_row(kind, _t(info.name), info.dtype, _t(_shape(info.shape)))
    return table


def _ops_table(summary: ModelSummary, console: Console) -> Table:
    table = _table(console, "Ops (by count)", "op", "count", right=("count",))
    for op, n in summary.op_histogram.items():
        table.add_row(_t(op), str(n))
    return table


def _macs_table(summary: ModelSummary, console: Console) -> Table | None:
    macs = summary.macs
    if not macs.by_op:
        return None
    table = _table(
        console, "MACs by op type", "op", "nodes", "MACs", "", "unknown", right=("nodes", "MACs", "unknown")
    )
    for e in macs.by_op:
        table.add_row(e.op_type, str(e.nodes), f"{e.macs:,}", human(e.macs), str(e.unknown or ""))
    table.add_row("total", str(sum(e.nodes for e in macs.by_op)), f"{macs.total:,}", human(macs.total),
                  str(len(macs.unknown) or ""))  # fmt: skip
    return table


def _params_table(summary: ModelSummary, console: Console) -> Table | None:
    p = summary.parameters
    if not p.by_dtype:
        return None
    table = _table(
        console,
        "Parameters by dtype",
        "dtype",
        "tensors",
        "elements",
        "bytes",
        right=("tensors", "elements", "bytes"),
    )
    for e in p.by_dtype:
        table.add_row(e.dtype, str(e.tensors), f"{e.count:,}", human(e.bytes, "B", 1024))
    table.add_row("total", str(p.tensors), f"{p.count:,}", human(p.bytes, "B", 1024))
    return table


def _quant_table(summary: ModelSummary, console: Console) -> Table | None:
    q = summary.quantization
    if q.format == "none":
        return None
    table = _table(console, "Quantization", "", "", header=False)
    rows = [
        ("format", q.format + (f" ({' + '.join(q.formats)})" if q.format == "mixed" else "")),
        ("dtypes", ", ".join(q.dtypes) or "unknown"),
        ("weights", ", ".join(q.weight_dtypes) or "-"),
        ("activations", ", ".join(q.activation_dtypes) or "-"),
        (
            "QuantizeLinear / DequantizeLinear",
            f"{q.quantize_nodes} / {q.dequantize_nodes} ({q.qdq_pairs} pairs)",
        ),
        ("QOperator nodes", str(q.qoperator_nodes)),
        ("FixNeuron/custom nodes", str(q.custom_nodes)),
        (
            "scales",
            f"{q.per_tensor} per-tensor, {q.per_channel} per-channel, {q.per_block} per-block"
            + (f", {q.granularity_unknown} unknown" if q.granularity_unknown else ""),
        ),
        ("ops", ", ".join(f"{op} x{n}" for op, n in q.ops.items())),
    ]
    for key, value in rows:
        table.add_row(key, _t(value))
    return table


def _unknown_table(summary: ModelSummary, console: Console) -> Table | None:
    unknown = summary.unknown_shapes
    if not unknown:
        return None
    title = f"Values without a shape after onnx shape inference ({len(unknown)})"
    table = _table(console, title, "value", "op", "node")
    for u in unknown[:MAX_UNKNOWN_ROWS]:
        table.add_row(_t(u.name), _t(u.op_type), _t(u.node))
    if len(unknown) > MAX_UNKNOWN_ROWS:
        table.add_row(f"... and {len(unknown) - MAX_UNKNOWN_ROWS} more (see --json)", "", "")
    return table


def _print_table(console: Console, table: Table) -> None:
    """Print a table; piped output is not folded to 80 columns but gets the width the table needs."""
    if not console.is_terminal:
        need = console.measure(table, options=console.options.update_width(_PIPE_MAX_WIDTH)).maximum
        if need > console.width:
            console = Console(file=console.file, width=need, color_system=None, highlight=False)
    console.print(table)
    console.print()


def render(summary: ModelSummary, console: Console | None = None) -> None:
    """Print ``summary`` as a header and tables; plain ASCII when ``console`` is not a terminal."""
    console = console or Console(highlight=False)
    _header(summary, console)
    builders = (_io_table, _ops_table, _macs_table, _params_table, _quant_table, _unknown_table)
    for build in builders:
        table = build(summary, console)
        if table is not None:
            _print_table(console, table)
    if summary.notes:
        console.print(_t("Notes:"))
        for note in summary.notes:
            console.print(_t(f"- {note}"), soft_wrap=True)


#: The name ``zonnx.build`` uses.
render_summary = render
