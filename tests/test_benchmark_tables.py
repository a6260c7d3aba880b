"""Every ratio published in docs/benchmarks.md follows from the numbers beside it.

A table with a ratio column must be the runner's own markdown (``python -m bench.runner X --markdown``):
columns ``ours`` ("VALUE UNIT"), ``peer`` ("NAME: VALUE UNIT") and ``ratio (ours/peer)`` ("RATIOx").
The runner prints four significant digits, so the ratio must equal ours / peer within that rounding.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
RATIO = "ratio (ours/peer)"
#: Each of three numbers printed to 4 significant digits is off by at most 5e-4 of itself.
REL_TOL = 1.6e-3


def _tables(text: str) -> list[tuple[int, list[str], list[list[str]]]]:
    """(line number, header cells, body rows) of every markdown table."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if (
            lines[i].startswith("|")
            and i + 1 < len(lines)
            and re.match(r"^\|(\s*:?-+:?\s*\|)+$", lines[i + 1])
        ):
            start, header, rows = i + 1, _cells(lines[i]), []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            out.append((start, header, rows))
        else:
            i += 1
    return out


def _cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _number(cell: str) -> float | None:
    """The number a runner cell starts with ("12.67 images/s", "1.088x", "12,345 s"); None for "-"."""
    match = re.match(r"^-?[\d,]*\.?\d+(e[-+]?\d+)?|^-?inf|^nan", cell.replace(",", ""))
    return float(match.group(0)) if match else None


def _is_ratio(header: str) -> bool:
    """A ratio column: the word "ratio" in its header, or a header like "/ float sweep"."""
    return bool(re.search(r"\bratio\b", header.lower())) or header.startswith("/")


TABLES = [t for t in _tables(DOC.read_text()) if any(_is_ratio(h) for h in t[1])]


def test_the_doc_has_ratio_tables() -> None:
    assert len(TABLES) >= 4


@pytest.mark.parametrize(("line", "header", "rows"), TABLES, ids=[f"line{t[0]}" for t in TABLES])
def test_ratio_column_follows_from_value_columns(line: int, header: list[str], rows: list[list[str]]) -> None:
    assert {"ours", "peer", RATIO} <= set(header), (
        f"docs/benchmarks.md:{line}: a table with a ratio column must be the runner's markdown "
        f"(columns ours, peer, {RATIO!r}); got {header}"
    )
    ours_i, peer_i, ratio_i = header.index("ours"), header.index("peer"), header.index(RATIO)
    checked = unpaired = 0
    for row in rows:
        if len(row) != len(header) or row[1] == "ERROR":
            continue
        ratio = _number(row[ratio_i])
        if row[peer_i] == "-":
            assert row[ratio_i] == "-", (line, row)
            unpaired += 1
            continue
        ours, peer = _number(row[ours_i]), _number(row[peer_i].rsplit(": ", 1)[-1])
        assert ours is not None and peer is not None and ratio is not None, (line, row)
        if peer == 0 or not all(map(math.isfinite, (ours, peer, ratio))):
            continue
        assert math.isclose(ours / peer, ratio, rel_tol=REL_TOL), (
            f"docs/benchmarks.md:{line}: {row[1]!r}: {ours} / {peer} = {ours / peer:.4g}, table says {ratio}"
        )
        checked += 1
    # every row was read: either checked against its peer, or without a peer and without a ratio
    assert checked + unpaired == len(rows) and rows, (
        f"docs/benchmarks.md:{line}: rows not in the runner's format"
    )


def test_most_ratio_tables_have_peers() -> None:
    """Tables with no peer at all (estimates, counts) are the exception, not a way to publish unchecked ratios."""
    with_peer = [t for t in TABLES if any(len(r) == len(t[1]) and r[t[1].index("peer")] != "-" for r in t[2])]
    assert len(with_peer) >= len(TABLES) - 3 and len(with_peer) >= 4
