"""The NPU program format: a versioned list of integer operations, serializable to one bytes blob.

A ``Program`` has integer input and output tensors (``TensorInfo``: storage dtype, code range, and the
scale / zero point that give them meaning, ``real = scale * (q - zero_point)``), a list of ``Op`` in
execution order and a table of every tensor's ``TensorInfo`` (for dumps and comparisons). Each op has a
``kind`` (its integer semantics, defined in ``zonnx.backend.runtime.reference``), the ONNX node names it
came from, input/output tensor names, ``attrs`` (JSON values: ints, floats, strings, lists) and
``params`` (integer numpy arrays: weights, folded biases, multipliers, shifts, tables).

Serialized form (``to_bytes``/``from_bytes``), format version ``FORMAT_VERSION``::

    b"ZNPU" | u32 format version | u32 n = len(header) | header: n bytes of UTF-8 JSON | npz archive

The JSON header holds everything but the arrays; the npz (``allow_pickle=False``, fixed timestamps) holds op ``i``'s
param ``p`` under the key ``"i/p"``. The blob fits in an ONNX ``STRING``/``TENSOR`` attribute. A blob of
another version or with a bad magic is refused with a ProgramFormatError (a stale cache entry).
"""

from __future__ import annotations

__all__ = ["FORMAT_VERSION", "MAGIC", "TensorInfo", "Op", "Program", "ProgramFormatError"]

import dataclasses
import io
import json
import logging
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from zonnx.errors import ZonnxError

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MAGIC = b"ZNPU"
_INT_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64")


class ProgramFormatError(ZonnxError):
    """A serialized program is corrupt or of another format version (recompile it)."""


@dataclasses.dataclass
class TensorInfo:
    """An integer tensor: ``real = scale * (q - zero_point)`` (per-channel along ``axis``), codes in [qmin, qmax]."""

    name: str
    dtype: str
    qmin: int
    qmax: int
    scale: list[float]
    zero_point: list[int]
    axis: int | None = None
    shape: list[int | str | None] | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorInfo:
        return cls(**data)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        """float64 ``scale * (q - zero_point)`` (per-channel along ``axis``)."""
        s = np.asarray(self.scale, dtype=np.float64)
        z = np.asarray(self.zero_point, dtype=np.int64)
        q = np.asarray(q, dtype=np.int64)
        if self.axis is not None and s.size > 1:
            shape = [1] * q.ndim
            shape[self.axis] = -1
            s, z = s.reshape(shape), z.reshape(shape)
        elif s.size == 1:
            s, z = s.reshape(()), z.reshape(())
        return (q - z) * s


@dataclasses.dataclass
class Op:
    """One integer operation; ``kind`` selects its formula (see the reference executor)."""

    kind: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    params: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    sources: list[str] = dataclasses.field(default_factory=list)  # ONNX node names folded into the op


@dataclasses.dataclass
class Program:
    """A compiled NPU subgraph: integer inputs -> ops -> integer outputs."""

    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    ops: list[Op]
    tensors: dict[str, TensorInfo] = dataclasses.field(default_factory=dict)
    target: str = ""
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    version: int = FORMAT_VERSION

    # -- inspection ---------------------------------------------------------------------------------
    def op_counts(self) -> dict[str, int]:
        """Number of ops of each kind."""
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op.kind] = counts.get(op.kind, 0) + 1
        return counts

    def __str__(self) -> str:
        lines = [
            f"Program v{self.version} target={self.target or '?'}: {len(self.ops)} ops, "
            f"inputs {[t.name for t in self.inputs]}, outputs {[t.name for t in self.outputs]}"
        ]
        for op in self.ops:
            shapes = {k: list(v.shape) for k, v in op.params.items()}
            lines.append(f"  {op.kind:<10} {op.inputs} -> {op.outputs} {op.attrs} {shapes}")
        return "\n".join(lines)

    # -- serialization ------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """Serialize to ``MAGIC | version | header length | JSON | npz`` (exact round trip)."""
        header = {
            "version": self.version,
            "target": self.target,
            "meta": self.meta,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "tensors": [t.to_json() for t in self.tensors.values()],
            "ops": [
                {
                    "kind": op.kind,
                    "name": op.name,
                    "inputs": op.inputs,
                    "outputs": op.outputs,
                    "attrs": op.attrs,
                    "params": {k: str(v.dtype) for k, v in op.params.items()},
                    "sources": op.sources,
                }
                for op in self.ops
            ],
        }
        text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
        arrays = {
            f"{i}/{k}": np.ascontiguousarray(op.params[k])
            for i, op in enumerate(self.ops)
            for k in sorted(op.params)
        }
        return MAGIC + struct.pack("<II", self.version, len(text)) + text + _npz_bytes(arrays)

    @classmethod
    def from_bytes(cls, blob: bytes) -> Program:
        """Parse ``to_bytes`` output; ProgramFormatError on a bad magic, version or payload."""
        if len(blob) < 12 or blob[:4] != MAGIC:
            raise ProgramFormatError("not a zonnx NPU program (bad magic); recompile the model.")
        version, n = struct.unpack("<II", blob[4:12])
        if version != FORMAT_VERSION:
            raise ProgramFormatError(
                f"NPU program format version {version}, this zonnx reads {FORMAT_VERSION}; recompile the model."
            )
        try:
            header = json.loads(blob[12 : 12 + n].decode("utf-8"))
            with np.load(io.BytesIO(blob[12 + n :]), allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            ops = []
            for i, o in enumerate(header["ops"]):
                params = {}
                for k, dt in o["params"].items():
                    arr = arrays[f"{i}/{k}"]
                    if str(arr.dtype) != dt:
                        raise ValueError(f"op {i} param {k}: dtype {arr.dtype}, header says {dt}")
                    params[k] = arr
                ops.append(
                    Op(o["kind"], o["name"], o["inputs"], o["outputs"], o["attrs"], params, o["sources"])
                )
            tensors = [TensorInfo.from_json(t) for t in header["tensors"]]
            return cls(
                inputs=[TensorInfo.from_json(t) for t in header["inputs"]],
                outputs=[TensorInfo.from_json(t) for t in header["outputs"]],
                ops=ops,
                tensors={t.name: t for t in tensors},
                target=header["target"],
                meta=header["meta"],
                version=version,
            )
        except (ValueError, KeyError, TypeError, OSError, UnicodeDecodeError) as e:
            raise ProgramFormatError(f"corrupt NPU program ({e}); recompile the model.") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.to_bytes())

    @classmethod
    def load(cls, path: str | Path) -> Program:
        return cls.from_bytes(Path(path).read_bytes())


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An npz archive with fixed timestamps, so one program always serializes to the same bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for key, arr in arrays.items():
            one = io.BytesIO()
            np.lib.format.write_array(one, arr, allow_pickle=False)
            zf.writestr(zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0)), one.getvalue())
    return buf.getvalue()


def int_dtype(name: str) -> np.dtype:
    """The numpy dtype of an integer storage type name."""
    if name not in _INT_DTYPES:
        raise ProgramFormatError(f"unknown integer dtype {name!r} in an NPU program.")
    return np.dtype(name)
