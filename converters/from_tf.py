"""TensorFlow frontends: Keras models (in memory, ``.keras``, ``.h5``) and SavedModels to clean ONNX via tf2onnx.

Rules:

- **Names**: ONNX inputs and outputs keep the source's names, never tf2onnx's ``:0`` suffix. A Keras
  model's inputs are named after its ``keras.Input`` layers and its outputs after the layers that
  produce them (``model.output_names`` for functional models); a SavedModel's are the keys of its
  serving signature (``serving_default``: for ``model.export()`` files ``output_0``...).
- **Cutting**: ``outputs`` (and ``inputs``) name Keras layers; the cut tensor is that layer's
  output, so ``inputs=["re_lu"]`` starts the ONNX model at the Relu's output. For a SavedModel they
  pick among the signature's keys.
- **Shapes**: ``input_shapes`` fixes dynamic dimensions (``{"image": (1, 96, 96, 3)}``) or names
  them (``{"image": ("N", 96, 96, 3)}``); fixed ones must stay as they are. Unnamed dynamic
  dimensions are called ``batch`` (axis 0; ``<input>_batch`` with several inputs) and
  ``<input>_d<axis>`` instead of tf2onnx's ``unk__N``.
- **Opset**: tf2onnx writes at most opset 18; a higher ``opset`` is reached by the ``clean``
  pipeline's upgrade.
- **Check**: Keras (or the loaded SavedModel) and ONNX Runtime run the same inputs (``check_inputs``
  or generated ones: normal floats, batch 1); every output needs cosine >= ``min_cosine``.
- An op tf2onnx cannot convert is named with its node; ``custom_ops=["Op"]`` (CLI ``--custom-ops``)
  keeps it as a node of domain ``ai.onnx.converters.tensorflow`` for a runtime that implements it
  (ONNX Runtime cannot, so such a model is converted only with ``check=False``).
"""

from __future__ import annotations

__all__ = ["from_keras", "from_saved_model"]

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from zonnx.converters.common import DEFAULT_MIN_COSINE, ConversionError, ConversionResult, SourceInfo
from zonnx.converters.tf_support import (
    convert_function,
    convert_options,
    finish_and_check,
    quiet_tf,
    require_tf,
    tensor_specs,
)
from zonnx.errors import OptionError, did_you_mean, first_line

logger = logging.getLogger(__name__)


