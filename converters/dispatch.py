"""Pick the frontend from what the user gives (``model.py:Name``, ``.pt``, ``.pt2``, ``.onnx``, a SavedModel
folder, ``.keras``/``.h5``, ``.tflite``) and run it with the options it takes (torch sources are loaded
by ``zonnx.converters.torch_sources``).

Kinds are told by suffix, then by content: a folder must hold ``saved_model.pb``; a file without a
known suffix is TFLite when bytes 4..8 are ``TFL3``, TorchScript when it is a zip archive.
"""

from __future__ import annotations

__all__ = [
    "KINDS",
    "ConvertOptions",
    "detect_kind",
    "load_python_entry",
    "load_torch_file",
    "onnx_dims",
    "tf_frontend",
    "run_frontend",
]

import contextlib
import dataclasses
import inspect
import logging
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx

from zonnx.converters.common import (
    DEFAULT_MIN_COSINE,
    ConversionError,
    ConversionResult,
)
from zonnx.converters.preprocess import Preprocess
from zonnx.converters.torch_sources import load_python_entry, load_torch_file, split_entry
from zonnx.errors import ModelLoadError, OptionError, did_you_mean

logger = logging.getLogger(__name__)

#: Input kinds and what they are.
KINDS = {
    "python": "model.py:ClassOrFactory (a torch nn.Module built with no arguments or --init-args)",
    "torchscript": "TorchScript file (.pt, torch.jit.save)",
    "torch_export": "torch.export program (.pt2, torch.export.save)",
    "onnx": "ONNX model (.onnx)",
    "saved_model": "TensorFlow SavedModel folder",
    "keras": "Keras model (.keras, .h5)",
    "tflite": "TFLite flatbuffer (.tflite)",
}
_SUFFIXES = {".py": "python", ".pt": "torchscript", ".pth": "torchscript", ".ts": "torchscript",
             ".pt2": "torch_export", ".onnx": "onnx", ".keras": "keras", ".h5": "keras", ".hdf5": "keras",
             ".tflite": "tflite"}  # fmt: skip
_TF_HINT = "TensorFlow is not installed: pip install zonnx[tf] (tensorflow-cpu and tf2onnx)"


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """Options of ``convert``; every one has the CLI flag of the same name.

    Attributes:
        input_shapes: NAME -> sizes; fixes dynamic dims, and gives torch its example input shapes.
        input_dtypes: NAME -> numpy dtype name for generated torch example inputs (default float32).
        dynamic: NAME -> {axis: dim name}: dims to keep (or make) dynamic under that name.
        inputs / outputs: cut the graph at these tensor names (default: the model's own).
        input_names / output_names: names for a torch model's exported inputs/outputs.
        init_args: keyword arguments for ``model.py:Class`` (default none).
        opset: default-domain opset of the result (default 17).
        check: run the numeric check against the source (default True).
        test_inputs: real input samples for the check (and torch's example inputs).
        min_cosine / max_lsb: check tolerances for float / quantized outputs (0.9999 / 1).
        custom_ops: TF ops to keep as custom nodes (tf2onnx), default none.
        preprocess / preprocess_input: preprocessing to fold into this image input (default none).
    """

    input_shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    input_dtypes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    dynamic: Mapping[str, Mapping[int, str]] = dataclasses.field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()
    init_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    opset: int = 17
    check: bool = True
    test_inputs: tuple[Mapping[str, np.ndarray], ...] = ()
    min_cosine: float = DEFAULT_MIN_COSINE
    max_lsb: int = 1
    custom_ops: tuple[str, ...] = ()
    preprocess: Preprocess | None = None
    preprocess_input: str | None = None


# ---------------------------------------------------------------- what the input is


