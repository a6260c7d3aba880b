"""Load any model form with clear errors; save models ORT 1.31 loads, atomically, with external data when large."""

from __future__ import annotations

__all__ = [
    "MAX_IR_VERSION",
    "MIN_OPSET",
    "EXTERNAL_DATA_THRESHOLD",
    "ModelLike",
    "load_proto",
    "load_model",
    "to_ir",
    "to_proto",
    "save_model",
    "write_bytes_atomic",
    "current_umask",
    "external_data_locations",
    "check_names",
    "check_single_writers",
    "check_wiring",
    "sweep_stale_temporaries",
    "default_opset",
]

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TypeAlias

import onnx
import onnx.external_data_helper
import onnx_ir as ir
from google.protobuf.message import DecodeError

from zonnx.errors import ModelLoadError, ModelSaveError, UnsupportedModelError

logger = logging.getLogger(__name__)

#: onnxruntime 1.31 refuses IR version 14 ("Unsupported model IR version"); every save clamps to this.
MAX_IR_VERSION = 13
#: Oldest default-domain opset the opset upgrade can start from.
MIN_OPSET = 7
#: Above this many bytes of tensor data a model is saved with external data (protobuf's limit is 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1_800_000_000

ModelLike: TypeAlias = "str | os.PathLike[str] | onnx.ModelProto | ir.Model"


def default_opset(model: onnx.ModelProto | ir.Model) -> int:
    """Return the model's default-domain ('' or 'ai.onnx') opset version, 0 when absent."""
    if isinstance(model, ir.Model):
        return model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0))
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 0


def _check_versions(model: onnx.ModelProto, where: str) -> None:
    """Refuse models whose IR or opset version this onnx build cannot represent."""
    newest_ir = onnx.IR_VERSION
    if model.ir_version > newest_ir:
        raise UnsupportedModelError(
            f"{where}: IR version {model.ir_version} is newer than onnx {onnx.__version__} understands "
            f"(at most {newest_ir}); re-export it with an older exporter setting."
        )
    opset = default_opset(model)
    newest_opset = onnx.defs.onnx_opset_version()
    if opset > newest_opset:
        raise UnsupportedModelError(
            f"{where}: opset {opset} is newer than supported (at most {newest_opset}); "
            f"re-export it at opset {newest_opset} or lower."
        )
    if 0 < opset < MIN_OPSET:
        raise UnsupportedModelError(
            f"{where}: opset {opset} is too old (zonnx handles opset {MIN_OPSET} and newer); "
            "re-export the model from its source framework at a newer opset."
        )


def external_data_locations(model: onnx.ModelProto) -> set[str]:
    """The external-data file names (relative to the model's folder) that the model's tensors refer to."""
    return {
        onnx.external_data_helper.ExternalDataInfo(tensor).location
        for tensor in onnx.external_data_helper._get_all_tensors(model)
        if onnx.external_data_helper.uses_external_data(tensor)
    }


def _missing_external_files(model: onnx.ModelProto, base_dir: Path) -> list[str]:
    """List external-data files the model refers to that do not exist next to it."""
    return sorted(loc for loc in external_data_locations(model) if not (base_dir / loc).is_file())


def _bad_text(value: object) -> bool:
    return isinstance(value, bytes)  # protobuf hands back bytes for a string field that is not UTF-8


def check_names(model: onnx.ModelProto, where: str) -> None:
    """Every name in the main graph is text: a string field with invalid UTF-8 is a ModelLoadError naming
    the node, tensor or field (the rule: such bytes never reach code that expects text)."""

    def fail(what: str, value: object) -> None:
        raise ModelLoadError(
            f"{where}: {what} {value!r} is not valid UTF-8; rename it (e.g. with onnx's Python API) and save again."
        )

    g = model.graph
    for opset in model.opset_import:
        if _bad_text(opset.domain):
            fail("an opset domain", opset.domain)
    if _bad_text(g.name):
        fail("the graph name", g.name)
    for kind, values in (("input", g.input), ("output", g.output), ("value_info", g.value_info)):
        for v in values:
            if _bad_text(v.name):
                fail(f"graph {kind}", v.name)
    for t in g.initializer:
        if _bad_text(t.name):
            fail("initializer", t.name)
    for i, n in enumerate(g.node):
        label = f"node #{i}" if _bad_text(n.name) else f"node {n.name!r}"
        for field, value in (("name", n.name), ("op_type", n.op_type), ("domain", n.domain)):
            if _bad_text(value):
                fail(f"node #{i} ({field})", value)
        for value in list(n.input) + list(n.output):
            if _bad_text(value):
                fail(f"{label}: tensor name", value)
        for a in n.attribute:
            if _bad_text(a.name):
                fail(f"{label}: attribute name", a.name)
    for prop in model.metadata_props:
        if _bad_text(prop.key) or _bad_text(prop.value):
            fail("metadata entry", prop.key)


