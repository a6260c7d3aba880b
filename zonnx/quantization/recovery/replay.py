"""Read a calibration reader twice (a statistics pass before calibration) with bounded memory.

Rule: a reader with ``rewind()`` is streamed once and rewound (nothing kept); a list or tuple of feeds is
iterated twice; any other reader (ORT's ``CalibrationDataReader`` has only ``get_next()``) is read into
a buffer until it ends or holds ``max_bytes`` of arrays (default 256 MiB); the first pass sees the
buffered feeds, and the second pass replays them before the rest of the reader, so calibration still
sees every sample once.
"""

from __future__ import annotations

__all__ = ["REPLAY_BYTES", "TwoPass"]

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

#: Most bytes of feed arrays kept for readers that cannot rewind.
REPLAY_BYTES = 256 << 20


def _nbytes(feed: Mapping[str, Any]) -> int:
    return sum(int(getattr(v, "nbytes", 0)) for v in feed.values())


class _Buffering:
    """``get_next()`` over a reader that keeps what it hands out, and stops at the byte budget."""

    def __init__(self, reader: Any, max_bytes: int) -> None:
        self._reader, self._max = reader, max_bytes
        self.kept: list[Mapping[str, Any]] = []
        self.bytes = 0
        self.exhausted = False
        self.full = False

    def get_next(self) -> Any:
        if self.full or self.exhausted:
            return None
        feed = self._reader.get_next()
        if feed is None or (isinstance(feed, Mapping) and not feed):
            self.exhausted = True
            return None
        self.kept.append(feed)
        self.bytes += _nbytes(feed) if isinstance(feed, Mapping) else 0
        self.full = self.bytes >= self._max
        return feed

    def __getattr__(self, name: str) -> Any:  # bind() and friends of the wrapped reader
        return getattr(self._reader, name)


class _Replay:
    """``get_next()``: the buffered feeds, then the rest of the wrapped reader (unless it has ended)."""

    def __init__(self, kept: list[Mapping[str, Any]], reader: Any, exhausted: bool) -> None:
        self._kept, self._reader, self._exhausted = kept, reader, exhausted
        self._i = 0

    def get_next(self) -> Any:
        if self._i < len(self._kept):
            self._i += 1
            return self._kept[self._i - 1]
        self._kept = []  # free the buffer as soon as it has been replayed
        return None if self._exhausted else self._reader.get_next()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


class _IterReader:
    """``get_next()`` over an iterator of feeds."""

    def __init__(self, items: Any) -> None:
        self._it = iter(items)

    def get_next(self) -> Any:
        return next(self._it, None)


class TwoPass:
    """``first()`` gives the reader for the statistics pass, ``second()`` the one for calibration.

    After ``second()``, ``mode`` says how ("rewind", "list" or "buffer") and ``partial`` whether the first
    pass saw only a prefix of the data (a buffer that reached ``max_bytes``).
    """

    def __init__(self, reader: Any, max_bytes: int = REPLAY_BYTES) -> None:
        self.reader = reader
        self.max_bytes = max_bytes
        self.partial = False
        if callable(getattr(reader, "rewind", None)):
            self.mode = "rewind"
        elif isinstance(reader, Sequence) and not isinstance(reader, str | bytes):
            self.mode = "list"
        else:
            self.mode = "buffer"
            if not callable(getattr(reader, "get_next", None)) and isinstance(reader, Iterable):
                self.reader = _IterReader(reader)
        self._buffer: _Buffering | None = None

    def first(self) -> Any:
        if self.mode == "buffer":
            self._buffer = _Buffering(self.reader, self.max_bytes)
            return self._buffer
        return self.reader

    def second(self) -> Any:
        if self.mode == "rewind":
            self.reader.rewind()
            return self.reader
        if self.mode == "list":
            return self.reader
        buf = self._buffer
        if buf is None:
            return self.reader
        self.partial = buf.full and not buf.exhausted
        if self.partial:
            logger.warning(
                "SmoothQuant: the calibration reader cannot rewind(); its statistics use the first %d samples "
                "(%d MiB kept to replay them), calibration uses all of them",
                len(buf.kept),
                buf.bytes >> 20,
            )
        return _Replay(buf.kept, self.reader, buf.exhausted)
