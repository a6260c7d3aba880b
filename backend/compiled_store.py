"""Compiled models with external data: weights beside the model, and the ORT executable stored ready to open.

A compiled model past ``proto_limit()`` (``zonnx.ir.io``; ``ZONNX_PROTO_LIMIT`` lowers it) or saved with
``external_data=True`` is written as two files, ``NAME.onnx`` and ``NAME.onnx.data``, made in a temporary
folder beside them and renamed into place (data file first):

- each ``NpuSubgraph`` node's ``program`` attribute becomes a TENSOR attribute (UINT8, the same bytes)
  whose data is external; every other tensor of 1 KiB or more is external too;
- the session's lowered ORT model (``lower_npu_nodes`` with ``lower_program``) is written once, at save
  time: its initializers go into the same data file and its light protobuf after them. Metadata
  ``zonnx.executable`` holds ``{"id", "offset", "length", "sha256"}``, where ``id`` is the lowering id
  (lowering version, host integer path, kernels). Opening the model reads the light graph (kilobytes) and
  lets ORT map the weights from the data file, so creating a session costs about what ORT's own costs.
  When the id differs from the current host's (another integer path or kernel library) the session
  lowers the programs instead, as for an inline model.

Every external tensor starts at a multiple of ``ALIGN`` bytes, so ORT can map it. A model under the
limit saved without ``external_data`` is written exactly as before (inline, same bytes).
"""

from __future__ import annotations

__all__ = [
    "ALIGN",
    "EXECUTABLE_KEY",
    "lowering_id",
    "lowered_model",
    "needs_external",
    "save_compiled",
    "split_executable",
    "stored_executable",
]

import functools
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

import onnx
from onnx import helper

from zonnx.backend.compiled import META_PREFIX, NPU_DOMAIN, NPU_OP, compiled_info, lower_npu_nodes
from zonnx.backend.native import NativeStatus, choose_kernels
from zonnx.backend.runtime.ort_lowering import LOWERING_VERSION, lower_program
from zonnx.errors import ModelLoadError, ModelSaveError
from zonnx.faults import kill_point
from zonnx.hostcpu import int_path
from zonnx.ir.io import (
    EXTERNAL_DATA_THRESHOLD,
    MAX_IR_VERSION,
    current_umask,
    proto_limit,
    sweep_stale_temporaries,
    tensor_bytes,
    write_failure,
)
from zonnx.verify import exact_integer_form

logger = logging.getLogger(__name__)

#: External tensors start at multiples of this (the page size ORT maps with).
ALIGN = 4096
#: Tensors smaller than this stay inline.
_MIN_EXTERNAL = 1024
EXECUTABLE_KEY = META_PREFIX + "executable"


def lowering_id(native: NativeStatus | None = None) -> str:
    """Identifies a lowered model: the lowering's version, the host's integer path (``zonnx.hostcpu``) and
    the kernels it needs (the native library's identity, or the pure-ONNX lowering)."""
    kernels = native.identity if native is not None else "onnx"
    return f"{LOWERING_VERSION}-{int_path()}-{kernels}"


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)


def lowered_model(compiled: onnx.ModelProto, native: NativeStatus | None) -> onnx.ModelProto:
    """The ORT model a session runs for ``compiled`` (``native``: the kernel library, or None for pure
    ONNX), in the exact integer form of this host (``verify.exact_integer_form`` on u8u8 hosts)."""
    lower = functools.partial(lower_program, native=native is not None and native.available)
    out = lower_npu_nodes(compiled, lower, opset=_opset(compiled))
    return exact_integer_form(out) if int_path() == "u8u8" else out


class _DataWriter:
    """Appends tensors to one external-data file at ``ALIGN``-aligned offsets."""

    def __init__(self, f: BinaryIO, location: str) -> None:
        self.f, self.location, self.offset = f, location, 0

    def append(self, data: bytes) -> tuple[int, int]:
        """Write ``data`` at the next aligned offset; returns (offset, length)."""
        pad = -self.offset % ALIGN
        if pad:
            self.f.write(b"\0" * pad)
        start = self.offset + pad
        self.f.write(data)
        self.offset = start + len(data)
        return start, len(data)

    def externalize(self, tensor: onnx.TensorProto) -> None:
        """Move the tensor's bytes into the file; the tensor keeps only its reference."""
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            return
        if not tensor.HasField("raw_data"):  # typed fields (float_data, ...): the same values as raw bytes
            arr = onnx.numpy_helper.to_array(tensor)
            tensor.CopyFrom(onnx.numpy_helper.from_array(arr, tensor.name))
        offset, length = self.append(tensor.raw_data)
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        del tensor.external_data[:]
        for key, value in (("location", self.location), ("offset", offset), ("length", length)):
            tensor.external_data.add(key=key, value=str(value))


def _externalize_model(model: onnx.ModelProto, writer: _DataWriter) -> None:
    """Every tensor of 1 KiB or more, and every NPU program, of ``model`` (changed in place) to the file."""
    for node in model.graph.node:
        if node.op_type != NPU_OP or node.domain != NPU_DOMAIN:
            continue
        for i, attr in enumerate(node.attribute):
            if attr.name == "program" and attr.type == onnx.AttributeProto.STRING:
                blob = attr.s
                tensor = onnx.TensorProto(name=f"{node.name}/program", data_type=onnx.TensorProto.UINT8)
                tensor.dims.append(len(blob))
                tensor.raw_data = blob
                node.attribute[i].CopyFrom(helper.make_attribute("program", tensor))
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if tensor.ByteSize() >= _MIN_EXTERNAL:
            writer.externalize(tensor)