def check_single_writers(model: onnx.ModelProto, where: str) -> None:
    """Each tensor of the main graph has one writer: a graph input, an initializer or one node output.

    A second writer is a ModelLoadError naming the tensor and both writers (ONNX requires SSA form)."""
    writers: dict[str, str] = {}
    for v in model.graph.input:
        writers[v.name] = f"graph input {v.name!r}"
    for t in model.graph.initializer:
        writers.setdefault(t.name, f"initializer {t.name!r}")
    for i, n in enumerate(model.graph.node):
        for out in n.output:
            if not out:
                continue
            me = f"node {n.name or '#' + str(i)!r} ({n.op_type})"
            if out in writers:
                raise ModelLoadError(
                    f"{where}: tensor {out!r} is written by {writers[out]} and by {me}; an ONNX graph gives "
                    "each tensor one writer: rename one of the outputs."
                )
            writers[out] = me


def check_wiring(model: onnx.ModelProto, where: str) -> None:
    """The main graph is well formed: every node input and graph output is produced by a graph input, an
    initializer or a node, and nodes come in topological order (no node reads a later node's output:
    that is unsorted nodes or a cycle). Otherwise a ModelLoadError naming the node and the tensor."""
    g = model.graph
    known = {v.name for v in g.input} | {t.name for t in g.initializer} | {""}
    later = {o: (i, n) for i, n in enumerate(g.node) for o in n.output if o}
    for i, n in enumerate(g.node):
        for name in n.input:
            if name in known:
                continue
            label = f"node {n.name or '#' + str(i)!r} ({n.op_type})"
            if name in later:
                j, writer = later[name]
                raise ModelLoadError(
                    f"{where}: {label} reads {name!r} before node {writer.name or '#' + str(j)!r} writes it "
                    "(nodes out of order or a cycle); the input model is invalid: re-export it."
                )
            raise ModelLoadError(
                f"{where}: {label} reads {name!r}, which no node, input or initializer produces; the input "
                "model is invalid: re-export it."
            )
        known.update(o for o in n.output if o)
    for v in g.output:
        if v.name not in known:
            raise ModelLoadError(
                f"{where}: graph output {v.name!r} is produced by no node; the input model is invalid."
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
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        raise ModelLoadError(
            f"{p}: not an ONNX model (no IR version, graph or opset import found); "
            "give a file written by an ONNX exporter."
        )
    _check_versions(model, str(p))
    check_names(model, str(p))
    check_single_writers(model, str(p))
    if load_external_data:
        missing = _missing_external_files(model, p.parent)
        if missing:
            raise ModelLoadError(
                f"{p}: external data file(s) {', '.join(missing)} not found next to the model; "
                "copy them into the model's folder."
            )
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(p.parent))
        except (OSError, ValueError, onnx.checker.ValidationError) as e:
            raise ModelLoadError(f"{p}: its external data cannot be read ({e}).") from None
    return model


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


def _tensor_bytes(proto: onnx.ModelProto) -> int:
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
            f.write(data)
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
        external_data = _tensor_bytes(proto) > EXTERNAL_DATA_THRESHOLD
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
                os.replace(tmp_dir / data_name, folder / data_name)
        else:
            tmp_model.write_bytes(proto.SerializeToString())
        os.replace(tmp_model, out)
    except (OSError, ValueError) as e:
        raise ModelSaveError(f"{out}: writing failed ({e}); nothing was written.") from None
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    logger.info("saved %s", out)
    return out
