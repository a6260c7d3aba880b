"""Errors zonnx raises for bad input: each message names the file, node, tensor or option and what to do."""

from __future__ import annotations

__all__ = [
    "ZonnxError",
    "ModelLoadError",
    "ModelSaveError",
    "UnsupportedModelError",
    "OptionError",
    "PassFailedError",
    "VerificationError",
    "MetricError",
    "did_you_mean",
    "type_names",
    "first_line",
]

import difflib
from collections.abc import Iterable


class ZonnxError(Exception):
    """Base class: a user-facing problem with a message that says what to do.

    The CLI prints ``str(error)`` on one line and exits with ``exit_code``; it never shows a traceback.
    """

    exit_code: int = 2


class ModelLoadError(ZonnxError):
    """A model file could not be read (missing, not ONNX, truncated, external data missing)."""


class ModelSaveError(ZonnxError):
    """A model could not be written (unwritable path, would overwrite the input)."""


class UnsupportedModelError(ZonnxError):
    """A model uses an opset, IR version or graph zonnx cannot handle (e.g. a layer both float and quantized)."""


class OptionError(ZonnxError, ValueError):
    """An option has an unknown name or a value out of range (also a ValueError, as Python's API expects)."""


class PassFailedError(ZonnxError):
    """A graph pass could not complete on this model."""


class VerificationError(ZonnxError):
    """A rewritten model does not match the original numerically or does not load."""


class MetricError(ZonnxError):
    """A model metric cannot be loaded or failed (plugin file or class missing, it raised, or gave no number)."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message, blank space around the message dropped; the exception's
    class name when the message is empty. For one-line errors quoting what a library (ORT, onnx, torch,
    TensorFlow) raised, whose messages often run on with a stack or a dump."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ' Did you mean X?' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def type_names(types: type | tuple[type, ...]) -> str:
    """The names of ``types`` for a message: "int or float", "None" for NoneType."""
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join("None" if t is type(None) else t.__name__ for t in types)
