"""Calibration statistics on disk: a lossless .npz (re-quantize without calibrating) and TPU-MLIR's table.

The .npz holds a JSON header (``__header__``: format version, zonnx version, the model's fingerprint,
tensor names, methods, bins) and, for tensor ``i``, ``i.ints`` / ``i.floats`` (every ``TensorStats``
field) and ``i.hist`` (histogram counts, when collected). Loading with a model refuses a file made for
another model: the fingerprint covers the graph (nodes, attributes, inputs) and every initializer's
bytes, not names alone.

The TPU-MLIR table is text: header comments, then ``op_name threshold min max`` per tensor (see
``write_calibration_table``).
"""

from __future__ import annotations

__all__ = [
    "FORMAT",
    "VERSION",
    "model_fingerprint",
    "save_stats",
    "load_stats",
    "TableEntry",
    "write_calibration_table",
    "read_calibration_table",
]

import datetime
import hashlib
import io
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from zonnx.ir.io import ModelLike, to_proto, write_bytes_atomic
from zonnx.quantization.calibration.methods import compute_range, method_name
from zonnx.quantization.calibration.readers import CalibrationError
from zonnx.quantization.calibration.stats import GridHistogram, TensorStats

logger = logging.getLogger(__name__)

FORMAT = "zonnx-calibration-stats"
VERSION = 1
_INTS = ("count", "batches", "skipped_batches", "moment_count")
_FLOATS = (
    "min",
    "max",
    "batch_min_sum",
    "batch_max_sum",
    "ema_min",
    "ema_max",
    "mean_min",
    "mean_max",
    "mean",
    "m2",
    "averaging_constant",
    "momentum",
)


def model_fingerprint(model: ModelLike) -> str:
    """A hex digest of what the statistics depend on: opsets, nodes (with attributes), inputs, weights."""
    proto = to_proto(model)
    h = hashlib.blake2b(digest_size=16)
    for imp in sorted((i.domain, i.version) for i in proto.opset_import):
        h.update(repr(imp).encode())
    g = proto.graph
    for vi in g.input:
        h.update(vi.SerializeToString(deterministic=True))
    for node in g.node:
        h.update(f"{node.domain}|{node.op_type}|{','.join(node.input)}|{','.join(node.output)}".encode())
        for attr in sorted(node.attribute, key=lambda a: a.name):
            h.update(attr.SerializeToString(deterministic=True))
    for init in sorted(g.initializer, key=lambda t: t.name):
        h.update(f"{init.name}|{init.data_type}|{tuple(init.dims)}".encode())
        h.update(init.raw_data if init.raw_data else init.SerializeToString(deterministic=True))
    return h.hexdigest()


def _zonnx_version() -> str:
    import zonnx

    return getattr(zonnx, "__version__", "unknown")


