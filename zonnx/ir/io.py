"""Load any model form with clear errors; save models ORT 1.31 loads, atomically, with external data when large."""

from __future__ import annotations

__all__ = [
    "MAX_IR_VERSION",
    "MIN_OPSET",
    "EXTERNAL_DATA_THRESHOLD",
    "ModelLike",
    "load_proto",
    "load_external",
    "load_model",
    "to_ir",
    "to_proto",
    "save_model",
    "write_bytes_atomic",
    "write_failure",
    "current_umask",
    "external_data_locations",
    "check_external_files",
    "check_external_sizes",
    "check_names",
    "check_single_writers",
    "check_wiring",
    "check_structure",
    "check_tensors",
    "sweep_stale_temporaries",
    "default_opset",
    "PROTO_LIMIT",
    "proto_limit",
    "tensor_bytes",
]

import errno
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TypeAlias

import numpy as np
import onnx
import onnx.external_data_helper
import onnx_ir as ir
from google.protobuf.message import DecodeError

from zonnx.errors import ModelLoadError, ModelSaveError
from zonnx.faults import kill_point
from zonnx.ir.checks import (
    MIN_OPSET,
    check_names,
    check_single_writers,
    check_structure,
    check_tensors,
    check_wiring,
)

logger = logging.getLogger(__name__)

#: onnxruntime 1.31 refuses IR version 14 ("Unsupported model IR version"); every save clamps to this.
MAX_IR_VERSION = 13
#: Above this many bytes of tensor data a model is saved with external data (protobuf's limit is 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1_800_000_000

#: Tensor bytes above which a model is never serialized into one protobuf (protobuf refuses 2 GiB); the
#: graph itself needs room too. ``ZONNX_PROTO_LIMIT`` lowers it (tests force the large-model paths).
PROTO_LIMIT = 2**31 - 2**26

ModelLike: TypeAlias = "str | os.PathLike[str] | onnx.ModelProto | ir.Model"


def default_opset(model: onnx.ModelProto | ir.Model) -> int:
    """Return the model's default-domain ('' or 'ai.onnx') opset version, 0 when absent."""
    if isinstance(model, ir.Model):
        return model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0))
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 0


def external_data_locations(model: onnx.ModelProto) -> set[str]:
    """The external-data file names (relative to the model's folder) that the model's tensors refer to."""
    return {
        onnx.external_data_helper.ExternalDataInfo(tensor).location
        for tensor in onnx.external_data_helper._get_all_tensors(model)
        if onnx.external_data_helper.uses_external_data(tensor)
    }


def check_external_files(model: onnx.ModelProto, base_dir: Path, where: str) -> None:
    """Every external-data file the model's tensors refer to exists in ``base_dir``, else a ModelLoadError
    naming the missing files."""
    missing = sorted(loc for loc in external_data_locations(model) if not (base_dir / loc).is_file())
    if missing:
        first = next(
            t.name
            for t in onnx.external_data_helper._get_all_tensors(model)
            if onnx.external_data_helper.uses_external_data(t)
            and onnx.external_data_helper.ExternalDataInfo(t).location == missing[0]
        )
        raise ModelLoadError(
            f"{where}: external data file(s) {', '.join(missing)} not found next to the model (tensor "
            f"{first!r} is stored there); copy them into the model's folder."
        )


def check_external_sizes(model: onnx.ModelProto, path: Path) -> None:
    """Every external tensor's bytes lie inside its file; a truncated file is a ModelLoadError naming both."""
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if not onnx.external_data_helper.uses_external_data(tensor):
            continue
        info = onnx.external_data_helper.ExternalDataInfo(tensor)
        file = path.parent / info.location
        size = file.stat().st_size if file.is_file() else 0
        end = (info.offset or 0) + (info.length if info.length is not None else 0)
        if info.length is None:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
            end = (info.offset or 0) + int(np.prod(tensor.dims, dtype=np.int64)) * itemsize
        if end > size:
            raise ModelLoadError(
                f"{path}: external data file {info.location} is truncated: tensor {tensor.name!r} needs bytes up to "
                f"{end} and the file has {size}; copy the complete file beside the model."
            )


