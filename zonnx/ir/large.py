"""Models past 2 GiB: copy, identify and run them without serializing them into one protobuf.

Protobuf cannot serialize a message of 2 GiB or more, so a model whose tensors exceed ``proto_limit()``
(``zonnx.ir.io``) is never turned into bytes whole: copies use ``CopyFrom``; its digest hashes the graph
without tensor data, then each tensor's bytes; ORT sessions get its large initializers as OrtValues
(``SessionOptions.add_external_initializers``) next to a light graph that declares them external.

A model file whose external data exceeds ``proto_limit()`` is not read at all (``load_mapped``): its
tensors stay onnx-ir ``ExternalTensor``s, memory-mapped from their files when a pass reads them, so no
float copy of the weights is made. Their locations are rewritten relative to ``EXTERNAL_ROOT`` (the
filesystem root: ORT refuses absolute locations), so any protobuf serialized from that model names its
files completely; ``session_folder`` points an ORT session at that root, and ORT maps the files itself.
Such a protobuf is never saved as is: ``materialize`` reads what is still external before writing.
"""

from __future__ import annotations

__all__ = [
    "EXTERNAL_ROOT",
    "FOLDER_KEY",
    "is_large",
    "check_model",
    "copy_model",
    "load_mapped",
    "load_whole_or_mapped",
    "materialize",
    "whole_proto",
    "release_mapped",
    "rooted",
    "deserialize",
    "external_tensors",
    "model_digest",
    "ort_session",
    "session_folder",
]

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.external_data_helper
import onnx_ir as ir

from zonnx.errors import ModelLoadError
from zonnx.ir.io import (
    check_external_files,
    check_external_sizes,
    external_data_locations,
    load_external,
    load_proto,
    proto_limit,
    tensor_bytes,
    to_ir,
    to_proto,
)

logger = logging.getLogger(__name__)


def is_large(model: onnx.ModelProto) -> bool:
    """Whether the model's tensors exceed ``proto_limit()``: it must not be serialized as one protobuf."""
    return tensor_bytes(model) > proto_limit()


