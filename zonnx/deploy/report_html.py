"""report.html: one self-contained page (plotly.js inline, no network) with the build's results and charts.

Sections: summary table; accuracy of the float, fake-quantized (int8) and NPU models on the evaluation
set; per-layer SQNR and cosine of the int8 model against float (the layer report of ``quantize_static``,
worst layers in red); the worst layers' calibration histograms with the chosen clipping range
(``histograms``); the partition (MACs on the NPU vs the CPU, every CPU node with its reason);
estimated cycles and DDR bytes per NPU layer (``zonnx.backend.profile``'s cost model); the
mixed-precision table when an accuracy search ran; the config that produced the build. Missing parts
(a stage that did not run or failed) are said in their section, and a failed stage's error leads the page.
"""

from __future__ import annotations

__all__ = ["ReportData", "write_report", "read_json", "WORST_LAYERS"]

import dataclasses
import html
import json
import logging
import math
from pathlib import Path
from typing import Any

from zonnx.ir.io import write_bytes_atomic

logger = logging.getLogger(__name__)

#: Layers highlighted (and listed) as the worst by SQNR.
WORST_LAYERS = 5


@dataclasses.dataclass
class ReportData:
    """Everything the page shows; every part is optional but the title."""

    title: str
    summary: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    accuracy: dict[str, Any] | None = None
    layers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    histograms: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    partition: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None
    search: list[dict[str, Any]] | None = None
    config: str = ""
    error: str = ""


def _number(value: Any) -> float:
    if isinstance(value, str):
        return math.inf if value == "inf" else -math.inf if value == "-inf" else math.nan
    return float(value)


