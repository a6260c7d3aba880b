"""What the TensorFlow frontends share: lazy TF/tf2onnx import with the install hint, quiet logs,
unconverted-op errors, input shapes and dimension names, and the finish-and-check tail."""

from __future__ import annotations

__all__ = [
    "TF_INSTALL_HINT",
    "TF2ONNX_MAX_OPSET",
    "CUSTOM_OP_DOMAIN",
    "CHECK_SAMPLES",
    "FLOAT_FALLBACK",
    "require_tf",
    "quiet_tf",
    "native_stderr_silenced",
    "unsupported_ops",
    "raise_if_unsupported",
    "fix_shape",
    "name_dynamic_dims",
    "tensor_specs",
    "convert_function",
    "finish_and_check",
    "convert_options",
]

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import onnx

from zonnx.converters.common import (
    ConversionError,
    ConversionResult,
    SourceInfo,
    check_against_source,
    finish,
)
from zonnx.errors import OptionError, did_you_mean, first_line
from zonnx.verify import make_inputs

logger = logging.getLogger(__name__)

TF_INSTALL_HINT = "TensorFlow frontends need `pip install zonnx[tf]`"
#: tf2onnx 1.17 refuses opset 19 and newer.
TF2ONNX_MAX_OPSET = 18
#: Domain tf2onnx gives ops kept with ``custom_ops`` (its ``--custom-ops`` default).
CUSTOM_OP_DOMAIN = "ai.onnx.converters.tensorflow"
#: Generated samples for the numeric check when the caller gives none.
CHECK_SAMPLES = 3
#: What a TF model with an unconvertible op can do instead of keeping it as a custom op.
FLOAT_FALLBACK = "rewrite that part of the model with ops that convert (a float fallback)"
_NOISY_LOGGERS = ("tf2onnx", "tensorflow", "absl", "keras")


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for the block: TensorFlow's and TFLite's C++ code print notices
    (oneDNN, "Created TensorFlow Lite XNNPACK delegate") that no log level filters; failures still
    arrive as Python exceptions."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def require_tf() -> tuple[ModuleType, ModuleType]:
    """Import TensorFlow and tf2onnx without their start-up notices on stderr.

    Raises ConversionError with the install hint when either is missing.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        with native_stderr_silenced():  # absl prints oneDNN notices before any log level applies
            import tensorflow as tf
        import tf2onnx
        import tf2onnx.convert  # noqa: F401  (loads the submodule used below)
    except ImportError as e:
        missing = e.name or str(e)
        raise ConversionError(f"{TF_INSTALL_HINT} ({missing} is not installed).") from None
    return tf, tf2onnx


@contextlib.contextmanager
def quiet_tf() -> Iterator[None]:
    """Silence TF/tf2onnx/Keras Python logs and warnings while converting (errors reach the user as
    ConversionError instead); the previous levels are restored afterwards."""
    saved = {name: logging.getLogger(name).level for name in _NOISY_LOGGERS}
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def unsupported_ops(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes tf2onnx left in the default domain under their TensorFlow name (no ONNX schema exists)."""
    return [n for n in model.graph.node if n.domain in ("", "ai.onnx") and not onnx.defs.has(n.op_type)]


def raise_if_unsupported(model: onnx.ModelProto, where: str, fallback: str) -> None:
    """ConversionError naming each op tf2onnx could not convert (first node of each), with the way out."""
    first: dict[str, str] = {}
    for node in unsupported_ops(model):
        first.setdefault(node.op_type, node.name)
    if not first:
        return
    import tf2onnx

    ops = ", ".join(f"{op} (node {name!r})" for op, name in first.items())
    names = ",".join(first)
    raise ConversionError(
        f"{where}: TensorFlow op(s) {ops} have no ONNX conversion in tf2onnx {tf2onnx.__version__}; keep "
        f"them as custom ops with --custom-ops {names} (custom_ops=[...]) for a runtime that implements "
        f"them, or {fallback}."
    )


def fix_shape(
    name: str, declared: Sequence[int | None], given: Sequence[int | str]
) -> tuple[int | None, ...]:
    """``given`` (a string names a dynamic dimension: None here) when it has the declared rank and keeps
    every fixed dimension; else OptionError."""
    text = ",".join(map(str, given))
    shape = tuple(None if isinstance(d, str) else int(d) for d in given)
    if len(shape) != len(declared) or any(
        d is not None and d != s for d, s in zip(declared, shape, strict=False)
    ):
        want = ",".join("?" if d is None else str(d) for d in declared)
        raise OptionError(
            f"input shape {name}:{text} does not fit the model's input {name!r} [{want}]; give one size "
            "per dimension and keep the fixed ones."
        )
    if any(s is not None and s <= 0 for s in shape):
        raise OptionError(f"input shape {name}:{text}: every size must be positive (or a name).")
    return shape


