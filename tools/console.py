"""Shared rich consoles: tables on a terminal, plain text when piped."""

from __future__ import annotations

__all__ = ["console", "err_console"]

from rich.console import Console

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)
