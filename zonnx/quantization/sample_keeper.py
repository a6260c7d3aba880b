"""Keep a bounded, spread-out set of calibration feeds while calibration reads them (report, recovery)."""

from __future__ import annotations

__all__ = ["SampleKeeper"]

import random
from typing import Any


class SampleKeeper:
    """Delegates to a calibration reader and keeps ``n`` of its feeds spread over the whole set.

    Reservoir sampling with a fixed seed: every feed has the same chance to be kept, whatever the
    number of feeds (unknown in advance), and memory stays at ``n`` feeds.
    """

    def __init__(self, reader: Any, n: int = 4, seed: int = 0) -> None:
        self._reader, self._n = reader, n
        self._rng = random.Random(seed)
        self._seen = 0
        self.kept: list[dict[str, Any]] = []

    def get_next(self) -> Any:
        feed = self._reader.get_next()
        if feed and self._n:
            slot = self._seen if self._seen < self._n else self._rng.randrange(self._seen + 1)
            self._seen += 1
            if slot < self._n:
                copy = {k: v.copy() if hasattr(v, "copy") else v for k, v in feed.items()}
                if slot < len(self.kept):
                    self.kept[slot] = copy
                else:
                    self.kept.append(copy)
        return feed

    def fill(self) -> list[dict[str, Any]]:
        """Read until ``n`` feeds are kept or the reader ends; the kept feeds."""
        while len(self.kept) < self._n and self.get_next():
            pass
        return self.kept

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)