def _unique(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        k = seen.get(name, 0)
        seen[name] = k + 1
        out.append(name if k == 0 else f"{name}_{k}")
    return out


def _layer_of(tensor: Any) -> Any:
    history = getattr(tensor, "_keras_history", None)
    return history[0] if history else None


def _keras_io(model: Any, where: str) -> tuple[list[Any], list[str], list[Any], list[str]]:
    """The model's input tensors and names and output tensors and names (see the module rules)."""
    try:
        ins, outs = list(model.inputs), list(model.outputs)
    except (AttributeError, ValueError):
        ins, outs = [], []
    if not ins or not outs:
        raise ConversionError(
            f"{where}: the Keras model has no defined inputs (an unbuilt Sequential or a subclassed model); "
            "start it with keras.Input(shape=...) or build it as a functional model."
        )
    in_names = []
    for i, t in enumerate(ins):
        layer = _layer_of(t)
        name = t.name if not t.name.startswith("keras_tensor") else getattr(layer, "name", f"input_{i}")
        in_names.append(name)
    declared = list(getattr(model, "output_names", None) or [])
    if len(declared) != len(outs):
        declared = [getattr(_layer_of(t), "name", f"output_{i}") for i, t in enumerate(outs)]
    return ins, _unique(in_names), outs, _unique(declared)


def _keras_tensor(model: Any, name: str, where: str, model_inputs: dict[str, Any]) -> Any:
    """The tensor a cut name means: a model input, else the (single) output of the layer so named."""
    if name in model_inputs:
        return model_inputs[name]
    layers = [layer.name for layer in model.layers]
    if name not in layers:
        raise OptionError(f"{where}: no input or layer named {name!r}.{did_you_mean(name, layers)}")
    out = model.get_layer(name).output
    if isinstance(out, list | tuple | dict):
        raise OptionError(f"{where}: layer {name!r} has several outputs; cut at a layer with one output.")
    return out


def _as_list(result: Any, names: Sequence[str]) -> list[Any]:
    if isinstance(result, Mapping):
        return [result[n] for n in names] if all(n in result for n in names) else list(result.values())
    return list(result) if isinstance(result, list | tuple) else [result]


def _load_keras(path: Path) -> Any:
    import keras

    if not path.exists():
        raise ConversionError(f"{path}: no such file; check the path.")
    if path.is_dir():
        raise ConversionError(
            f"{path}: is a folder; convert a SavedModel folder with from_saved_model "
            "(zonnx convert handles folders), or give a .keras/.h5 file."
        )
    if path.suffix.lower() not in (".keras", ".h5", ".hdf5"):
        raise ConversionError(f"{path}: not a Keras file (expected .keras, .h5 or .hdf5).")
    try:
        with quiet_tf():
            return keras.models.load_model(path, compile=False)
    except Exception as e:  # zip, HDF5 and deserialization errors of many types
        raise ConversionError(
            f"{path}: Keras cannot load it ({first_line(e)}); if it uses custom layers, load it yourself "
            "and pass the keras.Model object."
        ) from None


def from_keras(
    model_or_path: Any,
    *,
    input_shapes: Mapping[str, Sequence[int | str]] | None = None,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    opset: int = 17,
    check: bool = True,
    check_inputs: Sequence[Mapping[str, np.ndarray]] | None = None,
    min_cosine: float = DEFAULT_MIN_COSINE,
    custom_ops: Sequence[str] = (),
) -> ConversionResult:
    """Convert a ``keras.Model`` (or a ``.keras``/``.h5`` file) to clean ONNX and check it against Keras.

    The model runs in inference mode (``training=False``); names, cuts, shapes and the check follow the
    module rules. Raises ConversionError (OptionError for bad names or shapes) with one clear message.
    """
    tf, tf2onnx = require_tf()
    import keras

    if isinstance(model_or_path, str | os.PathLike):
        source = str(model_or_path)
        model = _load_keras(Path(model_or_path))
    else:
        model = model_or_path
        if not isinstance(model, keras.Model):
            raise ConversionError(
                f"from_keras needs a keras.Model or a .keras/.h5 path, not {type(model).__name__}."
            )
        source = f"<keras.Model {model.name}>"
    ins, in_names, outs, out_names = _keras_io(model, source)
    if inputs is not None or outputs is not None:
        by_name = dict(zip(in_names, ins, strict=True))
        ins = [_keras_tensor(model, n, source, by_name) for n in inputs] if inputs is not None else ins
        in_names = list(inputs) if inputs is not None else in_names
        outs = [_keras_tensor(model, n, source, by_name) for n in outputs] if outputs is not None else outs
        out_names = list(outputs) if outputs is not None else out_names
        try:
            with quiet_tf():
                model = keras.Model(ins, outs)
        except Exception as e:
            raise OptionError(
                f"{source}: cannot cut the model at inputs {in_names} and outputs {out_names} "
                f"({first_line(e)}); the outputs must depend only on the inputs."
            ) from None
    specs = tensor_specs(
        tf, [(n, tuple(t.shape), t.dtype) for n, t in zip(in_names, ins, strict=True)], input_shapes
    )

    def call(args: Sequence[Any]) -> list[Any]:
        return _as_list(model(list(args) if len(args) > 1 else args[0], training=False), out_names)

    @tf.function(input_signature=specs)
    def fn(*args: Any) -> dict[str, Any]:
        return dict(zip(out_names, call(args), strict=True))

    proto = convert_function(
        fn,
        specs,
        source,
        opset,
        custom_ops,
        input_shapes,
        out_names,
    )

    def source_run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with quiet_tf():
            got = call([feeds[n] for n in in_names])
        return {n: np.asarray(v) for n, v in zip(out_names, got, strict=True)}

    options = convert_options(tf2onnx, tf, opset, input_shapes, inputs, outputs, custom_ops)
    info = SourceInfo(source, "keras", keras.__version__, options)
    return finish_and_check(
        proto,
        info,
        opset=opset,
        in_names=in_names,
        out_names=out_names,
        source_run=source_run,
        check=check,
        check_inputs=check_inputs,
        min_cosine=min_cosine,
        custom_ops=custom_ops,
    )


def _saved_model_signature(tf: ModuleType, path: Path) -> tuple[Any, str]:
    """Load the SavedModel and return (the loaded object, its serving signature's key)."""
    if not path.exists():
        raise ConversionError(f"{path}: no such folder; check the path.")
    if not path.is_dir():
        raise ConversionError(
            f"{path}: is a file, not a SavedModel folder; give the folder written by "
            "model.export() or tf.saved_model.save()."
        )
    if not (path / "saved_model.pb").is_file() and not (path / "saved_model.pbtxt").is_file():
        raise ConversionError(
            f"{path}: not a SavedModel folder (no saved_model.pb inside); give the folder "
            "written by model.export() or tf.saved_model.save()."
        )
    try:
        with quiet_tf():
            imported = tf.saved_model.load(str(path))
    except Exception as e:
        raise ConversionError(f"{path}: TensorFlow cannot load the SavedModel ({first_line(e)}).") from None
    keys = [k for k in imported.signatures if not k.startswith("_")]
    if not keys:
        raise ConversionError(
            f"{path}: the SavedModel has no serving signature; save it with model.export() "
            "or tf.saved_model.save(..., signatures=...)."
        )
    return imported, "serving_default" if "serving_default" in keys else keys[0]


def _pick(kind: str, wanted: Sequence[str] | None, available: list[str], where: str) -> list[str]:
    if wanted is None:
        return available
    for name in wanted:
        if name not in available:
            raise OptionError(
                f"{where}: the serving signature has no {kind} {name!r} (it has {available})."
                f"{did_you_mean(name, available)}"
            )
    return list(wanted)


def from_saved_model(
    path: str | os.PathLike[str],
    *,
    input_shapes: Mapping[str, Sequence[int | str]] | None = None,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    opset: int = 17,
    check: bool = True,
    check_inputs: Sequence[Mapping[str, np.ndarray]] | None = None,
    min_cosine: float = DEFAULT_MIN_COSINE,
    custom_ops: Sequence[str] = (),
) -> ConversionResult:
    """Convert a SavedModel folder's serving signature (``serving_default``, else the first) to clean ONNX
    and check it against the loaded SavedModel. ``inputs`` may reorder the signature's inputs (all are
    needed); ``outputs`` may pick a subset of its outputs."""
    tf, tf2onnx = require_tf()
    p = Path(path)
    imported, key = _saved_model_signature(tf, p)  # ``imported`` owns the variables: keep it referenced
    fn = imported.signatures[key]
    where = f"{p} (signature {key!r})"
    args, kwargs = fn.structured_input_signature
    if args:
        raise ConversionError(
            f"{where}: the signature takes positional inputs; re-export it with named inputs "
            "(model.export() does)."
        )
    all_in = list(kwargs)
    in_names = _pick("input", inputs, all_in, where)
    if sorted(in_names) != sorted(all_in):
        raise OptionError(
            f"{where}: a SavedModel signature needs all its inputs {all_in}; to cut inside the "
            "model, convert the Keras model and name layers."
        )
    out_names = _pick("output", outputs, list(fn.structured_outputs), where)
    specs = tensor_specs(tf, [(n, tuple(kwargs[n].shape), kwargs[n].dtype) for n in in_names], input_shapes)

    @tf.function(input_signature=specs)
    def wrapped(*args: Any) -> dict[str, Any]:
        result = imported.signatures[key](**dict(zip(in_names, args, strict=True)))
        return {n: result[n] for n in out_names}

    proto = convert_function(
        wrapped,
        specs,
        where,
        opset,
        custom_ops,
        input_shapes,
        out_names,
    )

    def source_run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with quiet_tf():
            got = fn(**{n: tf.constant(feeds[n]) for n in in_names})
        return {n: got[n].numpy() for n in out_names}

    info = SourceInfo(
        str(p),
        "tensorflow-savedmodel",
        tf.__version__,
        {**convert_options(tf2onnx, tf, opset, input_shapes, inputs, outputs, custom_ops), "signature": key},
    )
    return finish_and_check(
        proto,
        info,
        opset=opset,
        in_names=in_names,
        out_names=out_names,
        source_run=source_run,
        check=check,
        check_inputs=check_inputs,
        min_cosine=min_cosine,
        custom_ops=custom_ops,
    )
