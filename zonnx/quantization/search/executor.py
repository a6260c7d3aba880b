"""The one interface candidate evaluations go through, so they can run elsewhere than in this process.

An executor maps a function over items and yields results in item order. ``LocalExecutor`` runs them
here, one after the other (ORT already uses every core for one model); a distributed executor (Ray)
implements the same ``map``.
"""

from __future__ import annotations

__all__ = ["Executor", "LocalExecutor"]

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    """Runs ``fn`` on each item; results come back in the order of ``items``."""

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]: ...


class LocalExecutor:
    """In-process, sequential evaluation (the default)."""

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        for item in items:
            yield fn(item)
