"""Golden comparison of every NPU layer against the float model and the fake-quantized (QDQ/FixNeuron) model.

For each NPU op output ``T`` (``zonnx.backend.dump``, program order), with ``q`` its NPU codes and
``d = scale * (q - zero_point)`` (its ``TensorInfo``):

- vs fake-quant: the quantized source model runs in plain onnxruntime (graph optimizations off, so
  Q/DQ are not fused into integer kernels) with ``T`` exposed as an extra output. Program tensors keep
  the quantized model's names: ``T`` is a quantizer's output (QuantizeLinear: integer codes, taken as
  they are; FixNeuron: a float on its grid) or the output of a code op (MaxPool, Reshape, Flatten...:
  a float on the grid). Floats become codes with ``round(v / scale) + zero_point``. Reported: the
  largest ``|q_npu - q_fq|`` in LSB, how many codes differ and, on both dequantized, cosine, SQNR and
  max abs error (``cos_fq``, ``sqnr_fq_db``, ``max_abs_fq``). Tensors the compiler made itself (a
  Concat input rescale ``<out>__concat_in<i>``) have no fake-quant counterpart.
- vs float: the float model is prepared with the quantizer's own lossless passes (``PREP_PASSES``:
  BatchNormalization folded into the Conv, whose output keeps its name) so its tensor names mean what
  they mean in the quantized model; ``T``'s float counterpart is the quantizer's input (``X`` for
  ``X_QuantizeLinear_Output`` or ``X_fix``), through a constant ``Mul`` refinement when there is one,
  else ``T`` itself. Reported: cosine, ``SQNR = 10 log10(sum f^2 / sum (f - d)^2)`` dB and max |f - d|.

A layer diverges when ``cosine < tol_cos`` (default 0.99, TPU-MLIR's npz_compare cosine) or
``max LSB > tol_lsb`` (default 1; VART's golden check wants equal codes, i.e. 0). The first diverging
layer in program order is ``GoldenReport.first_divergence``: errors propagate forward, so it is the
layer to look at. To tell a faulty op from carried error, each op is also run alone (reference
executor) on the fake-quant inputs (``local_lsb``), and the fake-quant model is compared with float
(``fq_cos_float``: equal to ``cos_float`` means the loss is quantization's, not the NPU's).
Public API: ``compare_layers``, ``GoldenReport`` (``summary()``, ``to_dict()``), ``LayerRow``.
"""

from __future__ import annotations

__all__ = [
    "LayerRow",
    "GoldenReport",
    "compare_layers",
    "float_counterparts",
    "DEFAULT_TOL_COS",
    "DEFAULT_TOL_LSB",
]

import dataclasses
import json
import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from zonnx.backend.compiled import is_compiled
from zonnx.backend.compiler.program import TensorInfo
from zonnx.backend.dump import DumpResult, LayerTensor, dump_layers, run_exposed
from zonnx.backend.runtime.reference import execute_op
from zonnx.errors import OptionError, ZonnxError
from zonnx.hostcpu import host_int
from zonnx.ir.io import ModelLike, to_proto
from zonnx.verify import cosine

logger = logging.getLogger(__name__)

DEFAULT_TOL_COS = 0.99
DEFAULT_TOL_LSB = 1
_QUANTIZERS = {"QuantizeLinear", "FixNeuron", "VitisQuantizeLinear"}
_DEQUANTIZERS = {"DequantizeLinear", "VitisDequantizeLinear"}
_SUFFIXES = ("_QuantizeLinear_Output", "_fix")


