"""Shared rich consoles: tables on a terminal, plain text when piped."""

from __future__ import annotations

__all__ = ["console", "err_console"]

from rich.console import Console

#: Piped output is read by tools and logs: no terminal width to honour, so tables are not folded.
_PIPED_WIDTH = 200

console = Console(highlight=False)
if not console.is_terminal:
    console = Console(highlight=False, width=_PIPED_WIDTH)
err_console = Console(stderr=True, highlight=False)
if not err_console.is_terminal:
    err_console = Console(stderr=True, highlight=False, width=_PIPED_WIDTH)
