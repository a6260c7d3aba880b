"""Per-layer dump of a compiled model: the integer output of every op of every NPU program, for one set of feeds.

How the values are made (bit-exact with what ``zonnx.InferenceSession`` computes): the compiled model is
lowered to ORT-native ops once (``lower_npu_nodes`` + ``lower_program``) with every ``NpuSubgraph``
node's inputs and outputs added as graph outputs; one ORT run gives the codes entering each program;
then the numpy reference executor (``run_program(program, inputs, debug=True)``, which returns every
tensor it computed) runs each program and yields every op output. The reference's program outputs are
checked against the ORT run's node outputs (``DumpResult.mismatches`` names any that differ, which would
be a backend bug). The reference was chosen over exposing tensors from the ORT lowering because it needs
no renaming of the lowered graph and is independent of the ORT kernels the dump is meant to check.

On disk (``write_dump``): ``DIR/<subgraph>/<sanitized tensor>.npy`` per tensor in the program's storage
dtype, and ``DIR/index.json`` listing, in program order, each tensor's name, file, op name/kind, the
ONNX nodes folded into the op, dtype, shape, scale, zero point, axis and code range.
"""

from __future__ import annotations

__all__ = [
    "LayerTensor",
    "DumpResult",
    "DumpError",
    "dump_layers",
    "write_dump",
    "sanitize",
    "run_exposed",
    "index_entry",
]

import dataclasses
import hashlib
import io
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from zonnx.backend.compiled import lower_npu_nodes, npu_nodes, read_program
from zonnx.backend.compiler.program import Op, Program, TensorInfo
from zonnx.backend.runtime.ort_lowering import lower_program
from zonnx.backend.runtime.reference import run_program
from zonnx.errors import ZonnxError, first_line
from zonnx.hostcpu import host_int
from zonnx.ir.io import write_bytes_atomic
from zonnx.verify import ort_session

logger = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_NAME = 120


class DumpError(ZonnxError):
    """The dump cannot be made (model not compiled, feeds that do not fit) or written (folder not writable)."""


@dataclasses.dataclass
class LayerTensor:
    """One NPU op output: ``value`` holds its codes in the program's storage dtype (``info.dtype``)."""

    index: int  # position in program order over the whole model
    subgraph: str  # the NpuSubgraph node's name
    op: Op
    info: TensorInfo
    value: np.ndarray

    @property
    def tensor(self) -> str:
        return self.info.name

    def dequantize(self) -> np.ndarray:
        """float64 ``scale * (q - zero_point)``."""
        return self.info.dequantize(self.value)


@dataclasses.dataclass
class DumpResult:
    """Every layer in program order, each subgraph's program, and the program outputs checked against ORT."""

    layers: list[LayerTensor]
    programs: dict[str, Program] = dataclasses.field(default_factory=dict)
    checked: int = 0
    mismatches: list[str] = dataclasses.field(default_factory=list)


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)


def run_exposed(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], names: list[str], what: str
) -> dict[str, np.ndarray]:
    """Values of the tensors ``names`` (graph inputs or node outputs of ``model``) from one ORT run.

    The model runs with graph optimizations off (as written: no Q/DQ fusion) and ``names`` added as
    outputs; it is fed the ``feeds`` it declares. ``what`` names the model in errors (DumpError).
    """
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {t.name for t in m.graph.initializer}
    inputs = [i.name for i in m.graph.input if i.name not in inits]
    missing = [n for n in inputs if n not in feeds]
    if missing:
        raise DumpError(
            f"{what}: needs inputs {missing}, which the feeds do not have; give the matching model."
        )
    have = {o.name for o in m.graph.output}
    fetch = [n for n in dict.fromkeys(names) if n not in inputs]
    m.graph.output.extend(onnx.helper.make_value_info(n, onnx.TypeProto()) for n in fetch if n not in have)
    try:
        got = ort_session(m).run(fetch, {n: feeds[n] for n in inputs})
    except Exception as e:  # VerificationError from ort_session, ORT's own types from run
        first = first_line(e)
        raise DumpError(f"{what}: onnxruntime cannot run it ({first}).") from None
    values = dict(zip(fetch, got, strict=True))
    values.update({n: np.asarray(feeds[n]) for n in names if n in inputs})
    return values