def _checker_view(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without its initializers' data: each initializer of 1 KiB or more (or external) becomes a
    graph input of the same type and shape, which onnx.checker validates alike (IR >= 4)."""
    light = onnx.ModelProto()
    _copy_fields(model, light, "graph")
    _copy_fields(model.graph, light.graph, "initializer")
    inputs = {i.name for i in light.graph.input}
    for init in model.graph.initializer:
        if onnx.external_data_helper.uses_external_data(init) or _serialized_at_least(init, 1024):
            if init.name not in inputs:
                light.graph.input.append(
                    onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
                )
        else:
            light.graph.initializer.append(init)
    return light


def check_model(model: onnx.ModelProto, *, full_check: bool = False) -> None:
    """``onnx.checker.check_model`` that works past 2 GiB: a model over ``proto_limit()``, or with external
    tensors (a lazily loaded model names them from ``EXTERNAL_ROOT``, which the checker would resolve from
    the working folder), is checked without its weights' bytes (``_checker_view``), so it is never
    serialized whole; onnx's errors pass through."""
    light = is_large(model) or bool(_external(model))
    onnx.checker.check_model(_checker_view(model) if light else model, full_check=full_check)


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy that never serializes (works past 2 GiB)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


#: Lazily loaded models name their external files relative to this folder (module docstring).
EXTERNAL_ROOT = "/"
#: ORT's session option: the folder external data of a model given as bytes is read from.
FOLDER_KEY = "session.model_external_initializers_file_folder_path"


def _external(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [
        t
        for t in onnx.external_data_helper._get_all_tensors(model)
        if onnx.external_data_helper.uses_external_data(t)
    ]


def load_mapped(path: str | os.PathLike[str]) -> ir.Model | None:
    """The model at ``path`` with its external tensors left in their files (memory-mapped when read) when
    their bytes exceed ``proto_limit()``; None for a model to load whole (inline, or under the limit).
    A missing or truncated data file is a ModelLoadError naming it and the tensor."""
    model, mapped = load_whole_or_mapped(path, whole=False)
    return model if mapped else None


def load_whole_or_mapped(
    path: str | os.PathLike[str], *, whole: bool = True, skeleton: onnx.ModelProto | None = None
) -> tuple[ir.Model | None, bool]:
    """(model, mapped): as ``load_mapped`` past ``proto_limit()`` (mapped True); otherwise the whole model
    as ``to_ir(path)`` gives it, from the same single read of the file (None when ``whole`` is False).
    ``skeleton``: the file already read without its external data (e.g. checked or edited by the caller;
    it is used, and changed, in place of a second read)."""
    p = Path(path)
    skeleton = skeleton if skeleton is not None else load_proto(p, load_external_data=False)
    external = _external(skeleton)
    total = sum(int(onnx.external_data_helper.ExternalDataInfo(t).length or 0) for t in external)
    if not external or total <= proto_limit():
        if not whole:
            return None, False
        load_external(skeleton, p)
        return to_ir(skeleton), False
    check_external_files(skeleton, p.parent, str(p))
    check_external_sizes(skeleton, p)
    folder = p.resolve().parent
    for t in external:
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = os.path.relpath(folder / entry.value, EXTERNAL_ROOT)
    try:
        model = ir.serde.deserialize_model(skeleton)
    except Exception as e:  # onnx-ir raises several types on malformed graphs
        raise ModelLoadError(f"{p}: its graph is malformed ({e}).") from None
    ir.external_data.set_base_dir(model.graph, EXTERNAL_ROOT)
    logger.info("%s: %.2f GB of external data stays in its files (memory-mapped)", p, total / 1e9)
    return model, True


def external_tensors(model: ir.Model) -> list[ir.ExternalTensor]:
    """The model's initializers that are onnx-ir ``ExternalTensor``s (mapped from their files when read)."""
    return [
        v.const_value
        for v in model.graph.initializers.values()
        if isinstance(v.const_value, ir.ExternalTensor)
    ]


def release_mapped(tensors: list[ir.ExternalTensor]) -> int:
    """Unmap every tensor that no array still views (it maps again when read), so weights a pass has read
    stop counting in the process's memory; returns how many were unmapped."""
    released = 0
    for tensor in tensors:
        if tensor.raw is not None:
            try:
                tensor.release()
                released += 1
            except BufferError:  # an array still views the mapping: it stays until that array goes
                pass
    return released


def whole_proto(model: onnx.ModelProto | ir.Model) -> onnx.ModelProto:
    """``to_proto(model)`` with what a lazily loaded model still names by ``EXTERNAL_ROOT`` read into it
    (``materialize``): the form ``save_model`` writes anywhere, its weights then going to ``NAME.data``."""
    return materialize(to_proto(model))


def materialize(model: onnx.ModelProto) -> onnx.ModelProto:
    """Read the tensors a lazily loaded model still names by ``EXTERNAL_ROOT`` into the model (in place),
    so it can be saved anywhere; other models are returned unchanged."""
    for t in _external(model):
        loc = onnx.external_data_helper.ExternalDataInfo(t).location
        if not os.path.isabs(loc) and (Path(EXTERNAL_ROOT) / loc).is_file():
            onnx.external_data_helper.load_external_data_for_tensor(t, EXTERNAL_ROOT)
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]
    return model


@contextlib.contextmanager
def rooted(model: onnx.ModelProto, folder: Path | None) -> Iterator[onnx.ModelProto]:
    """Within the block, ``model``'s external tensors that live in ``folder`` name their files relative to
    ``EXTERNAL_ROOT``, as a lazily loaded model's do, so ORT sessions map them (``session_folder``); the
    locations are restored after. ``folder`` None changes nothing."""
    changed: list[tuple[onnx.StringStringEntryProto, str]] = []
    if folder is not None:
        for t in _external(model):
            for entry in t.external_data:
                if (
                    entry.key == "location"
                    and not os.path.isabs(entry.value)
                    and (folder / entry.value).is_file()
                ):
                    changed.append((entry, entry.value))
                    entry.value = os.path.relpath(folder.resolve() / entry.value, EXTERNAL_ROOT)
    try:
        yield model
    finally:
        for entry, value in changed:
            entry.value = value


def _names_rooted(model: onnx.ModelProto) -> bool:
    locations = external_data_locations(model)
    return any(not os.path.isabs(loc) and (Path(EXTERNAL_ROOT) / loc).is_file() for loc in locations)


def deserialize(model: onnx.ModelProto) -> ir.Model:
    """``ir.serde.deserialize_model``, with external tensors read from ``EXTERNAL_ROOT`` when the model
    names its files as a lazily loaded model does."""
    out = ir.serde.deserialize_model(model)
    if _names_rooted(model):
        ir.external_data.set_base_dir(out.graph, EXTERNAL_ROOT)
    return out


def session_folder(opts: Any, model: onnx.ModelProto) -> None:
    """Point ORT (``SessionOptions`` ``opts``) at ``EXTERNAL_ROOT`` when ``model`` names external files
    of a lazily loaded model: ORT then maps them itself, and packs no second copy of them."""
    if _names_rooted(model):
        opts.add_session_config_entry(FOLDER_KEY, EXTERNAL_ROOT)
        opts.add_session_config_entry("session.disable_prepacking", "1")


def model_digest(model: onnx.ModelProto | str | os.PathLike[str]) -> str:
    """sha256 identifying a model with its weights: of its bytes when it fits one protobuf, else of the
    graph without tensor data followed by every tensor's name and bytes. For a path, the file's bytes
    and those of every external-data file it refers to (an edited ``.data`` file changes the digest)."""
    h = hashlib.sha256()
    if not isinstance(model, onnx.ModelProto):
        p = Path(model)
        h.update(p.read_bytes())
        skeleton = onnx.load(str(p), load_external_data=False)
        for loc in sorted(external_data_locations(skeleton)):
            h.update(loc.encode())
            with open(p.parent / loc, "rb") as f:
                for block in iter(lambda: f.read(1 << 24), b""):
                    h.update(block)
        return h.hexdigest()
    if not is_large(model):
        return hashlib.sha256(model.SerializeToString()).hexdigest()
    tensors = list(onnx.external_data_helper._get_all_tensors(model))
    saved = [(t.raw_data, t) for t in tensors if t.HasField("raw_data")]
    try:
        for _, t in saved:
            t.ClearField("raw_data")
        h.update(model.SerializeToString())
    finally:
        for raw, t in saved:
            t.raw_data = raw
    for t in tensors:
        h.update(t.name.encode())
        h.update(t.raw_data if t.HasField("raw_data") else t.SerializeToString())
    return h.hexdigest()


#: Tensor types ORT takes as OrtValues from numpy (others, e.g. int4, float8, bfloat16, stay in the graph).
_VALUE_TYPES = frozenset({
    onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.INT8,
    onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16, onnx.TensorProto.INT32,
    onnx.TensorProto.UINT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL,
})  # fmt: skip


def _copy_fields(src: Any, dst: Any, skip: str) -> None:
    """Copy every set field of protobuf message ``src`` into ``dst`` except the field ``skip``."""
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def _serialized_at_least(tensor: onnx.TensorProto, size: int) -> bool:
    """``tensor.ByteSize() >= size``, without serializing a tensor whose raw bytes alone reach ``size``
    (upb's ByteSize copies the whole message)."""
    if tensor.HasField("raw_data"):
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        if int(np.prod(tensor.dims, dtype=np.int64)) * itemsize >= size:  # raw_data holds that many bytes
            return True
    return tensor.ByteSize() >= size


def ort_session(
    model: onnx.ModelProto,
    options: Any = None,
    providers: Sequence[Any] | None = None,
    *,
    weights_as_values: bool = False,
) -> Any:
    """An onnxruntime session for ``model`` that never serializes it whole: past ``proto_limit()`` (or
    always, with ``weights_as_values``: faster for a model of many MB) its initializers of 1 KiB or more
    are declared external and handed to ORT as OrtValues (``SessionOptions.add_external_initializers``),
    so no 2 GiB protobuf is built, the weights are not copied into one, and nothing is written."""
    import onnxruntime as ort

    opts = options or ort.SessionOptions()
    providers = list(providers or ["CPUExecutionProvider"])
    session_folder(opts, model)
    if not weights_as_values and not is_large(model):
        return ort.InferenceSession(model.SerializeToString(), opts, providers=providers)
    light = onnx.ModelProto()  # the model without its initializers (no copy of the weights)
    _copy_fields(model, light, "graph")
    _copy_fields(model.graph, light.graph, "initializer")
    names, values = [], []
    for init in model.graph.initializer:
        if (
            init.data_type in _VALUE_TYPES
            and init.data_location != onnx.TensorProto.EXTERNAL
            and _serialized_at_least(init, 1024)
        ):
            ph = onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims)
            ph.data_location = onnx.TensorProto.EXTERNAL
            ph.external_data.add(key="location", value="zonnx-session-weights")
            light.graph.initializer.append(ph)
            names.append(init.name)
            values.append(ort.OrtValue.ortvalue_from_numpy(onnx.numpy_helper.to_array(init)))
        else:
            light.graph.initializer.append(init)
    if names:
        opts.add_external_initializers(names, values)
    sess = ort.InferenceSession(light.SerializeToString(), opts, providers=providers)
    sess._zonnx_weights = values  # the OrtValues must outlive the session
    return sess
