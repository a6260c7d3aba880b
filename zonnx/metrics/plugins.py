"""Load a metric by name (``cosine``, ``sqnr``, ``top1``, ``top5``, ``mean-iou``, ``box-f1``,
``char-accuracy``) or from a plugin file.

A plugin is ``path/to/file.py:ClassName``: the file is imported as a fresh module and the class is
called with no argument, or with ``model_path=`` (the float model's path, or None) when its constructor
has a ``model_path`` parameter. The instance must follow ``zonnx.metrics.protocol.Metric``.
Whatever the plugin raises (on import, construction, ``update`` or ``result``), and a result that is not
a real number or is NaN, becomes one ``MetricError`` line naming the plugin file and the line of the
last traceback frame inside that file.
"""

from __future__ import annotations

__all__ = ["BUILTIN_METRICS", "PluginMetric", "load_metric", "guard"]

import hashlib
import importlib.util
import inspect
import logging
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from zonnx.errors import MetricError, ZonnxError, did_you_mean
from zonnx.metrics.builtin import Cosine, Sqnr, Top1, TopK
from zonnx.metrics.detection import BoxF1, MeanIoU
from zonnx.metrics.ocr import CharAccuracy, model_characters
from zonnx.metrics.protocol import Metric, as_number, higher_is_better, resolution_of

logger = logging.getLogger(__name__)

_ModelPath = str | os.PathLike[str] | None


def _char_accuracy(model_path: _ModelPath, score: str = "strict") -> CharAccuracy:
    if model_path is None:
        from zonnx.zoo.text_images import rec_characters

        logger.info("char-accuracy: no model path given; using the PP-OCRv4 rec character list")
        return CharAccuracy(rec_characters(), score=score)
    return CharAccuracy(model_characters(model_path), score=score)


#: Built-in metric name -> factory taking the float model's path (or None).
BUILTIN_METRICS: dict[str, Callable[[_ModelPath], Metric]] = {
    "cosine": lambda _: Cosine(),
    "sqnr": lambda _: Sqnr(),
    "top1": lambda _: Top1(),
    "top5": lambda _: TopK(5),
    "mean-iou": lambda _: MeanIoU(),
    "box-f1": lambda _: BoxF1(),
    "char-accuracy": _char_accuracy,
    # leading and trailing spaces ignored: a crop's margins read as a space are not a reading error
    "char-accuracy-stripped": lambda path: _char_accuracy(path, "stripped"),
}


def _where(error: BaseException, source: Path) -> str:
    """``file:line`` of the last traceback frame in ``source`` (else the last frame, else the file)."""
    if isinstance(error, SyntaxError) and error.filename and error.lineno:
        return f"{error.filename}:{error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    real = os.path.realpath(source)
    inside = [f for f in frames if os.path.realpath(f.filename) == real]
    frame = (inside or frames or [None])[-1]
    return f"{source}:{frame.lineno}" if frame is not None and inside else str(source)


def _raised(error: BaseException, source: Path, what: str) -> MetricError:
    text = " ".join(str(error).split()) or "(no message)"
    return MetricError(f"metric plugin {_where(error, source)}: {what} raised {type(error).__name__}: {text}")


class PluginMetric:
    """A user's metric with every call guarded: exceptions and bad results become MetricError lines."""

    def __init__(self, inner: Any, source: Path) -> None:
        self.inner = inner
        self.source = source
        self.name = f"{source}:{type(inner).__name__}"
        self.higher_is_better = self._call("higher_is_better", lambda: higher_is_better(inner))

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ZonnxError:
            raise
        except Exception as e:  # noqa: BLE001 - a plugin may raise anything; the user gets one line
            raise _raised(e, self.source, what) from None

    def update(
        self, float_outputs: list[np.ndarray], quant_outputs: list[np.ndarray], feed: dict[str, np.ndarray]
    ) -> None:
        self._call("update()", lambda: self.inner.update(float_outputs, quant_outputs, feed))

    def result(self) -> float:
        value = self._call("result()", self.inner.result)
        return as_number(value, f"metric plugin {self.name}")

    def resolution(self) -> float | None:
        """The plugin's ``resolution()`` when it has one (guarded and checked), else None."""
        return self._call("resolution()", lambda: resolution_of(self.inner, f"metric plugin {self.name}"))


def _source_of(obj: Any) -> Path:
    try:
        return Path(inspect.getsourcefile(type(obj)) or "<unknown>")
    except TypeError:  # a class defined in a built-in or interactive module
        return Path("<unknown>")


def guard(metric: Any) -> Metric:
    """``metric`` with its calls guarded (PluginMetric) unless it is a built-in or guarded already."""
    if isinstance(metric, PluginMetric) or type(metric).__module__.startswith("zonnx.metrics."):
        return metric
    if not callable(getattr(metric, "update", None)) or not callable(getattr(metric, "result", None)):
        raise MetricError(
            f"metric {type(metric).__name__}: has no update() and result() methods; see zonnx.metrics."
        )
    return PluginMetric(metric, _source_of(metric))


def _import(path: Path) -> Any:
    """Import the plugin file as its own module (registered while it runs, as dataclasses need)."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"zonnx_metric_plugin_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise MetricError(f"metric plugin {path}: cannot be imported; give a Python file (.py).")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - import errors of any kind become one line
        sys.modules.pop(name, None)
        raise _raised(e, path, "importing it") from None
    return module


def _construct(cls: type, path: Path, model_path: _ModelPath) -> Any:
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}
    try:
        return cls(model_path=model_path) if "model_path" in params else cls()
    except Exception as e:  # noqa: BLE001
        raise _raised(e, path, f"{cls.__name__}()") from None


def load_metric(spec: str, model_path: _ModelPath = None) -> Metric:
    """A metric from a built-in name or ``path/to/file.py:ClassName`` (see the module docstring).

    ``model_path``: the float model, read by metrics that need its metadata (char-accuracy's character
    list); without it char-accuracy uses the PP-OCRv4 rec list.
    """
    spec = spec.strip()
    if spec in BUILTIN_METRICS:
        return BUILTIN_METRICS[spec](model_path)
    file, sep, cls_name = spec.rpartition(":")
    if not sep or not file or not cls_name:
        raise MetricError(
            f"metric {spec!r}: not a built-in metric.{did_you_mean(spec, BUILTIN_METRICS)} Give one of "
            f"{', '.join(BUILTIN_METRICS)} or a plugin as path/to/file.py:ClassName."
        )
    path = Path(file)
    if not path.is_file():
        raise MetricError(f"metric plugin {path}: no such file; give path/to/file.py:ClassName.")
    module = _import(path)
    cls = getattr(module, cls_name, None)
    if not isinstance(cls, type):
        classes = sorted(
            n for n, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__
        )
        hint = did_you_mean(cls_name, classes) or f" Classes there: {', '.join(classes) or 'none'}."
        raise MetricError(f"metric plugin {path}: no class {cls_name!r}.{hint}")
    for method in ("update", "result"):
        if not callable(getattr(cls, method, None)):
            raise MetricError(
                f"metric plugin {path}:{cls_name}: has no {method}() method; a metric needs "
                "update(float_outputs, quant_outputs, feed) and result()."
            )
    return PluginMetric(_construct(cls, path, model_path), path)
