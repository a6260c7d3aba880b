"""TFLite frontend: float and quantized ``.tflite`` files to clean ONNX through tf2onnx's TFLite path.

Rules:

- A quantized (int8/uint8) TFLite model becomes QDQ ONNX: QuantizeLinear/DequantizeLinear around
  float ops with TFLite's scales and zero points (per-channel weights keep their ``axis``); integer
  inputs and outputs stay integer.
- **Names**: with exactly one signature (TF's converter writes ``serving_default``), the ONNX inputs
  and outputs are named by its keys (``image``, ``output_0``); otherwise by the TFLite tensor names
  without the ``:0`` suffix. tf2onnx's ``unk__N`` dimensions become ``batch``/``<input>_d<axis>``.
- **Check**: the TFLite interpreter (``ai_edge_litert`` when installed, else ``tf.lite.Interpreter``)
  and ONNX Runtime run the same inputs (``check_inputs``, or generated: normal floats, integers
  uniform over their type's range, batch 1). Integer outputs must agree within ``max_lsb`` codes,
  float outputs reach cosine >= ``min_cosine``.
- tf2onnx needs TensorFlow installed even for TFLite input (``pip install zonnx[tf]``).
"""

from __future__ import annotations

__all__ = ["TFLITE_IDENTIFIER", "from_tflite"]

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from zonnx.converters.common import DEFAULT_MIN_COSINE, ConversionError, ConversionResult, SourceInfo
from zonnx.converters.tf_support import (
    CHECK_SAMPLES,
    CUSTOM_OP_DOMAIN,
    FLOAT_FALLBACK,
    TF2ONNX_MAX_OPSET,
    convert_options,
    finish_and_check,
    name_dynamic_dims,
    native_stderr_silenced,
    quiet_tf,
    raise_if_unsupported,
    require_tf,
)
from zonnx.errors import first_line
from zonnx.verify import input_specs

logger = logging.getLogger(__name__)

#: FlatBuffer file identifier of TFLite models (bytes 4..8).
TFLITE_IDENTIFIER = b"TFL3"
_INTEGER = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16)


def _validate(path: Path) -> None:
    if not path.exists():
        raise ConversionError(f"{path}: no such file; check the path.")
    if path.is_dir():
        raise ConversionError(f"{path}: is a folder, not a .tflite file.")
    head = path.read_bytes()[:8]
    if len(head) < 8 or head[4:8] != TFLITE_IDENTIFIER:
        raise ConversionError(
            f"{path}: not a TFLite model (no {TFLITE_IDENTIFIER.decode()} flatbuffer identifier): the file is "
            "corrupt or of another format; re-export it with tf.lite.TFLiteConverter."
        )


def _verify(path: Path) -> None:
    """Read the whole flatbuffer in Python and check every index it holds, so a corrupt file fails
    here: TFLite's interpreter does not verify files and crashes the process on a truncated one."""
    require_tf()
    from tensorflow.lite.python import schema_py_generated as schema

    data = path.read_bytes()
    try:
        model = schema.ModelT.InitFromObj(schema.Model.GetRootAs(data, 0))
    except Exception as e:  # struct.error, IndexError, UnicodeDecodeError... from reading past the end
        raise ConversionError(
            f"{path}: the TFLite file is corrupt or truncated ({first_line(e)}); re-export it."
        ) from None
    problems = []
    n_buffers, n_codes = len(model.buffers or []), len(model.operatorCodes or [])
    for b in model.buffers or []:
        if b.offset > 1 and b.offset + b.size > len(data):
            problems.append(f"a buffer ends at byte {b.offset + b.size} past the end ({len(data)})")
    for i, g in enumerate(model.subgraphs or []):
        n_tensors = len(g.tensors or [])
        indices = [*(g.inputs if g.inputs is not None else []), *(g.outputs if g.outputs is not None else [])]
        for op in g.operators or []:
            if not 0 <= op.opcodeIndex < n_codes:
                problems.append(f"subgraph {i}: operator code {op.opcodeIndex} out of range")
            indices += [
                *(op.inputs if op.inputs is not None else []),
                *(op.outputs if op.outputs is not None else []),
            ]
        if any(not -1 <= int(t) < n_tensors for t in indices):
            problems.append(f"subgraph {i}: a tensor index is out of range (it has {n_tensors} tensors)")
        if any(not 0 <= t.buffer < max(n_buffers, 1) for t in g.tensors or []):
            problems.append(f"subgraph {i}: a tensor refers to a missing buffer")
    if not model.subgraphs or problems:
        reason = problems[0] if problems else "it has no subgraph"
        raise ConversionError(f"{path}: the TFLite file is corrupt ({reason}); re-export it.")