def dump_layers(compiled: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> DumpResult:
    """Every NPU op output of ``compiled`` (a compiled ModelProto) for ``feeds``, in program order.

    Subgraphs come in the model's (topological) node order, ops in each program's order. Raises
    DumpError when the model holds no NpuSubgraph node.
    """
    nodes = npu_nodes(compiled)
    if not nodes:
        raise DumpError(
            "the model has no NPU subgraph (no com.zonnx NpuSubgraph node): nothing runs on the NPU to dump."
        )
    wanted = [t for n in nodes for t in [*n.input, *n.output] if t]
    lowered = lower_npu_nodes(compiled, lower_program, opset=_opset(compiled))
    values = run_exposed(lowered, feeds, wanted, "the compiled model (lowered for the dump)")
    result = DumpResult([])
    for node in nodes:
        prog = read_program(node)
        result.programs[node.name] = prog
        ins = {t.name: values[i] for t, i in zip(prog.inputs, node.input, strict=True)}
        env = run_program(prog, ins, debug=True)
        for t, o in zip(prog.outputs, node.output, strict=True):
            result.checked += 1
            if not np.array_equal(env[t.name], values[o].astype(np.int64)):
                result.mismatches.append(f"{node.name}/{t.name}")
        result.layers.extend(_layers(node.name, prog, env, len(result.layers)))
    if result.mismatches:
        logger.warning(
            "the ORT lowering and the reference executor differ on %s (program/tensor) on this host (%s; "
            "a backend bug: please report it with `zonnx doctor`)",
            ", ".join(result.mismatches),
            host_int().describe(),
        )
    return result


def _layers(subgraph: str, prog: Program, env: dict[str, np.ndarray], start: int) -> list[LayerTensor]:
    out = []
    for op in prog.ops:
        for name in op.outputs:
            info = prog.tensors.get(name) or next(t for t in prog.outputs if t.name == name)
            value = env[name].astype(info.dtype)
            out.append(LayerTensor(start + len(out), subgraph, op, info, value))
    return out


def sanitize(name: str) -> str:
    """A file-name-safe form of a tensor name: runs of other characters become ``_`` (long names get a hash)."""
    text = _UNSAFE.sub("_", name).strip("._") or "tensor"
    if len(text) > _MAX_NAME:
        text = f"{text[: _MAX_NAME - 9]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return text


def _npy(value: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, value, allow_pickle=False)
    return buf.getvalue()


def index_entry(layer: LayerTensor, file: str) -> dict[str, Any]:
    """The ``index.json`` record of one dumped tensor."""
    info = layer.info
    return {
        "tensor": info.name,
        "file": file,
        "subgraph": layer.subgraph,
        "op": layer.op.name,
        "kind": layer.op.kind,
        "sources": layer.op.sources,
        "dtype": info.dtype,
        "shape": list(layer.value.shape),
        "scale": info.scale,
        "zero_point": info.zero_point,
        "axis": info.axis,
        "qmin": info.qmin,
        "qmax": info.qmax,
    }


def write_dump(result: DumpResult | list[LayerTensor], folder: str | Path) -> Path:
    """Write one ``.npy`` per layer under ``folder/<subgraph>/`` and ``folder/index.json``; returns the index path.

    Each file is written atomically; two tensors whose sanitized names collide get ``_2``, ``_3`` suffixes.
    """
    layers = result.layers if isinstance(result, DumpResult) else result
    root = Path(folder)
    entries, used = [], set()
    try:
        for layer in layers:
            sub = sanitize(layer.subgraph)
            stem, k = sanitize(layer.tensor), 1
            rel = f"{sub}/{stem}.npy"
            while rel in used:
                k += 1
                rel = f"{sub}/{stem}_{k}.npy"
            used.add(rel)
            (root / sub).mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(root / rel, _npy(layer.value))
            entries.append(index_entry(layer, rel))
        root.mkdir(parents=True, exist_ok=True)
        index = {"format": "zonnx-npu-dump", "version": 1, "tensors": entries}
        return write_bytes_atomic(root / "index.json", json.dumps(index, indent=1).encode())
    except OSError as e:
        raise DumpError(
            f"{root}: cannot write the dump ({e.strerror or e}); choose a writable folder."
        ) from None