def check_output_file(path: str | os.PathLike[str], option: str) -> Path:
    """``path`` as a file zonnx can create: not a folder, its nearest existing ancestor a writable folder.

    Called before calibration, so a bad location fails before the work, with one line naming ``option``.
    """
    out = Path(path)
    if out.is_dir():
        raise CalibrationError(f"{option} {out}: is a folder; give a file name.")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise CalibrationError(f"{option} {out}: {parent} is a file, not a folder.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CalibrationError(f"{option} {out}: cannot write in {parent} (permission denied).")
    return out


def _write(path: Path, data: bytes, option: str) -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_bytes_atomic(path, data)
    except OSError as e:
        raise CalibrationError(f"{option} {path}: cannot be written ({e.strerror or e}).") from None


def save_stats(
    path: str | os.PathLike[str],
    stats: Mapping[str, TensorStats],
    model: ModelLike,
    *,
    methods: Iterable[str | Enum] = (),
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write every field of ``stats`` (histograms included) to ``path`` for ``model``, under exactly that
    name (npz format whatever the suffix), atomically."""
    path = check_output_file(path, "SaveStats")
    names = list(stats)
    header = {
        "format": FORMAT,
        "version": VERSION,
        "zonnx_version": _zonnx_version(),
        "model_fingerprint": model_fingerprint(model),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "tensors": names,
        "methods": sorted({method_name(m) for m in methods}),
        "extra": dict(extra or {}),
    }
    arrays: dict[str, np.ndarray] = {"__header__": np.array(json.dumps(header))}
    for i, name in enumerate(names):
        st = stats[name]
        hist = st.hist if st.hist is not None and st.hist.counts is not None else None
        ints = [getattr(st, f) for f in _INTS] + ([hist.offset, hist.nbins] if hist else [])
        arrays[f"{i}.ints"] = np.array(ints, dtype=np.int64)
        arrays[f"{i}.floats"] = np.array([getattr(st, f) for f in _FLOATS] + ([hist.width] if hist else []))
        if hist is not None:
            arrays[f"{i}.hist"] = hist.counts
    buf = io.BytesIO()  # savez to a file object: no ".npz" appended, no fixed temporary name
    np.savez_compressed(buf, **arrays)
    return _write(path, buf.getvalue(), "SaveStats")


def load_stats(path: str | os.PathLike[str], model: ModelLike | None = None) -> dict[str, TensorStats]:
    """Read statistics saved by ``save_stats``; with ``model``, refuse a file made for another model."""
    path = Path(path)
    if not path.is_file():
        raise CalibrationError(f"calibration stats file {path} does not exist.")
    try:
        z = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file is reported the same way
        raise CalibrationError(f"{path}: not a zonnx calibration stats file ({e}).") from e
    with z:
        if "__header__" not in z.files:
            raise CalibrationError(f"{path}: not a zonnx calibration stats file (no header).")
        header = json.loads(str(z["__header__"]))
        if header.get("format") != FORMAT or header.get("version", 0) > VERSION:
            raise CalibrationError(
                f"{path}: format {header.get('format')!r} version {header.get('version')} is not one this "
                f"zonnx ({_zonnx_version()}) reads; calibrate again."
            )
        if model is not None:
            have = model_fingerprint(model)
            if have != header["model_fingerprint"]:
                raise CalibrationError(
                    f"{path}: these statistics were collected on a different model (fingerprint "
                    f"{header['model_fingerprint'][:12]}, this model {have[:12]}): its graph or weights changed. "
                    "Calibrate again, or pass the model the file was made for."
                )
        out: dict[str, TensorStats] = {}
        for i, name in enumerate(header["tensors"]):
            ints, floats = z[f"{i}.ints"].tolist(), z[f"{i}.floats"].tolist()
            st = TensorStats(name)
            for f, v in zip(_INTS, ints, strict=False):
                setattr(st, f, int(v))
            for f, v in zip(_FLOATS, floats, strict=False):
                setattr(st, f, float(v))
            if f"{i}.hist" in z.files:
                h = GridHistogram(int(ints[len(_INTS) + 1]))
                h.offset, h.width = int(ints[len(_INTS)]), float(floats[len(_FLOATS)])
                h.counts = z[f"{i}.hist"].astype(np.int64)
                st.hist = h
            out[name] = st
    return out


class TableEntry(NamedTuple):
    """One row of a TPU-MLIR calibration table."""

    threshold: float
    min: float
    max: float


def write_calibration_table(
    path: str | os.PathLike[str],
    stats: Mapping[str, TensorStats],
    *,
    method: str | Enum = "kld",
    thresholds: Mapping[str, float] | None = None,
    tune_number: int = 0,
    **options: Any,
) -> Path:
    """Write TPU-MLIR's text calibration table.

    Header comments (generated time, histogram number, sample number, tune number, ``###``, column
    names), then ``op_name threshold min max`` per tensor with 7 decimals. ``threshold`` is taken from
    ``thresholds`` when given, else from ``method`` (default ``kld``, TPU-MLIR's) as the upper end of
    its symmetric range; ``min``/``max`` are the raw extrema.
    """
    bins = next((s.hist.nbins for s in stats.values() if s.hist is not None), 2048)
    samples = max((s.batches for s in stats.values()), default=0)
    lines = [
        f"# generated time: {datetime.datetime.now()}",
        f"# histogram number: {bins}",
        f"# sample number: {samples}",
        f"# tune number: {tune_number}",
        "###",
        "# op_name    threshold      min      max",
    ]
    for name, st in stats.items():
        if not name or any(c.isspace() for c in name):
            raise CalibrationError(
                f"tensor {name!r}: a calibration-table name cannot be empty or hold spaces."
            )
        if thresholds is not None and name in thresholds:
            t = float(thresholds[name])
        else:
            t = compute_range(st, method, symmetric=True, **options)[1]
        lines.append(f"{name} {t:.7f} {st.min:.7f} {st.max:.7f}")
    path = check_output_file(path, "ExportCalibrationTable")
    return _write(path, ("\n".join(lines) + "\n").encode(), "ExportCalibrationTable")


def read_calibration_table(path: str | os.PathLike[str]) -> dict[str, TableEntry]:
    """Read a TPU-MLIR calibration table: ``{op_name: TableEntry(threshold, min, max)}``.

    Comment lines are skipped; rows with more than four columns (QAT per-channel rows) keep their first
    four. A malformed row raises ``CalibrationError`` naming the line.
    """
    path = Path(path)
    if not path.is_file():
        raise CalibrationError(f"calibration table {path} does not exist.")
    out: dict[str, TableEntry] = {}
    for no, line in enumerate(path.read_text().splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        parts = s.split()
        try:
            t, lo, hi = (float(v) for v in parts[1:4])
        except (ValueError, IndexError) as e:
            raise CalibrationError(f"{path}:{no}: expected 'op_name threshold min max', got {s!r}.") from e
        if not all(math.isfinite(v) for v in (t, lo, hi)):
            raise CalibrationError(f"{path}:{no}: non-finite value in {s!r}.")
        out[parts[0]] = TableEntry(t, lo, hi)
    return out
