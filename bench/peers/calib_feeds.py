"""The peer scripts' calibration file: feeds keyed "<index>.<input name>" in one .npz (shapes may differ)."""

from __future__ import annotations

__all__ = ["CalibFileError", "load_feeds"]

from pathlib import Path

import numpy as np


class CalibFileError(ValueError):
    """The calibration .npz does not hold feeds keyed "<index>.<input name>"."""


def load_feeds(path: Path) -> list[dict[str, np.ndarray]]:
    """Read feeds keyed "<index>.<input name>": indices 0..n-1 without gaps, the same input names in each."""
    by_index: dict[int, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as data:
        for key in data.files:
            index, sep, name = key.partition(".")
            if not sep or not name or not index.isdigit():
                raise CalibFileError(f"{path}: key {key!r} is not '<index>.<input name>'.")
            by_index.setdefault(int(index), {})[name] = data[key]
    if not by_index:
        raise CalibFileError(f"{path}: holds no samples.")
    if sorted(by_index) != list(range(len(by_index))):
        raise CalibFileError(f"{path}: sample indices must run 0..{len(by_index) - 1} without gaps.")
    names = set(by_index[0])
    for i, feed in by_index.items():
        if set(feed) != names:
            raise CalibFileError(
                f"{path}: sample {i} has inputs {sorted(feed)}, sample 0 has {sorted(names)}."
            )
    return [by_index[i] for i in range(len(by_index))]