@dataclasses.dataclass
class LayerRow:
    """One NPU layer's agreement with the float and fake-quant models (None: no counterpart)."""

    index: int
    subgraph: str
    tensor: str
    op: str
    kind: str
    shape: list[int]
    dtype: str
    float_tensor: str | None = None
    cos_float: float | None = None
    sqnr_db: float | None = None
    cos_fq: float | None = None
    max_lsb: int | None = None
    codes_diff: int | None = None
    local_lsb: int | None = None
    fq_cos_float: float | None = None
    max_abs_float: float | None = None
    sqnr_fq_db: float | None = None
    max_abs_fq: float | None = None
    size: int = 0
    reasons: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, layer: LayerTensor) -> LayerRow:
        shape, info = list(layer.value.shape), layer.info
        return cls(layer.index, layer.subgraph, layer.tensor, layer.op.name, layer.op.kind, shape, info.dtype,
                   size=int(layer.value.size))  # fmt: skip

    @property
    def diverged(self) -> bool:
        return bool(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["diverged"] = self.diverged
        # strict JSON has no Infinity
        for k in ("cos_float", "sqnr_db", "cos_fq", "fq_cos_float", "sqnr_fq_db"):
            if isinstance(out[k], float) and not math.isfinite(out[k]):
                out[k] = "inf" if out[k] > 0 else "-inf"
        return out


@dataclasses.dataclass
class GoldenReport:
    """Rows in program order, the first diverging row, the tolerances and notes on what was skipped."""

    rows: list[LayerRow]
    first_divergence: LayerRow | None
    tol_cos: float
    tol_lsb: int
    float_model: str | None = None
    qdq_model: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        first = self.first_divergence
        return {
            "tol_cos": self.tol_cos,
            "tol_lsb": self.tol_lsb,
            "float_model": self.float_model,
            "qdq_model": self.qdq_model,
            "first_divergence": None
            if first is None
            else {"index": first.index, "tensor": first.tensor, "op": first.op, "reasons": first.reasons},
            "notes": self.notes,
            "layers": [r.to_dict() for r in self.rows],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def summary(self) -> str:
        """One line: the first divergence with its likely cause, or that every layer is within tolerance."""
        r = self.first_divergence
        if r is None:
            return f"all {len(self.rows)} NPU layers within tolerance ({self._tolerances()})"
        text = (
            f"first divergence: layer {r.index} {r.tensor!r} (op {r.op!r}, {r.kind}): {'; '.join(r.reasons)}"
        )
        if r.max_lsb is not None and r.max_lsb > self.tol_lsb and r.local_lsb is not None:
            if r.local_lsb > self.tol_lsb:
                return f"{text}; the op alone differs by {r.local_lsb} LSB on fake-quant inputs: check its program"
            return f"{text}; the op alone adds {r.local_lsb} LSB on fake-quant inputs: carried from earlier layers"
        if r.fq_cos_float is not None and r.fq_cos_float < self.tol_cos:
            return f"{text}; the fake-quant model has cos {r.fq_cos_float:.4f} too: a quantization error, not the NPU"
        return text

    def _tolerances(self) -> str:
        parts = []
        if any(r.cos_float is not None for r in self.rows):
            parts.append(f"cos >= {self.tol_cos} vs float")
        if any(r.max_lsb is not None for r in self.rows):
            parts.append(f"<= {self.tol_lsb} LSB vs fake-quant")
        return ", ".join(parts) or "nothing compared"


def _label(model: ModelLike | None) -> str | None:
    return None if model is None else (str(model) if not isinstance(model, onnx.ModelProto) else "model")


def _produced(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output if o}


def _prepared_float(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    """The float model after the quantizer's preparation passes (names then match the quantized model)."""
    from zonnx.ir.io import to_ir
    from zonnx.passes.catalog import make_pass
    from zonnx.quantization.prepare import PREP_PASSES

    try:
        ir_model = to_ir(model)
        for name in PREP_PASSES:
            make_pass(name)(ir_model)
        return to_proto(ir_model)
    except ZonnxError as e:
        notes.append(f"float model used as is (the quantizer's preparation failed: {e})")
        return model


def float_counterparts(
    qdq: onnx.ModelProto, layers: list[LayerTensor], float_model: onnx.ModelProto
) -> dict[str, str]:
    """Program tensor -> the float model's tensor holding its real value (see the module docstring).

    Candidates in order: the quantizer's input (past a constant ``Mul`` refinement), the output of a
    DequantizeLinear reading ``T``, ``T`` itself, ``T`` without the ``_QuantizeLinear_Output`` / ``_fix``
    suffix the quantizers add (when ``qdq`` is the compiled model, whose NPU nodes are gone); a
    ``rescale`` or ``copy`` output, which holds its input's real value, takes its input's counterpart.
    """
    prod = _produced(qdq)
    consts = {t.name for t in qdq.graph.initializer}
    consts |= {n.output[0] for n in qdq.graph.node if n.op_type == "Constant"}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in qdq.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    known = set(_produced(float_model)) | {i.name for i in float_model.graph.input}
    out: dict[str, str] = {}
    for layer in layers:
        t, cands = layer.tensor, []
        node = prod.get(t)
        if node is not None and node.op_type in _QUANTIZERS:
            x = node.input[0]
            cands.append(x)
            pre = prod.get(x)
            if pre is not None and pre.op_type == "Mul" and sum(i in consts for i in pre.input) == 1:
                cands.append(next(i for i in pre.input if i not in consts))  # refinement Mul(x, n k / 2^n)
        cands += [r.output[0] for r in readers.get(t, []) if r.op_type in _DEQUANTIZERS]
        cands += [t, *(t[: -len(s)] for s in _SUFFIXES if t.endswith(s))]
        hit = next((c for c in cands if c in known), None)
        if hit is None and layer.op.kind in ("rescale", "copy"):
            hit = out.get(layer.op.inputs[0])
        if hit is not None:
            out[t] = hit
    return out


def _codes(info: TensorInfo, value: np.ndarray) -> np.ndarray:
    """Fake-quant codes of a tensor: integer tensors as they are, on-grid floats as round(v/scale)+zp."""
    if np.issubdtype(value.dtype, np.integer):
        return value.astype(np.int64)
    s = np.asarray(info.scale, np.float64)
    z = np.asarray(info.zero_point, np.int64)
    if info.axis is not None and s.size > 1:
        shape = [1] * value.ndim
        shape[info.axis] = -1
        s, z = s.reshape(shape), z.reshape(shape)
    return np.rint(value.astype(np.float64) / s).astype(np.int64) + z


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    """``10 log10(sum ref^2 / sum (ref - got)^2)`` in dB; inf when equal, -inf for an all-zero reference."""
    r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    noise = float(np.sum((r - g) ** 2))
    signal = float(np.sum(r * r))
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def _fake_quant(
    dump: DumpResult, qdq: onnx.ModelProto, feeds: Mapping[str, np.ndarray], what: str
) -> dict[str, np.ndarray]:
    """Fake-quant codes of every program tensor (op outputs and program inputs) the quantized model has."""
    infos = {k: v for prog in dump.programs.values() for k, v in prog.tensors.items()}
    for prog in dump.programs.values():
        infos.update({t.name: t for t in [*prog.inputs, *prog.outputs]})
    made = set(_produced(qdq)) | {i.name for i in qdq.graph.input}
    names = [n for n in infos if n in made]
    got = run_exposed(qdq, feeds, names, what)
    return {n: _codes(infos[n], np.asarray(v)) for n, v in got.items()}


def _local_lsb(layer: LayerTensor, fq: dict[str, np.ndarray]) -> int | None:
    """Largest code difference of this op alone: run on the fake-quant inputs, compared with the fake-quant output."""
    if layer.tensor not in fq or any(i not in fq for i in layer.op.inputs):
        return None
    try:
        out = execute_op(layer.op, [fq[i] for i in layer.op.inputs])
    except (ValueError, ZonnxError):  # shapes the op cannot take
        return None
    ref = fq[layer.tensor]
    return int(np.abs(out - ref).max(initial=0)) if out.shape == ref.shape else None


def _with_fake_quant(
    rows: list[LayerRow], layers: list[LayerTensor], fq: dict[str, np.ndarray], tol: int
) -> None:
    for layer, row in zip(layers, rows, strict=True):
        q_fq = fq.get(row.tensor)
        if q_fq is None:
            continue
        if q_fq.shape != layer.value.shape:
            row.reasons.append(f"shape {list(q_fq.shape)} in the fake-quant model")
            continue
        diff = np.abs(layer.value.astype(np.int64) - q_fq)
        row.max_lsb, row.codes_diff = int(diff.max(initial=0)), int(np.count_nonzero(diff))
        d, d_fq = layer.dequantize(), layer.info.dequantize(q_fq)
        row.cos_fq, row.sqnr_fq_db = cosine(d_fq, d), sqnr_db(d_fq, d)
        row.max_abs_fq = float(np.abs(d - d_fq).max(initial=0))
        row.local_lsb = _local_lsb(layer, fq)
        if row.max_lsb > tol:
            row.reasons.append(f"{row.max_lsb} LSB > {tol} vs fake-quant")


def _with_float(
    rows: list[LayerRow],
    layers: list[LayerTensor],
    fl: dict[str, np.ndarray],
    fq: dict[str, np.ndarray],
    tol: float,
) -> None:
    for layer, row in zip(layers, rows, strict=True):
        ref = fl.get(row.float_tensor or "")
        if ref is None or ref.shape != layer.value.shape:
            row.float_tensor = None
            continue
        d = layer.dequantize()
        row.cos_float, row.sqnr_db = cosine(ref, d), sqnr_db(ref, d)
        row.max_abs_float = float(np.abs(ref.astype(np.float64) - d).max(initial=0))
        if row.tensor in fq:
            row.fq_cos_float = cosine(ref, layer.info.dequantize(fq[row.tensor]))
        if row.cos_float < tol:
            row.reasons.append(f"cos {row.cos_float:.4f} < {tol} vs float")


def compare_layers(
    compiled: ModelLike,
    feeds: Mapping[str, np.ndarray],
    *,
    float_model: ModelLike | None = None,
    qdq_model: ModelLike | None = None,
    tol_cos: float = DEFAULT_TOL_COS,
    tol_lsb: int = DEFAULT_TOL_LSB,
    dump: DumpResult | None = None,
) -> GoldenReport:
    """Compare every NPU layer of ``compiled`` (run on ``feeds``) with the float and fake-quant models.

    ``float_model`` / ``qdq_model``: paths or ModelProtos; either may be None (that comparison is skipped
    with a note), not both. ``dump``: the layers when already computed (``dump_layers``). Rows are in
    program order; ``first_divergence`` is the first row outside the tolerances (module docstring).
    Each row also has ``local_lsb`` (the op run alone on fake-quant inputs: what this op adds, as
    opposed to what it carries from earlier layers) and ``fq_cos_float`` (the fake-quant model vs float:
    how much of the distance to float is quantization error).
    """
    if float_model is None and qdq_model is None:
        raise OptionError(
            "golden comparison needs a float model or the quantized (QDQ/FixNeuron) model; give one."
        )
    if tol_lsb < 0 or not -1 <= tol_cos <= 1:
        raise OptionError(
            f"tolerances: tol_cos must be in [-1, 1] and tol_lsb >= 0 (got {tol_cos}, {tol_lsb})."
        )
    compiled_proto = to_proto(compiled)
    dump = dump or dump_layers(compiled_proto, feeds)
    layers, notes = dump.layers, []
    if dump.mismatches:
        notes.append(
            f"the ORT lowering and the reference executor differ on {', '.join(dump.mismatches)} "
            f"(host: {host_int().describe()})"
        )
    rows = [LayerRow.of(x) for x in layers]
    qdq = to_proto(qdq_model) if qdq_model is not None else None
    fq: dict[str, np.ndarray] = {}
    if qdq is None:
        notes.append("no quantized model: the comparison with fake-quant (LSB) is skipped")
    elif is_compiled(qdq):
        raise OptionError(
            f"{_label(qdq_model)}: is a compiled model; give the quantized model it was compiled from."
        )
    else:
        fq = _fake_quant(dump, qdq, feeds, f"quantized model {_label(qdq_model)}")
        _with_fake_quant(rows, layers, fq, tol_lsb)
        if skipped := sum(r.max_lsb is None for r in rows):
            notes.append(f"{skipped} layer(s) made by the compiler have no fake-quant counterpart")
    if float_model is None:
        notes.append("no float model: the comparison with float (cosine, SQNR) is skipped")
    else:
        fmodel = _prepared_float(to_proto(float_model), notes)
        mapping = float_counterparts(qdq if qdq is not None else compiled_proto, layers, fmodel)
        for row in rows:
            row.float_tensor = mapping.get(row.tensor)
        fl = run_exposed(fmodel, feeds, sorted(set(mapping.values())), f"float model {_label(float_model)}")
        _with_float(rows, layers, fl, fq, tol_cos)
        if unmatched := sum(r.float_tensor is None for r in rows):
            notes.append(f"{unmatched} layer(s) have no tensor of the same meaning in the float model")
    first = next((r for r in rows if r.diverged), None)
    return GoldenReport(rows, first, tol_cos, tol_lsb, _label(float_model), _label(qdq_model), notes)
