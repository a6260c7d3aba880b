"""Hold the last samples of a calibration reader out of calibration, for a per-layer report on unseen data.

Rule: the reader is passed through ``n`` samples late (a buffer of ``n`` feeds, so memory stays at ``n``
feeds whatever the set's size). When it ends after at least ``min_total`` samples, the last ``n`` are
never given to calibration and become ``held``; with fewer, the buffer is given to calibration after
all and nothing is held out (the report is then in-sample, and says so). ``describe()`` states which.
"""

from __future__ import annotations

__all__ = ["HoldOutReader", "MIN_TOTAL_PER_HELD"]

import collections
import logging
from typing import Any

logger = logging.getLogger(__name__)

#: Hold ``n`` samples out only when the set has at least this many per held sample (calibration keeps 7/8).
MIN_TOTAL_PER_HELD = 8


class HoldOutReader:
    """Delegates to a calibration reader, holding its last ``n`` feeds out when it has enough of them."""

    def __init__(self, reader: Any, n: int, min_total: int | None = None) -> None:
        self._reader, self._n = reader, max(0, n)
        self._min_total = MIN_TOTAL_PER_HELD * self._n if min_total is None else min_total
        self._buf: collections.deque[dict[str, Any]] = collections.deque()
        self._ended = False
        self.seen = 0
        self.held: list[dict[str, Any]] = []

    def get_next(self) -> Any:
        if self._n == 0:
            feed = self._reader.get_next()
            self.seen += bool(feed)
            return feed
        while not self._ended and len(self._buf) <= self._n:
            feed = self._reader.get_next()
            if not feed:
                self._ended = True
                if self.seen >= self._min_total:
                    self.held = list(self._buf)
                    self._buf.clear()
                    logger.info("per-layer report: the last %d of %d samples held out", self._n, self.seen)
                break
            self.seen += 1
            self._buf.append({k: v.copy() if hasattr(v, "copy") else v for k, v in feed.items()})
        return self._buf.popleft() if self._buf else None

    def rewind(self) -> None:
        """Start again from the first sample (the wrapped reader must rewind)."""
        self._reader.rewind()
        self._buf.clear()
        self._ended, self.seen, self.held = False, 0, []

    def describe(self, used: int) -> str:
        """Which samples a report of ``used`` samples ran on: held out, or in-sample and why."""
        in_sample_total = self.seen - len(self.held)
        if self.held:
            return (
                f"held out: the last {used} of {self.seen} samples, not used for calibration"
                if used == len(self.held)
                else f"held out: {used} of the last {len(self.held)} of {self.seen} samples"
            )
        if self._n == 0:
            return f"in-sample: {used} of the {in_sample_total} calibration samples (ReportHoldOut off)"
        return (
            f"in-sample: {used} of the {in_sample_total} calibration samples (holding {self._n} out needs "
            f"at least {self._min_total} samples)"
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)