def load_proto(path: str | os.PathLike[str], *, load_external_data: bool = True) -> onnx.ModelProto:
    """Read an ONNX file; every failure becomes a ModelLoadError naming the file and what to do."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"{p}: no such file; check the path.")
    if p.is_dir():
        raise ModelLoadError(f"{p}: is a directory, not an .onnx file; give the model file inside it.")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ModelLoadError(f"{p}: cannot be read ({e.strerror}); check its permissions.") from None
    if not data:
        raise ModelLoadError(f"{p}: the file is empty; re-export or re-download the model.")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        raise ModelLoadError(
            f"{p}: not a valid ONNX model (the protobuf data does not parse: truncated or not ONNX); "
            "re-export or re-download it."
        ) from None
    check_structure(model, str(p))
    if load_external_data:  # without it (inspect) missing files are the caller's note, not an error
        load_external(model, p)
    return model


def load_external(model: onnx.ModelProto, path: str | os.PathLike[str]) -> None:
    """Read the external data of ``model`` (loaded from ``path`` without it) into the proto, checked: the
    second half of ``load_proto``, for a caller that looked at the skeleton first."""
    p = Path(path)
    check_external_files(model, p.parent, str(p))
    check_external_sizes(model, p)
    try:
        onnx.external_data_helper.load_external_data_for_model(model, str(p.parent))
    except (OSError, ValueError, onnx.checker.ValidationError) as e:
        raise ModelLoadError(f"{p}: its external data cannot be read ({e}).") from None
    check_tensors(model, str(p))  # external data now inline: it must fill its shapes too


def to_ir(model: ModelLike) -> ir.Model:
    """Return an onnx-ir model for a path, a ModelProto or an ir.Model (the latter is returned as is)."""
    if isinstance(model, ir.Model):
        return model
    proto = model if isinstance(model, onnx.ModelProto) else load_proto(model)
    try:
        return ir.serde.deserialize_model(proto)
    except Exception as e:  # onnx-ir raises several types on malformed graphs
        raise ModelLoadError(f"model {proto.graph.name!r}: its graph is malformed ({e}).") from None


def load_model(path: str | os.PathLike[str]) -> ir.Model:
    """Load a file into the onnx-ir graph every pass works on."""
    return to_ir(load_proto(path))


def to_proto(model: ModelLike) -> onnx.ModelProto:
    """Return a ModelProto with an IR version ORT 1.31 loads (<= 13)."""
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, ir.Model):
        proto = ir.serde.serialize_model(model)
    else:
        proto = load_proto(model)
    if proto.ir_version > MAX_IR_VERSION:
        proto.ir_version = MAX_IR_VERSION
    return proto


def tensor_bytes(proto: onnx.ModelProto) -> int:
    """Bytes of every tensor of the model as stored (initializers, Constant attributes, functions)."""
    return sum(t.ByteSize() for t in onnx.external_data_helper._get_all_tensors(proto))


def _temp_prefix(name: str) -> str:
    """Temporaries beside an output carry the writer's PID, so a later save can tell a dead writer's."""
    return f".{name}.zonnx-{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # another user's process, or cannot tell: keep its files
    return True


def sweep_stale_temporaries(folder: Path, name: str) -> int:
    """Remove temporaries of ``name`` in ``folder`` left by writers that no longer run (a killed save);
    returns how many. Temporaries of live writers, this process's included, are left alone."""
    removed = 0
    marker = f".{name}.zonnx-"
    try:
        entries = [p for p in folder.iterdir() if p.name.startswith(marker)]
    except OSError:
        return 0
    for path in entries:
        pid_text = path.name[len(marker) :].split(".", 1)[0]
        if not pid_text.isdigit() or _pid_alive(int(pid_text)):
            continue
        try:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            removed += 1
        except OSError:
            pass
    if removed:
        logger.info("removed %d temporary file(s) of %s left by a killed run", removed, folder / name)
    return removed


