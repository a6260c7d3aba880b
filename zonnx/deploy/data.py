"""Evaluation and calibration data of a build, and the label metric; datasets are plugins as metrics are.

Datasets (``[evaluate] dataset``): ``digits`` (the held-out digits test set with labels, key ``label``),
``zoo`` (the zoo model's own realistic samples), ``text-lines`` (rendered text lines for PP-OCR rec,
resized and zero-padded to the model's width when its input shape is static), a
``.npz``/``.npy`` file or folder, an images folder (preprocessed for the model's input as ``zonnx
quantize --calib`` does), or a plugin ``FILE.py:NAME``: ``NAME(model_path: str, n: int)`` returns an
iterable of samples, each a dict of arrays named as the model's inputs (other keys, e.g. labels, only
reach the metric). Errors a plugin raises name its file and line.

Metrics (``[evaluate] metric``): ``accuracy`` = fraction of batch rows whose argmax over the last axis
of the first output equals ``feed["label"]``; every other name is ``zonnx.metrics.load_metric``'s (the
same protocol: ``update(float_outputs, outputs, feed)``, ``result()``). The float model is scored as
``update(float, float)``, so agreement metrics give it their perfect value.
"""

from __future__ import annotations

__all__ = ["DATASETS", "LabelAccuracy", "eval_samples", "calibration_samples", "make_metric"]

import importlib.util
import logging
import os
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from zonnx import zoo
from zonnx.errors import MetricError, OptionError

logger = logging.getLogger(__name__)

DATASETS = ("digits", "zoo", "text-lines")
Sample = dict[str, np.ndarray]


class LabelAccuracy:
    """Top-k accuracy against the sample's ``label`` array: the label among the ``k`` largest scores on
    the last axis of output 0 (``k`` 1: argmax; ties broken by index)."""

    higher_is_better = True

    def __init__(self, k: int = 1) -> None:
        self.k = k
        self.right = 0
        self.rows = 0

    def update(self, float_outputs: list[np.ndarray], quant_outputs: list[np.ndarray], feed: Mapping) -> None:
        if "label" not in feed:
            raise MetricError(
                "metric accuracy: the sample has no 'label' array; use a labelled dataset or metric cosine."
            )
        scores = np.asarray(quant_outputs[0]).reshape(-1, np.shape(quant_outputs[0])[-1])
        top = np.argsort(-scores, axis=1, kind="stable")[:, : self.k]
        labels = np.asarray(feed["label"]).reshape(-1)
        self.right += int((top == labels[:, None]).any(axis=1).sum())
        self.rows += labels.size

    def result(self) -> float:
        if not self.rows:
            raise MetricError("metric accuracy: no sample was given.")
        return self.right / self.rows


def make_metric(spec: str, model_path: str | None) -> Any:
    """A fresh metric for ``spec`` (``accuracy``, ``accuracy-top5`` or anything ``load_metric`` takes)."""
    if spec in ("accuracy", "accuracy-top5"):
        return LabelAccuracy(5 if spec.endswith("top5") else 1)
    from zonnx.metrics.plugins import guard, load_metric

    return guard(load_metric(spec, model_path))


def _plugin(spec: str, model_path: str, n: int) -> list[Sample]:
    file, _, name = spec.partition(".py:")
    path = Path(file + ".py")
    if not path.is_file():
        raise OptionError(f"[evaluate] dataset {spec}: no such file {path}.")
    try:
        module_spec = importlib.util.spec_from_file_location(f"zonnx_dataset_{abs(hash(path))}", path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        module_spec.loader.exec_module(module)
        fn = getattr(module, name)
        samples = [dict(s) for s in fn(model_path, n)]
    except AttributeError as e:
        raise OptionError(f"[evaluate] dataset {spec}: {path} has no {name!r} ({e}).") from None
    except Exception as e:  # noqa: BLE001 - a plugin may raise anything; the user gets its file and line
        frames = [f for f in traceback.extract_tb(e.__traceback__) if os.path.samefile(f.filename, path)]
        where = f"{path}:{frames[-1].lineno}" if frames else str(path)
        raise OptionError(f"dataset plugin {where}: raised {type(e).__name__}: {e}") from None
    return samples


def _from_reader(source: str, model: onnx.ModelProto) -> list[Sample]:
    from zonnx.quantization.sources import reader_from_source

    reader = reader_from_source(source, model)
    return [{k: np.asarray(v) for k, v in feed.items()} for feed in iter(reader.get_next, None)]


def _fixed_width(model: onnx.ModelProto) -> int | None:
    """The static last dim of a text-line model's first input (``[model] input_shape`` fixed it), else None:
    text-line samples are then resized and zero-padded to that width (``rec_preprocess``)."""
    init = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in init]
    dims = inputs[0].type.tensor_type.shape.dim if inputs else []
    return dims[-1].dim_value if dims and dims[-1].HasField("dim_value") and dims[-1].dim_value > 0 else None