def name_dynamic_dims(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int | str]] | None) -> None:
    """Replace tf2onnx's ``unk__N`` dimension names, everywhere they occur, by readable ones.

    An input's dynamic dimension takes the name given in ``input_shapes`` (a string entry), else
    ``batch`` for axis 0 (``<input>_batch`` when there are several inputs) and ``<input>_d<axis>``.
    """
    given = dict(input_shapes or {})
    inits = {t.name for t in model.graph.initializer}
    real = [vi for vi in model.graph.input if vi.name not in inits]
    rename: dict[str, str] = {}
    for vi in real:
        for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
            if not dim.dim_param.startswith("unk__") or dim.dim_param in rename:
                continue
            entry = list(given.get(vi.name, ()))
            if axis < len(entry) and isinstance(entry[axis], str):
                rename[dim.dim_param] = entry[axis]
            elif axis == 0:
                rename[dim.dim_param] = "batch" if len(real) == 1 else f"{vi.name}_batch"
            else:
                rename[dim.dim_param] = f"{vi.name}_d{axis}"
    for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for dim in vi.type.tensor_type.shape.dim:
            if dim.dim_param in rename:
                dim.dim_param = rename[dim.dim_param]


def tensor_specs(
    tf: ModuleType,
    inputs: Sequence[tuple[str, Sequence[int | None], Any]],
    input_shapes: Mapping[str, Sequence[int | str]] | None,
) -> list[Any]:
    """TensorSpecs named like the source inputs, with ``input_shapes`` applied."""
    shapes = dict(input_shapes or {})
    names = [n for n, _, _ in inputs]
    for name in shapes:
        if name not in names:
            raise OptionError(
                f"input shape given for {name!r}, but the model's inputs are {names}."
                f"{did_you_mean(name, names)}"
            )
    return [
        tf.TensorSpec(
            fix_shape(name, dims, shapes[name]) if name in shapes else dims, tf.as_dtype(dtype), name=name
        )
        for name, dims, dtype in inputs
    ]


def convert_function(
    fn: Any,
    specs: list[Any],
    where: str,
    opset: int,
    custom_ops: Sequence[str],
    input_shapes: Mapping[str, Sequence[int | str]] | None,
    output_names: Sequence[str],
    fallback: str = FLOAT_FALLBACK,
) -> onnx.ModelProto:
    """tf2onnx.convert.from_function with our error handling; returns the raw tf2onnx model with its
    outputs in ``output_names`` order (tf2onnx sorts a function's dict outputs by key)."""
    tf, tf2onnx = require_tf()
    extra = [tf2onnx.utils.make_opsetid(CUSTOM_OP_DOMAIN, 1)] if custom_ops else None
    try:
        with quiet_tf():
            proto, _ = tf2onnx.convert.from_function(
                fn,
                input_signature=specs,
                opset=min(opset, TF2ONNX_MAX_OPSET),
                custom_ops=dict.fromkeys(custom_ops, CUSTOM_OP_DOMAIN) or None,
                extra_opset=extra,
            )
    except Exception as e:  # tf2onnx and TF raise many unrelated types
        raise ConversionError(f"{where}: tf2onnx could not convert the model: {first_line(e)}") from None
    raise_if_unsupported(proto, where, fallback)
    name_dynamic_dims(proto, input_shapes)
    by_name = {o.name: o for o in proto.graph.output}
    if set(by_name) == set(output_names):
        ordered = [onnx.ValueInfoProto.FromString(by_name[n].SerializeToString()) for n in output_names]
        del proto.graph.output[:]
        proto.graph.output.extend(ordered)
    return proto


def _generated_feeds(model: onnx.ModelProto, n: int) -> list[dict[str, np.ndarray]]:
    return [make_inputs(model, seed=i) for i in range(n)]


def finish_and_check(
    proto: onnx.ModelProto,
    info: SourceInfo,
    *,
    opset: int,
    in_names: list[str],
    out_names: list[str],
    source_run: Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]],
    check: bool,
    check_inputs: Sequence[Mapping[str, np.ndarray]] | None,
    min_cosine: float,
    custom_ops: Sequence[str],
    max_lsb: int | None = 1,
) -> ConversionResult:
    """The shared tail: clean pipeline and metadata, then the numeric check against TensorFlow
    (``check_inputs``, else CHECK_SAMPLES generated by ``verify.make_inputs``)."""
    cleaned = finish(proto, info, opset=opset, input_names=in_names, output_names=out_names)
    checks = []
    if check:
        if custom_ops:
            raise ConversionError(
                f"{info.source}: the converted model keeps custom op(s) {', '.join(custom_ops)} that onnxruntime "
                "cannot run, so it cannot be checked; convert with check=False (--no-check)."
            )
        feeds = list(check_inputs) if check_inputs else _generated_feeds(cleaned, CHECK_SAMPLES)
        checks = check_against_source(cleaned, source_run, feeds, min_cosine=min_cosine, max_lsb=max_lsb)
        logger.info("%s: worst cosine %.8f", info.source, min(c.cosine for c in checks))
    return ConversionResult(cleaned, checks, info)


def convert_options(
    tf2onnx: ModuleType,
    tf: ModuleType,
    opset: int,
    input_shapes: Any,
    inputs: Any,
    outputs: Any,
    custom_ops: Sequence[str],
) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "converter": f"tf2onnx {tf2onnx.__version__}",
        "tensorflow": tf.__version__,
        "opset": opset,
    }
    for key, value in (
        ("input_shapes", input_shapes),
        ("inputs", inputs),
        ("outputs", outputs),
        ("custom_ops", list(custom_ops) or None),
    ):
        if value is not None:
            opts[key] = {k: list(v) for k, v in value.items()} if isinstance(value, Mapping) else list(value)
    return opts