def current_umask() -> int:
    """The process umask, read without changing it where /proc allows (``os.umask`` swaps it otherwise)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path`` and rename it over ``path``; a failure leaves
    nothing behind and raises the OSError (callers word the message)."""
    out = Path(path)
    folder = out.parent if str(out.parent) else Path(".")
    sweep_stale_temporaries(folder, out.name)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(out.name), dir=folder)
    try:
        if hasattr(os, "fchmod"):  # mkstemp makes 0600; outputs follow the umask like any tool's
            os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            kill_point("save-bytes", out.name)
            f.write(data[len(data) // 2 :])
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def save_model(
    model: ModelLike,
    path: str | os.PathLike[str],
    *,
    input_path: str | os.PathLike[str] | None = None,
    inplace: bool = False,
    external_data: bool | None = None,
) -> Path:
    """Write ``model`` to ``path`` atomically (temporary folder beside it, then rename).

    The rule: the IR version is clamped to ``MAX_IR_VERSION``; tensor data over
    ``EXTERNAL_DATA_THRESHOLD`` bytes (or ``external_data=True``) goes to ``<name>.data`` beside the
    model; ``path`` equal to ``input_path`` is refused unless ``inplace`` is set. Nothing is left at
    ``path`` when writing fails.
    """
    out = Path(path)
    if (
        input_path is not None
        and not inplace
        and out.exists()
        and out.resolve() == Path(input_path).resolve()
    ):
        raise ModelSaveError(
            f"{out}: is the input model; choose another output path or pass --inplace to overwrite it."
        )
    if out.is_dir():
        raise ModelSaveError(f"{out}: is a directory; give a file name such as {out / 'model.onnx'}.")
    folder = out.parent if str(out.parent) else Path(".")
    if not folder.is_dir():
        raise ModelSaveError(f"{out}: folder {folder} does not exist; create it first.")
    if not os.access(folder, os.W_OK):
        raise ModelSaveError(f"{out}: folder {folder} is not writable; choose another output path.")

    proto = to_proto(model)
    if external_data is None:
        external_data = tensor_bytes(proto) > min(EXTERNAL_DATA_THRESHOLD, proto_limit())
    data_name = out.name + ".data"
    try:
        sweep_stale_temporaries(folder, out.name)
        tmp_dir = Path(tempfile.mkdtemp(prefix=_temp_prefix(out.name), dir=folder))
    except OSError as e:
        raise ModelSaveError(f"{out}: cannot write in {folder} ({e.strerror}).") from None
    try:
        tmp_model = tmp_dir / out.name
        if external_data:
            onnx.save_model(
                proto,
                str(tmp_model),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=data_name,
                size_threshold=1024,
            )
            if (tmp_dir / data_name).exists():  # no tensor over the threshold: no data file to move
                os.chmod(tmp_dir / data_name, 0o666 & ~current_umask())  # onnx writes 0600; follow the umask
                os.replace(tmp_dir / data_name, folder / data_name)
        else:
            data = proto.SerializeToString()
            with open(tmp_model, "wb") as f:
                f.write(data[: len(data) // 2])
                f.flush()
                kill_point("save-model", out.name)
                f.write(data[len(data) // 2 :])
        os.replace(tmp_model, out)
    except (OSError, ValueError) as e:
        raise write_failure(out, e) from None
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    logger.info("saved %s", out)
    return out


#: errno values of a full disk, a quota or the file-size limit (RLIMIT_FSIZE): the output did not fit.
_NO_ROOM = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})


def write_failure(out: Path, e: OSError | ValueError) -> ModelSaveError:
    """The one-line error for a save that failed (its temporaries already removed): a full disk, quota or
    file-size limit says so and what to do; any other failure quotes the system's reason."""
    if isinstance(e, OSError) and e.errno in _NO_ROOM:
        return ModelSaveError(
            f"{out}: writing failed: no room for it ({e.strerror}: the disk is full or a quota or file-size "
            f"limit was reached); nothing was written; free space in {out.parent} or choose another folder."
        )
    return ModelSaveError(f"{out}: writing failed ({e}); nothing was written.")


def proto_limit() -> int:
    """``PROTO_LIMIT``, or ``ZONNX_PROTO_LIMIT`` when set (bytes)."""
    return int(os.environ.get("ZONNX_PROTO_LIMIT", PROTO_LIMIT))
