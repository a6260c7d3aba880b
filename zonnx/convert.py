"""``zonnx.convert``: bring a PyTorch, ONNX, TensorFlow/Keras or TFLite model to clean, checked ONNX.

``convert(path, ConvertOptions(...))`` is what ``zonnx convert`` runs: the frontend picked from the input
(see ``zonnx.converters.dispatch``), then the options the frontend does not apply itself (a cut or
named dims for a torch or TFLite model) on its ONNX result, checked in ORT against that result, then
preprocessing folded in and checked against the unfolded model plus ``reference_preprocess`` in numpy.
The frontends are also here by name: ``from_torch(module, example_inputs)``, ``from_onnx(path)``,
``from_keras``, ``from_saved_model``, ``from_tflite`` (the last three need ``pip install zonnx[tf]``).
"""

from __future__ import annotations

__all__ = [
    "ConvertOptions",
    "Converted",
    "ConversionResult",
    "ConversionError",
    "Preprocess",
    "convert",
    "op_counts",
    "from_torch",
    "from_onnx",
    "from_keras",
    "from_saved_model",
    "from_tflite",
    "fold_preprocessing",
    "reference_preprocess",
]

import dataclasses
import logging
from collections import Counter
from typing import Any

import onnx

from zonnx.converters.common import ConversionError, ConversionResult, OutputCheck, SourceInfo, finish
from zonnx.converters.dispatch import ConvertOptions, detect_kind, onnx_dims, run_frontend, tf_frontend
from zonnx.converters.from_onnx import convert_onnx, from_onnx
from zonnx.converters.preprocess import (
    Preprocess,
    check_preprocessing,
    fold_preprocessing,
    image_input_name,
    reference_preprocess,
)

logger = logging.getLogger(__name__)


def op_counts(model: onnx.ModelProto) -> Counter[str]:
    """Node count per op type in the main graph."""
    return Counter(n.op_type for n in model.graph.node)


@dataclasses.dataclass
class Converted:
    """A conversion: the result, the input kind, op counts before (the frontend's starting model; None
    for TF/TFLite, whose raw tf2onnx model is not kept), and the preprocessing check."""

    result: ConversionResult
    kind: str
    ops_before: Counter[str] | None
    preprocess_checks: list[OutputCheck] = dataclasses.field(default_factory=list)

    @property
    def ops_after(self) -> Counter[str]:
        return op_counts(self.result.model)


def convert(spec: str, options: ConvertOptions | None = None) -> Converted:
    """Convert ``spec`` (a path, or ``model.py:Name``) with ``options``; see the module docstring.

    Raises a ZonnxError subclass with one clear line on bad input or a failed numeric check.
    """
    opts = options or ConvertOptions()
    kind = detect_kind(spec)
    result, raw, done = run_frontend(spec, opts)
    result = _post_steps(result, opts, done)
    converted = Converted(result, kind, op_counts(raw) if raw is not None else None)
    return _fold(converted, opts, opts.preprocess) if opts.preprocess is not None else converted


def _post_steps(result: ConversionResult, opts: ConvertOptions, done: set[str]) -> ConversionResult:
    """Apply the dims and cut options the frontend did not take to its ONNX result (checked in ORT)."""
    want_dims = ("dynamic" not in done and opts.dynamic) or ("input_shapes" not in done and opts.input_shapes)
    want_cut = ("inputs" not in done and opts.inputs) or ("outputs" not in done and opts.outputs)
    if not (want_dims or want_cut):
        return result
    dims = onnx_dims(result.model, opts, fixed="input_shapes" not in done) if want_dims else None
    info = result.info
    cut, _ = convert_onnx(
        result.model,
        inputs=list(opts.inputs) if want_cut else None,
        outputs=list(opts.outputs) if want_cut else None,
        input_shapes=dims or None,
        opset=opts.opset,
        check=opts.check,
        min_cosine=opts.min_cosine,
        source=info.source,
        framework=(info.framework, info.framework_version),
        options={**info.options, "inputs": list(opts.inputs), "outputs": list(opts.outputs)},
    )
    return ConversionResult(cut.model, result.checks + cut.checks, cut.info)


def _fold(converted: Converted, opts: ConvertOptions, pre: Preprocess) -> Converted:
    """Fold the preprocessing, check it against the unfolded model + numpy, and clean the result again."""
    result = converted.result
    name = image_input_name(result.model, opts.preprocess_input)
    folded = fold_preprocessing(
        result.model,
        mean=pre.mean,
        scale=pre.scale,
        pixel_format=pre.pixel_format,
        layout=pre.layout,
        input_dtype=pre.input_dtype,
        model_format=pre.model_format,
        model_layout=pre.model_layout,
        input_name=name,
    )
    checks = (
        check_preprocessing(result.model, folded, pre, input_name=name, min_cosine=opts.min_cosine)
        if opts.check
        else []
    )
    options = {**result.info.options, "preprocess": {**dataclasses.asdict(pre), "input": name}}
    info = SourceInfo(result.info.source, result.info.framework, result.info.framework_version, options)
    model = finish(
        folded,
        info,
        opset=opts.opset,
        input_names=[i.name for i in result.model.graph.input],
        output_names=[o.name for o in result.model.graph.output],
    )
    return Converted(
        ConversionResult(model, result.checks, info), converted.kind, converted.ops_before, checks
    )


def from_torch(module: Any, example_inputs: Any, **options: Any) -> ConversionResult:
    """``zonnx.converters.from_torch.from_torch``: torch module + example inputs -> checked clean ONNX."""
    from zonnx.converters.from_torch import from_torch as _from_torch

    return _from_torch(module, example_inputs, **options)


def from_keras(model_or_path: Any, **options: Any) -> ConversionResult:
    """Keras model or ``.keras``/``.h5`` file -> checked clean ONNX (needs ``pip install zonnx[tf]``)."""
    return tf_frontend("keras")(model_or_path, **options)


def from_saved_model(path: Any, **options: Any) -> ConversionResult:
    """SavedModel folder -> checked clean ONNX (needs ``pip install zonnx[tf]``)."""
    return tf_frontend("saved_model")(path, **options)


def from_tflite(path: Any, **options: Any) -> ConversionResult:
    """``.tflite`` file (float or int8) -> checked clean (QDQ) ONNX (needs ``pip install zonnx[tf]``)."""
    return tf_frontend("tflite")(path, **options)