def _externalize_executable(exe: onnx.ModelProto, writer: _DataWriter) -> None:
    """A lowered model (changed in place) for the pinned ORT: IR version capped, and its initializers of
    1 KiB or more moved to ``ALIGN``-aligned offsets of the writer's file."""
    exe.ir_version = min(exe.ir_version, MAX_IR_VERSION)
    for tensor in exe.graph.initializer:
        if tensor.ByteSize() >= _MIN_EXTERNAL:
            writer.externalize(tensor)


def split_executable(exe: onnx.ModelProto, location: str) -> tuple[bytes, bytes]:
    """(light protobuf, data) of a lowered model (``_externalize_executable``), whose light graph names the
    data ``location`` (ORT maps it from the file of that name in the folder it is told); ``exe`` is not
    changed."""
    light = onnx.ModelProto()
    light.CopyFrom(exe)
    buf = io.BytesIO()
    _externalize_executable(light, _DataWriter(buf, location))
    return light.SerializeToString(), buf.getvalue()


def needs_external(model: onnx.ModelProto) -> bool:
    """Whether a compiled model must be saved with external data (its tensors and programs pass the limit)."""
    programs = sum(
        len(a.s) for n in model.graph.node if n.op_type == NPU_OP for a in n.attribute if a.name == "program"
    )
    return tensor_bytes(model) + programs > min(EXTERNAL_DATA_THRESHOLD, proto_limit())


def save_compiled(
    model: onnx.ModelProto, path: str | os.PathLike[str], *, external_data: bool | None = None
) -> Path:
    """Write a compiled model with its weights in ``NAME.onnx.data`` and its stored executable (module
    docstring), atomically; ``model`` is not changed. Nothing is left at ``path`` when writing fails."""
    out = Path(path)
    folder = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        raise ModelSaveError(f"{out}: is a directory; give a file name such as {out / 'model.onnx'}.")
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise ModelSaveError(
            f"{out}: folder {folder} does not exist or is not writable; choose another path."
        )
    data_name = out.name + ".data"
    sweep_stale_temporaries(folder, out.name)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out.name}.zonnx-{os.getpid()}.", dir=folder))
    try:
        light = onnx.ModelProto()
        light.CopyFrom(model)
        light.ir_version = min(light.ir_version, MAX_IR_VERSION)
        native = choose_kernels("auto")
        with open(tmp_dir / data_name, "wb") as f:
            writer = _DataWriter(f, data_name)
            _externalize_model(light, writer)
            exe = lowered_model(model, native)
            _externalize_executable(exe, writer)
            exe_bytes = exe.SerializeToString()
            del exe
            offset, length = writer.append(exe_bytes)
            f.flush()
            kill_point("save-model", out.name)
        entry = {"id": lowering_id(native if native.available else None), "location": data_name,
                 "offset": offset, "length": length, "sha256": hashlib.sha256(exe_bytes).hexdigest()}  # fmt: skip
        props = [p for p in light.metadata_props if p.key != EXECUTABLE_KEY]
        del light.metadata_props[:]
        light.metadata_props.extend(props)
        light.metadata_props.add(key=EXECUTABLE_KEY, value=json.dumps(entry, sort_keys=True))
        (tmp_dir / out.name).write_bytes(light.SerializeToString())
        for name in (data_name, out.name):
            os.chmod(tmp_dir / name, 0o666 & ~current_umask())
        os.replace(tmp_dir / data_name, folder / data_name)
        os.replace(tmp_dir / out.name, out)
    except (OSError, ValueError) as e:
        raise write_failure(out, e) from None
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    logger.info("saved %s with external data %s (stored executable %s)", out, data_name, entry["id"])
    return out


def stored_executable(model: onnx.ModelProto, folder: Path, native: NativeStatus | None) -> bytes | None:
    """The stored executable's light protobuf when it was lowered for this host's ``lowering_id``; None
    when the model has none or it is for another host. A missing, short or altered one is a
    ModelLoadError naming the data file."""
    text = compiled_info(model).get("executable")
    if not text:
        return None
    entry = json.loads(text)
    want = lowering_id(native)
    if entry.get("id") != want:
        logger.info(
            "stored executable is for %s, this host needs %s; lowering the programs", entry.get("id"), want
        )
        return None
    path = folder / str(entry.get("location", ""))
    try:
        with open(path, "rb") as f:
            f.seek(int(entry["offset"]))
            data = f.read(int(entry["length"]))
    except OSError as e:
        raise ModelLoadError(f"{path}: the compiled model's data file cannot be read ({e.strerror}); "
                             "copy it beside the model.") from None  # fmt: skip
    if len(data) != int(entry["length"]) or hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ModelLoadError(
            f"{path}: the stored executable is truncated or altered; copy the complete data file beside the "
            "model, or compile it again."
        )
    return data