def detect_kind(spec: str) -> str:
    """The input's kind (a key of KINDS) from its suffix, folder content or first bytes."""
    path, _ = split_entry(spec)
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or folder; check the path.")
    if path.is_dir():
        if (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file():
            return "saved_model"
        raise ModelLoadError(
            f"{path}: is a folder but not a TensorFlow SavedModel (expected saved_model.pb "
            "inside); give the model file itself (.onnx, .pt, .pt2, .keras, .h5, .tflite, "
            "model.py:Class) or a SavedModel folder."
        )
    kind = _SUFFIXES.get(path.suffix.lower())
    if kind:
        return kind
    with path.open("rb") as f:
        head = f.read(8)
    if head[4:8] == b"TFL3":
        return "tflite"
    if zipfile.is_zipfile(path):
        return "torchscript"
    known = ", ".join(sorted(_SUFFIXES))
    raise ModelLoadError(
        f"{path}: unknown model format (suffix {path.suffix or 'none'}); give one of {known}, "
        "or a SavedModel folder."
    )


# ---------------------------------------------------------------- the torch frontend


def _torch_example(module: Any, saved: tuple | None, opts: ConvertOptions, where: str) -> Any:
    """Example inputs: the first --test-input sample, else --input-shape (random data), else saved ones."""
    from zonnx.converters.from_torch import torch_input_names

    names = torch_input_names(module)
    if opts.test_inputs:
        return opts.test_inputs[0]  # keyed by forward()'s parameter names
    if not opts.input_shapes:
        if saved is not None:
            return saved
        example = (
            " ".join(f"--input-shape {n}:1,3,224,224" for n in names[:2]) or "--input-shape x:1,3,224,224"
        )
        raise OptionError(f"{where}: give the input sizes of forward({', '.join(names)}), e.g. {example}.")
    unknown = [n for n in opts.input_shapes if n not in names]
    if unknown:
        raise OptionError(
            f"--input-shape {unknown[0]}: forward() has no input of that name."
            f"{did_you_mean(unknown[0], names)} Its inputs are {names}."
        )
    sig_defaults = _defaults(module)
    missing = [n for n in names if n not in opts.input_shapes and n not in sig_defaults]
    if missing:
        raise OptionError(
            f"--input-shape: also give the sizes of {', '.join(missing)} (forward takes {names})."
        )
    rng = np.random.default_rng(0)
    args = []
    for n in [n for n in names if n in opts.input_shapes]:
        dtype = np.dtype(opts.input_dtypes.get(n, "float32"))
        shape = opts.input_shapes[n]
        args.append(
            rng.standard_normal(shape).astype(dtype)
            if dtype.kind == "f"
            else rng.integers(0, 10, shape).astype(dtype)
        )
    return tuple(args)


def _defaults(module: Any) -> set[str]:
    with contextlib.suppress(TypeError, ValueError):
        return {
            p.name for p in inspect.signature(module.forward).parameters.values() if p.default is not p.empty
        }
    return set()


def _convert_torch(spec: str, kind: str, opts: ConvertOptions) -> tuple[ConversionResult, onnx.ModelProto]:
    from zonnx.converters.from_torch import convert_module

    path, _ = split_entry(spec)
    if kind == "python":
        module, saved, dynamic = load_python_entry(spec, opts.init_args), None, {}
    else:
        module, saved, dynamic = load_torch_file(path)
    for name, axes in opts.dynamic.items():
        dynamic[name] = {**dynamic.get(name, {}), **axes}
    args = _torch_example(module, saved, opts, spec)
    extra = {"init_args": dict(opts.init_args)} if opts.init_args else {}
    return convert_module(
        module,
        args,
        input_names=opts.input_names or None,
        output_names=opts.output_names or None,
        dynamic_axes=dynamic or None,
        opset=opts.opset,
        check=opts.check,
        check_inputs=list(opts.test_inputs[1:]),
        min_cosine=opts.min_cosine,
        max_lsb=opts.max_lsb,
        source=spec,
        options=extra,
    )


# ---------------------------------------------------------------- other frontends


def onnx_dims(model: onnx.ModelProto, opts: ConvertOptions, *, fixed: bool = True) -> dict[str, list]:
    """Full per-input dims for set_input_dims: --input-shape sizes (when ``fixed``), then --dynamic names."""
    from zonnx.converters.from_onnx import input_dims

    inputs = {vi.name: vi for vi in model.graph.input}
    dims: dict[str, list] = {n: list(s) for n, s in opts.input_shapes.items()} if fixed else {}
    for name, axes in opts.dynamic.items():
        if name not in inputs:
            raise OptionError(
                f"--dynamic {name}: the model has no input of that name.{did_you_mean(name, inputs)} "
                f"Its inputs are {list(inputs)}."
            )
        current = dims.get(name) or [
            d if d is not None else f"{name}_d{i}" for i, d in enumerate(input_dims(inputs[name]))
        ]
        for axis, dim_name in axes.items():
            if not 0 <= axis < len(current):
                raise OptionError(
                    f"--dynamic {name}:{axis}={dim_name}: input {name!r} has {len(current)} dims."
                )
            current[axis] = dim_name
        dims[name] = current
    return dims


def _convert_onnx(spec: str, opts: ConvertOptions) -> tuple[ConversionResult, onnx.ModelProto]:
    from zonnx.converters.from_onnx import convert_onnx
    from zonnx.ir.io import load_proto

    model = load_proto(spec)
    return convert_onnx(
        model,
        inputs=opts.inputs or None,
        outputs=opts.outputs or None,
        input_shapes=onnx_dims(model, opts) or None,
        opset=opts.opset,
        check=opts.check,
        check_inputs=list(opts.test_inputs) or None,
        min_cosine=opts.min_cosine,
        source=spec,
    )


def tf_frontend(kind: str) -> Callable[..., ConversionResult]:
    """The TensorFlow-side frontend for ``kind``, imported on first use."""
    try:
        if kind == "tflite":
            from zonnx.converters.from_tflite import from_tflite

            return from_tflite
        from zonnx.converters import from_tf
    except ImportError as e:
        raise ConversionError(f"{_TF_HINT} ({e.name or e} is missing).") from None
    return from_tf.from_saved_model if kind == "saved_model" else from_tf.from_keras


def _convert_tf(kind: str, spec: str, opts: ConvertOptions) -> tuple[ConversionResult, set[str]]:
    """Call the TF frontend with the options its signature takes; returns the options it took."""
    frontend = tf_frontend(kind)
    params = set(inspect.signature(frontend).parameters)
    if opts.custom_ops and "custom_ops" not in params:
        raise OptionError(f"--custom-ops is not supported for {KINDS[kind]} input.")
    wanted = {
        "input_shapes": dict(opts.input_shapes) or None,
        "inputs": list(opts.inputs) or None,
        "outputs": list(opts.outputs) or None,
        "opset": opts.opset,
        "check": opts.check,
        "check_inputs": list(opts.test_inputs) or None,
        "min_cosine": opts.min_cosine,
        "max_lsb": opts.max_lsb,
        "custom_ops": list(opts.custom_ops),
    }
    taken = {k: v for k, v in wanted.items() if k in params and v is not None}
    return frontend(spec, **taken), set(taken) & {"input_shapes", "inputs", "outputs"}


def _check_applicable(kind: str, opts: ConvertOptions) -> None:
    """Refuse options that mean nothing for this kind of input instead of ignoring them."""
    torch_kinds = ("python", "torchscript", "torch_export")
    for given, option, kinds in ((opts.init_args, "--init-args", ("python",)),
                                 (opts.input_names or opts.output_names, "--input-names/--output-names", torch_kinds),
                                 (opts.input_dtypes, "an --input-shape dtype", torch_kinds),
                                 (opts.custom_ops, "--custom-ops", ("saved_model", "keras", "tflite"))):  # fmt: skip
        if given and kind not in kinds:
            raise OptionError(
                f"{option} does not apply to a {KINDS[kind]}; it is for {', '.join(kinds)} input."
            )


def run_frontend(
    spec: str, options: ConvertOptions | None = None
) -> tuple[ConversionResult, onnx.ModelProto | None, set[str]]:
    """Run the frontend for ``spec``'s kind. Returns its result, the model it started from (the raw
    torch export or the input ONNX; None for TF/TFLite) and which of the options input_shapes,
    dynamic, inputs and outputs it applied itself."""
    opts = options or ConvertOptions()
    kind = detect_kind(spec)
    _check_applicable(kind, opts)
    if kind in ("python", "torchscript", "torch_export"):
        result, raw = _convert_torch(spec, kind, opts)
        return result, raw, {"input_shapes", "dynamic"}
    if kind == "onnx":
        result, raw = _convert_onnx(spec, opts)
        return result, raw, {"input_shapes", "dynamic", "inputs", "outputs"}
    result, done = _convert_tf(kind, spec, opts)
    return result, None, done
