"""Models past 2 GiB: copy, identify and run them without serializing them into one protobuf.

Protobuf cannot serialize a message of 2 GiB or more, so a model whose tensors exceed ``proto_limit()``
(``zonnx.ir.io``) is never turned into bytes whole: copies use ``CopyFrom``; its digest hashes the graph
without tensor data, then each tensor's bytes; ORT sessions get its large initializers as OrtValues
(``SessionOptions.add_external_initializers``) next to a light graph that declares them external.
"""

from __future__ import annotations

__all__ = ["is_large", "copy_model", "model_digest", "ort_session"]

import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
import onnx.external_data_helper

from zonnx.ir.io import external_data_locations, proto_limit, tensor_bytes

logger = logging.getLogger(__name__)


def is_large(model: onnx.ModelProto) -> bool:
    """Whether the model's tensors exceed ``proto_limit()``: it must not be serialized as one protobuf."""
    return tensor_bytes(model) > proto_limit()


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy that never serializes (works past 2 GiB)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


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


def ort_session(model: onnx.ModelProto, options: Any = None, providers: Sequence[Any] | None = None) -> Any:
    """An onnxruntime session for ``model`` that never serializes it whole: past ``proto_limit()`` its
    initializers of 1 KiB or more are declared external and handed to ORT as OrtValues
    (``SessionOptions.add_external_initializers``), so no 2 GiB protobuf is built and nothing is written."""
    import onnxruntime as ort

    opts = options or ort.SessionOptions()
    providers = list(providers or ["CPUExecutionProvider"])
    if not is_large(model):
        return ort.InferenceSession(model.SerializeToString(), opts, providers=providers)
    light = onnx.ModelProto()
    light.CopyFrom(model)
    del light.graph.initializer[:]
    names, values = [], []
    for init in model.graph.initializer:
        if init.ByteSize() >= 1024 and init.data_location != onnx.TensorProto.EXTERNAL:
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
    opts.add_session_config_entry("session.disable_prepacking", "1")  # no packed second copy of the weights
    sess = ort.InferenceSession(light.SerializeToString(), opts, providers=providers)
    sess._zonnx_weights = values  # the OrtValues must outlive the session
    return sess
