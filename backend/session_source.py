"""Reading the model an ``InferenceSession`` is given: its bytes (the cache key is their sha256), external
data included, and its parse, each failure one ModelLoadError naming the file and the fix."""

from __future__ import annotations

__all__ = ["parse_source", "read_source"]

import contextlib
from pathlib import Path
from typing import Any

import onnx

from zonnx.backend.compiled_store import EXECUTABLE_KEY
from zonnx.errors import ModelLoadError
from zonnx.ir.io import check_external_files, check_structure, external_data_locations, load_proto
from zonnx.ir.large import EXTERNAL_ROOT


def _refuse_external_bytes(model: onnx.ModelProto) -> None:
    """A model given as bytes or a proto has no folder: tensors it keeps in external data cannot be found,
    so it must be opened by its path (ModelLoadError naming the data file and the fix)."""
    refs = sorted(
        loc
        for loc in external_data_locations(model)
        if not Path(loc).is_file() and not (Path(EXTERNAL_ROOT) / loc).is_file()  # lazily loaded models
    )
    if refs:
        raise ModelLoadError(
            f"the model was given as bytes but keeps tensors in external data ({', '.join(refs)}), which "
            "has no folder to be read from; open it by its path: InferenceSession('DIR/MODEL.onnx')."
        )


def read_source(path_or_bytes: Any) -> tuple[bytes, str]:
    """The model's bytes and how to name it in messages: bytes or a proto as given (refused when they keep
    tensors in external data), a path's file read whole; a path whose model keeps weights in external
    data is read with them (so the cache key covers them), except a compiled model saved with its
    stored executable, whose weights stay on disk (``compiled_store``)."""
    if isinstance(path_or_bytes, bytes | bytearray):
        light = onnx.ModelProto()
        with contextlib.suppress(Exception):  # not parseable: parse_source says so in one line
            light.ParseFromString(bytes(path_or_bytes))
        _refuse_external_bytes(light)
        return bytes(path_or_bytes), "model"
    if isinstance(path_or_bytes, onnx.ModelProto):
        _refuse_external_bytes(path_or_bytes)
        return path_or_bytes.SerializeToString(), "model"
    path = Path(path_or_bytes)
    if not path.is_file():
        load_proto(path)  # raises the ModelLoadError that names the problem
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot be read ({e.strerror}).") from None
    if b"location" not in data:  # every external-data reference holds the key "location": none here
        return data, str(path)
    try:
        light = onnx.load_from_string(data)
        refs = external_data_locations(light)
    except Exception:  # noqa: BLE001 - not parseable: _parse says so in one line
        light, refs = None, set()
    if refs and light is not None and EXECUTABLE_KEY in {p.key for p in light.metadata_props}:
        check_external_files(light, path.parent, str(path))  # a compiled model saved with external data:
        return data, str(path)  # its weights stay on disk (compiled_store)
    if refs:  # weights beside the model (missing ones named by load_proto): read them too, so the cache
        return load_proto(path).SerializeToString(), str(path)  # key covers them and ORT finds them
    return data, str(path)


def parse_source(data: bytes, where: str) -> onnx.ModelProto:
    """The ModelProto of ``data``, structurally checked; a ModelLoadError naming ``where`` otherwise."""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:  # protobuf DecodeError
        raise ModelLoadError(f"{where}: not a valid ONNX model (the protobuf does not parse).") from None
    if not model.HasField("graph"):
        raise ModelLoadError(f"{where}: not an ONNX model (no graph).")
    check_structure(model, where, order=True)
    return model
