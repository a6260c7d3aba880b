"""Parsers for CLI option values shared by subcommands (shapes, comma lists)."""

from __future__ import annotations

__all__ = ["parse_input_shapes", "parse_name_list", "load_feeds"]

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from zonnx.errors import OptionError
from zonnx.quantization.calibration.readers import CalibrationError, load_arrays


def parse_input_shapes(values: Sequence[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse onnxsim-style ``name:1,3,224,224`` values (one per option use) into a dict."""
    shapes: dict[str, tuple[int, ...]] = {}
    for value in values or ():
        name, sep, dims = value.rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.split(","))
        except ValueError:
            shape = ()
        if not sep or not name or not shape or any(d <= 0 for d in shape):
            raise OptionError(
                f"--input-shape {value!r}: write it as NAME:D1,D2,... with positive sizes, "
                "for example x:1,3,224,224."
            )
        shapes[name] = shape
    return shapes


def parse_name_list(values: Sequence[str] | None) -> list[str]:
    """Accept repeated options and comma-separated values alike: ``--skip a,b --skip c``."""
    return [item.strip() for v in values or () for item in v.split(",") if item.strip()]


def load_feeds(path: Path) -> dict[str, np.ndarray]:
    """Read model inputs from an .npz file: one array per input name, each a whole input tensor."""
    if not path.is_file():
        raise OptionError(f"--inputs {path}: no such file.")
    try:
        return load_arrays(path)  # the calibration reader's safe loader: no pickles, one line on damage
    except CalibrationError as e:
        raise OptionError(f"--inputs {e}") from None