def _table(rows: list[list[Any]], header: list[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure_html(fig: Any, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False})


def _accuracy_section(data: ReportData, go: Any) -> str:
    if not data.accuracy:
        return "<p>No evaluation ran.</p>"
    scores = data.accuracy["scores"]
    fig = go.Figure(go.Bar(x=list(scores), y=list(scores.values()), text=[f"{v:.4f}" for v in scores.values()],
                           marker_color=["#4c78a8", "#f58518", "#54a24b"][: len(scores)]))  # fmt: skip
    fig.update_layout(title=f"{data.accuracy['metric']} on {data.accuracy['samples']} samples", height=320)
    return _figure_html(fig, "accuracy-chart")


def _layers_section(data: ReportData, go: Any) -> str:
    if not data.layers:
        return "<p>No per-layer report (the quantize stage did not run or ReportSamples is 0).</p>"
    names = [r["tensor"] for r in data.layers]
    sqnr = [min(_number(r["sqnr_db"]), 100.0) for r in data.layers]
    cos = [_number(r["cosine"]) for r in data.layers]
    worst = set(sorted(range(len(sqnr)), key=lambda i: sqnr[i])[:WORST_LAYERS])
    colors = ["#e45756" if i in worst else "#4c78a8" for i in range(len(sqnr))]
    fig = go.Figure(go.Bar(x=names, y=sqnr, marker_color=colors, name="SQNR dB"))
    fig.add_trace(go.Scatter(x=names, y=cos, yaxis="y2", mode="lines+markers", name="cosine"))
    fig.update_layout(title="int8 vs float per layer (worst in red; SQNR capped at 100 dB)", height=420,
                      yaxis={"title": "SQNR dB"}, yaxis2={"title": "cosine", "overlaying": "y", "side": "right"},
                      xaxis={"showticklabels": len(names) <= 60})  # fmt: skip
    rows = [
        [names[i], data.layers[i]["op_type"], f"{sqnr[i]:.2f}", f"{cos[i]:.5f}"]
        for i in sorted(worst, key=lambda i: sqnr[i])
    ]
    return (
        _figure_html(fig, "layers-chart")
        + "<h3>Worst layers</h3>"
        + _table(rows, ["tensor", "op", "SQNR dB", "cosine"])
    )


def _histograms_section(data: ReportData, go: Any) -> str:
    """One panel per worst layer: calibration histogram (log counts) and the chosen clipping range."""
    if not data.histograms:
        return "<p>No activation histograms (the quantize stage did not run or kept the model as it was).</p>"
    from plotly.subplots import make_subplots

    hs = data.histograms
    titles = [f"{h['tensor']} ({h['op_type']}, {h['sqnr_db']:.1f} dB)" for h in hs]
    fig = make_subplots(rows=len(hs), cols=1, subplot_titles=titles, vertical_spacing=0.3 / len(hs))
    for i, h in enumerate(hs, start=1):
        lo, hi = h["clip"]
        inside = ["#4c78a8" if lo <= x and x + h["width"] <= hi else "#e45756" for x in h["left"]]
        fig.add_trace(go.Bar(x=[x + h["width"] / 2 for x in h["left"]], y=h["counts"], width=h["width"],
                             marker_color=inside, showlegend=False, name=h["tensor"]), row=i, col=1)  # fmt: skip
        for edge, label in ((lo, "clip min"), (hi, "clip max")):
            fig.add_vline(x=edge, line={"color": "#e45756", "dash": "dash"}, row=i, col=1,
                          annotation_text=f"{label} {edge:.4g}", annotation_font_size=10)  # fmt: skip
        fig.update_yaxes(type="log", title_text="count", row=i, col=1)
    fig.update_layout(height=260 * len(hs), bargap=0,
                      title="dashed: clipping range of the chosen scale; red: values clipped")  # fmt: skip
    rows = [[h["tensor"], f"{h['data'][0]:.4g} .. {h['data'][1]:.4g}", f"{h['clip'][0]:.4g} .. {h['clip'][1]:.4g}"]
            for h in hs]  # fmt: skip
    return _figure_html(fig, "histograms-chart") + _table(
        rows, ["tensor", "calibration range", "clipping range"]
    )


def _partition_section(data: ReportData, go: Any) -> str:
    part = data.partition
    if not part:
        return "<p>The model was not compiled.</p>"
    from plotly.subplots import make_subplots

    s = part["summary"]
    rules = s.get("cpu_by_rule", {})
    fig = make_subplots(rows=1, cols=2, specs=[[{"type": "domain"}, {"type": "xy"}]],
                        subplot_titles=["MACs", "CPU nodes by reason"])  # fmt: skip
    fig.add_trace(go.Pie(labels=["NPU", "CPU"], values=[s["npu_macs"], s["total_macs"] - s["npu_macs"]],
                         marker={"colors": ["#54a24b", "#bab0ac"]}, sort=False), row=1, col=1)  # fmt: skip
    fig.add_trace(
        go.Bar(x=list(rules), y=list(rules.values()), marker_color="#bab0ac", showlegend=False), row=1, col=2
    )
    fig.update_layout(height=340, title=(
        f"NPU: {100 * s['mac_share']:.1f}% of known MACs, {s['npu_ops']} of {s['total_ops']} ops "
        f"in {s['subgraphs']} subgraph(s)"))  # fmt: skip
    rows = [[c["node"], c["rule"], c["reason"]] for c in part["cpu_nodes"]]
    cpu = (
        f"<details><summary>{len(rows)} CPU node(s) with their reason</summary>"
        + _table(rows, ["CPU node", "rule", "reason"]) + "</details>"
        if rows else "<p>Every node runs on the NPU.</p>"
    )  # fmt: skip
    return _figure_html(fig, "partition-chart") + cpu


def _profile_section(data: ReportData, go: Any) -> str:
    prof = data.profile
    npu = [r for r in (prof or {}).get("layers", []) if r.get("device") == "npu"]
    if not npu:
        return "<p>No NPU layer to estimate.</p>"
    names = [r["name"] for r in npu]
    fig = go.Figure(go.Bar(x=names, y=[r["cycles"] for r in npu], name="cycles"))
    fig.add_trace(go.Bar(x=names, y=[r.get("ddr_read", 0) + r.get("ddr_write", 0) for r in npu],
                         name="DDR bytes", yaxis="y2", opacity=0.6))  # fmt: skip
    t = prof["totals"]
    fig.update_layout(title=f"estimated {t['cycles']} cycles = {t['ms']:.4f} ms on {prof['target']}", height=380,
                      barmode="group", yaxis={"title": "cycles"},
                      yaxis2={"title": "DDR bytes", "overlaying": "y", "side": "right"})  # fmt: skip
    return _figure_html(fig, "profile-chart")


def _search_section(data: ReportData) -> str:
    if not data.search:
        return ""
    keys = list(data.search[0])
    return "<h2>Mixed precision search</h2>" + _table([[r[k] for k in keys] for r in data.search], keys)


_STYLE = """body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:90%}.error{color:#b00;font-weight:bold}
pre{background:#f6f6f6;padding:1em;overflow:auto}"""


def write_report(path: Path, data: ReportData) -> Path:
    """Write the page to ``path`` (atomically) and return it."""
    import plotly.graph_objects as go
    from plotly.offline import get_plotlyjs

    parts = [f"<h1>{html.escape(data.title)}</h1>"]
    if data.error:
        parts.append(f"<p class='error'>{html.escape(data.error)}</p>")
    parts += [
        "<h2>Summary</h2>", _table([list(r) for r in data.summary], ["", ""]),
        "<h2>Accuracy: float, int8, NPU</h2>", _accuracy_section(data, go),
        "<h2>Per-layer accuracy of the int8 model</h2>", _layers_section(data, go),
        "<h2>Activation histograms of the worst layers</h2>", _histograms_section(data, go),
        "<h2>Partition</h2>", _partition_section(data, go),
        "<h2>Estimated NPU cost per layer</h2>", _profile_section(data, go),
        _search_section(data),
        "<h2>Config</h2>", f"<pre>{html.escape(data.config or '(command-line options)')}</pre>",
    ]  # fmt: skip
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(data.title)}</title><style>{_STYLE}</style>"
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
        + "\n".join(parts)
        + "</body></html>"
    )
    write_bytes_atomic(path, page.encode())
    logger.info("wrote %s (%d KB)", path, len(page) // 1024)
    return path


def read_json(path: Path) -> Any:
    """A JSON file's content, or None when it does not exist."""
    return json.loads(path.read_text()) if path.is_file() else None