def _interpreter(path: Path) -> Any:
    """A TFLite interpreter with tensors allocated; a corrupt file becomes ConversionError."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        tf, _ = require_tf()
        Interpreter = tf.lite.Interpreter  # noqa: N806  (deprecated in TF 2.20+, still exact)
    try:
        with quiet_tf(), native_stderr_silenced():
            interp = Interpreter(model_path=str(path))
            interp.allocate_tensors()
    except Exception as e:  # the interpreter raises ValueError/RuntimeError for bad flatbuffers
        raise ConversionError(f"{path}: the TFLite interpreter cannot load it ({first_line(e)}).") from None
    return interp


def _io_names(interp: Any) -> dict[str, str]:
    """TFLite tensor name -> ONNX name (signature keys, else the tensor name without ``:0``)."""
    details = [*interp.get_input_details(), *interp.get_output_details()]
    names = {d["name"]: d["name"].removesuffix(":0") for d in details}
    signatures = interp.get_signature_list()
    if len(signatures) == 1:
        with native_stderr_silenced():  # the runner applies XNNPACK, which announces itself
            runner = interp.get_signature_runner(next(iter(signatures)))
        for key, d in [*runner.get_input_details().items(), *runner.get_output_details().items()]:
            names[d["name"]] = key
    return names


def _rename(graph: onnx.GraphProto, mapping: Mapping[str, str]) -> None:
    """Rename values everywhere they occur, subgraphs (which may read outer names) included."""
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        vi.name = mapping.get(vi.name, vi.name)
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                _rename(sub, mapping)


def _generated_feeds(model: onnx.ModelProto, n: int) -> list[dict[str, np.ndarray]]:
    """Normal floats; integers uniform over their type's full range (what an int8 input holds)."""
    rng = np.random.default_rng(0)
    feeds = []
    for _ in range(n):
        sample = {}
        for spec in input_specs(model):
            if spec.dtype.kind in "iu":
                info = np.iinfo(spec.dtype)
                sample[spec.name] = rng.integers(info.min, info.max, spec.shape, endpoint=True).astype(
                    spec.dtype
                )
            else:
                sample[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
        feeds.append(sample)
    return feeds


def _runner(interp: Any, names: Mapping[str, str]) -> Any:
    """source_run for the check: feed by ONNX name, return outputs by ONNX name."""
    inputs = {names[d["name"]]: d for d in interp.get_input_details()}
    outputs = {names[d["name"]]: d["index"] for d in interp.get_output_details()}

    def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        current = {d["index"]: tuple(d["shape"]) for d in interp.get_input_details()}
        resize = [
            (d["index"], feeds[n].shape) for n, d in inputs.items() if current[d["index"]] != feeds[n].shape
        ]
        for index, shape in resize:
            interp.resize_tensor_input(index, list(shape))
        if resize:
            interp.allocate_tensors()
        for name, detail in inputs.items():
            interp.set_tensor(detail["index"], np.ascontiguousarray(feeds[name], dtype=detail["dtype"]))
        with native_stderr_silenced():  # XNNPACK announces itself on the first invoke
            interp.invoke()
        return {name: interp.get_tensor(index).copy() for name, index in outputs.items()}

    return run


def from_tflite(
    path: str | os.PathLike[str],
    *,
    opset: int = 17,
    check: bool = True,
    check_inputs: Sequence[Mapping[str, np.ndarray]] | None = None,
    min_cosine: float = DEFAULT_MIN_COSINE,
    max_lsb: int = 1,
    custom_ops: Sequence[str] = (),
) -> ConversionResult:
    """Convert a ``.tflite`` file to clean (QDQ when quantized) ONNX and check it against the TFLite
    interpreter, following the module rules. Raises ConversionError with one clear message."""
    p = Path(path)
    _validate(p)
    tf, tf2onnx = require_tf()
    _verify(p)
    extra = [tf2onnx.utils.make_opsetid(CUSTOM_OP_DOMAIN, 1)] if custom_ops else None
    try:
        with quiet_tf(), native_stderr_silenced():  # tf2onnx runs an interpreter too
            proto, _ = tf2onnx.convert.from_tflite(
                str(p),
                opset=min(opset, TF2ONNX_MAX_OPSET),
                custom_ops=dict.fromkeys(custom_ops, CUSTOM_OP_DOMAIN) or None,
                extra_opset=extra,
            )
    except Exception as e:  # tf2onnx raises many unrelated types on odd flatbuffers
        raise ConversionError(f"{p}: tf2onnx could not convert the TFLite model: {first_line(e)}") from None
    quantized = any(vi.type.tensor_type.elem_type in _INTEGER for vi in proto.graph.input)
    fallback = "convert the float .tflite model instead (a float fallback)" if quantized else FLOAT_FALLBACK
    raise_if_unsupported(proto, str(p), fallback)
    interp = _interpreter(p)
    names = _io_names(interp)
    _rename(proto.graph, names)
    name_dynamic_dims(proto, None)
    in_names = [names[d["name"]] for d in interp.get_input_details()]
    out_names = [names[d["name"]] for d in interp.get_output_details()]
    options = {**convert_options(tf2onnx, tf, opset, None, None, None, custom_ops), "max_lsb": max_lsb}
    info = SourceInfo(str(p), "tflite", tf.__version__, options)
    feeds = list(check_inputs) if check_inputs else None
    if check and feeds is None:
        cleaned_inputs = onnx.ModelProto()
        cleaned_inputs.graph.input.extend(proto.graph.input)
        feeds = _generated_feeds(cleaned_inputs, CHECK_SAMPLES)
    return finish_and_check(
        proto,
        info,
        opset=opset,
        in_names=in_names,
        out_names=out_names,
        source_run=_runner(interp, names),
        check=check,
        check_inputs=feeds,
        min_cosine=min_cosine,
        custom_ops=custom_ops,
        max_lsb=max_lsb,
    )