def eval_samples(dataset: str, source: str, model_path: str, n: int) -> list[Sample]:
    """``n`` evaluation samples (0: all the dataset has; zoo and text-lines default to 64)."""
    if dataset == "digits":
        from zonnx.zoo.digits import digits_data

        x, y = digits_data("test")
        count = len(y) if n <= 0 else min(n, len(y))
        samples = [{"input": x[i : i + 1], "label": y[i : i + 1]} for i in range(count)]
    elif dataset == "zoo":
        if source not in zoo.names():
            raise OptionError(f"[evaluate] dataset zoo: {source} is not a zoo model; name a dataset.")
        samples = zoo.sample_inputs(source, n or 64, seed=7)
    elif dataset == "text-lines":
        from zonnx.zoo.text_images import rec_inputs

        samples = rec_inputs(
            n or 64, seed=7, width=_fixed_width(onnx.load(model_path, load_external_data=False))
        )
    elif ".py:" in dataset:
        samples = _plugin(dataset, model_path, n)
    else:
        if not Path(dataset).exists():
            raise OptionError(f"[evaluate] dataset {dataset}: no such file or folder.")
        samples = _from_reader(dataset, onnx.load(model_path, load_external_data=False))
        samples = samples[:n] if n > 0 else samples
    if not samples:
        raise OptionError(f"[evaluate] dataset {dataset or '(none)'}: gave no sample.")
    _check_fits(samples[0], model_path, dataset)
    return samples


def _check_fits(sample: Sample, model_path: str, dataset: str) -> None:
    """Refuse a dataset whose arrays do not have the model's input names or ranks."""
    model = onnx.load(model_path, load_external_data=False)
    init = {i.name for i in model.graph.initializer}
    for inp in (i for i in model.graph.input if i.name not in init):
        if inp.name not in sample:
            raise OptionError(
                f"[evaluate] dataset {dataset}: no array for model input {inp.name!r} (it has {sorted(sample)})."
            )
        rank = len(inp.type.tensor_type.shape.dim)
        if rank and np.ndim(sample[inp.name]) != rank:
            raise OptionError(
                f"[evaluate] dataset {dataset}: input {inp.name!r} has shape {list(np.shape(sample[inp.name]))}, "
                f"the model takes rank {rank}."
            )


def calibration_samples(calib: str, dataset: str, source: str, model_path: str, n: int) -> list[Sample]:
    """Calibration samples: ``calib`` when set, else the dataset's own calibration split, else the zoo
    model's (never the evaluation samples: digits uses its ``calib`` split, zoo and text-lines other seeds)."""
    model = onnx.load(model_path, load_external_data=False)
    if calib:
        samples = _from_reader(calib, model)
    elif dataset == "digits" or source == "digits_cnn":
        from zonnx.zoo.digits import digits_data

        x, _ = digits_data("calib")
        samples = [{"input": x[i : i + 1]} for i in range(min(n, len(x)))]
    elif dataset == "text-lines":
        from zonnx.zoo.text_images import rec_inputs

        samples = rec_inputs(n, seed=1, width=_fixed_width(model))
    elif dataset == "zoo" or source in zoo.names():
        samples = zoo.sample_inputs(source, n, seed=1)
    else:
        raise OptionError(
            f"{source}: no calibration data; set [quantize] calib (images folder, .npz/.npy, FILE.py:FUNC)."
        )
    names = {i.name for i in model.graph.input}
    return [{k: v for k, v in s.items() if k in names} for s in samples[:n] if s]
