"""Compare two models tensor by tensor on the same inputs: float vs fake-quant vs compiled NPU model.

Which tensors of A and B are paired depends on what the two models are (``model_kind``):

- float and quantized (QDQ, QOperator, FixNeuron): the per-layer report's tracing
  (``zonnx.quantization.report.layer_report``): each float tensor with the quantized value that holds
  it (dequantized), and the model outputs;
- compiled (NpuSubgraph nodes) and float or quantized: every NPU layer with the counterpart
  ``zonnx.backend.golden.compare_layers`` finds for it, the code ``zonnx run --compare golden`` runs:
  vs float its real value, vs quantized its fake-quant value (then also the code difference in LSB);
- two compiled models: NPU layers of the same tensor name, both dequantized;
- two float or two quantized models: node outputs of the same name, floating point, same shape.

For each pair, with ``r`` the reference (the float side; A when both are of one kind; the fake-quant
side against a compiled model) and ``y`` the other, both float64: cosine ``r.y / (|r| |y|)``,
``SQNR = 10 log10(sum r^2 / sum (r - y)^2)`` dB and ``max |r - y|``. Rows follow A's topological
order (A's node order; a compiled model's program order); the first row with ``cosine < tol_cos`` is the
first divergence: errors propagate forward, so it is the tensor to look at first.
"""

from __future__ import annotations

__all__ = ["TensorDiff", "Comparison", "compare_models", "model_kind", "check_feeds", "DEFAULT_TOL_COS"]

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from zonnx.errors import OptionError, did_you_mean
from zonnx.ir.io import ModelLike, to_proto
from zonnx.verify import cosine

logger = logging.getLogger(__name__)

#: TPU-MLIR's npz_compare cosine threshold, as ``zonnx run --compare golden`` uses.
DEFAULT_TOL_COS = 0.99


@dataclasses.dataclass
class TensorDiff:
    """One tensor of A against its counterpart in B (``other``); ``index`` is its position in A's order."""

    index: int
    tensor: str
    other: str
    op: str
    shape: list[int]
    cosine: float
    sqnr_db: float
    max_abs: float
    via: str
    lsb: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for k in ("cosine", "sqnr_db", "max_abs"):  # strict JSON has no Infinity or NaN
            if not math.isfinite(out[k]):
                out[k] = "nan" if math.isnan(out[k]) else ("inf" if out[k] > 0 else "-inf")
        return out


@dataclasses.dataclass
class Comparison:
    """Rows in A's topological order, the pairing used (``mode``), the tolerance and notes."""

    a: str
    b: str
    mode: str
    rows: list[TensorDiff]
    tol_cos: float = DEFAULT_TOL_COS
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def first_divergence(self) -> TensorDiff | None:
        """The first row (A's order) whose cosine is below ``tol_cos``."""
        return next((r for r in self.rows if r.cosine < self.tol_cos), None)

    def worst(self, n: int) -> list[TensorDiff]:
        """The ``n`` rows of lowest cosine (then lowest SQNR)."""
        return sorted(self.rows, key=lambda r: (r.cosine, r.sqnr_db, r.index))[:n]

    def summary(self) -> str:
        first = self.first_divergence
        if first is None:
            return f"all {len(self.rows)} compared tensors have cosine >= {self.tol_cos}"
        return (
            f"first divergence: tensor {first.index} {first.tensor!r} (op {first.op}): cosine "
            f"{first.cosine:.6f} < {self.tol_cos}, SQNR {first.sqnr_db:.1f} dB, max abs error {first.max_abs:.4g}"
        )

    def to_dict(self) -> dict[str, Any]:
        first = self.first_divergence
        return {
            "a": self.a,
            "b": self.b,
            "mode": self.mode,
            "tol_cos": self.tol_cos,
            "first_divergence": None if first is None else first.to_dict(),
            "summary": self.summary(),
            "notes": list(self.notes),
            "tensors": [r.to_dict() for r in self.rows],
        }


def model_kind(model: onnx.ModelProto) -> str:
    """'compiled' (NpuSubgraph nodes), 'quantized' (any quantization format) or 'float'."""
    from zonnx.backend.compiled import is_compiled
    from zonnx.inspection.quant import detect_quantization

    if is_compiled(model):
        return "compiled"
    return "float" if detect_quantization(model, {}, set()).format == "none" else "quantized"


def _real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def check_feeds(feeds: Mapping[str, np.ndarray], models: Mapping[str, onnx.ModelProto], where: str) -> None:
    """Every input of every model has an array and every array feeds some model; else OptionError."""
    names = {i.name for m in models.values() for i in _real_inputs(m)}
    for name in feeds:
        if name not in names:
            raise OptionError(
                f"{where}: array {name!r} is not an input of the models.{did_you_mean(name, names)} "
                f"Their inputs: {', '.join(sorted(names))}."
            )
    for label, model in models.items():
        for vi in _real_inputs(model):
            if vi.name not in feeds:
                raise OptionError(
                    f"{where}: no array named {vi.name!r}, an input of {label}; the file holds "
                    f"{', '.join(feeds) or 'no arrays'}."
                )


def _diff(r: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """cosine, SQNR dB and max abs error of ``y`` against the reference ``r`` (module docstring)."""
    from zonnx.backend.golden import sqnr_db

    r64, y64 = r.astype(np.float64), y.astype(np.float64)
    return cosine(r64, y64), sqnr_db(r64, y64), float(np.abs(r64 - y64).max(initial=0))


def _positions(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor -> topological position: graph inputs -1, node outputs their node's index."""
    pos = {i.name: -1 for i in _real_inputs(model)}
    for k, node in enumerate(model.graph.node):
        pos.update((o, k) for o in node.output if o)
    return pos


def _ordered(rows: list[TensorDiff], pos: dict[str, int]) -> list[TensorDiff]:
    """Rows sorted by A's position of their tensor (a row A lacks keeps the place after its predecessor)."""
    keyed, last = [], -2
    for r in rows:
        last = pos.get(r.tensor, last)
        keyed.append((last, r))
    out = [r for _, r in sorted(keyed, key=lambda t: t[0])]
    for i, r in enumerate(out):
        r.index = i
    return out


def _producers(model: onnx.ModelProto) -> dict[str, str]:
    return {o: n.op_type for n in model.graph.node for o in n.output if o}


def _traced(a: onnx.ModelProto, b: onnx.ModelProto, a_float: bool, feeds: Mapping[str, np.ndarray],
            notes: list[str]) -> list[TensorDiff]:  # fmt: skip
    from zonnx.quantization.report import layer_report

    fmodel, qmodel = (a, b) if a_float else (b, a)
    report = layer_report(fmodel, qmodel, [dict(feeds)], max_samples=1)
    notes += [f"not traced: {u}" for u in report.unmatched] + [f"skipped: {s}" for s in report.skipped]
    ops, rows, seen = _producers(a), [], set()
    for s in [*report.layers, *report.outputs]:
        if s.tensor in seen:
            continue
        seen.add(s.tensor)
        mine, other = (s.tensor, s.quant_tensor) if a_float else (s.quant_tensor, s.tensor)
        rows.append(TensorDiff(0, mine, other, ops.get(mine, "input"), s.shape, s.cosine, s.sqnr_db,
                               s.max_abs_error, f"traced ({s.via})"))  # fmt: skip
    return rows


def _npu(compiled: onnx.ModelProto, other: onnx.ModelProto, other_float: bool, compiled_is_a: bool,
         feeds: Mapping[str, np.ndarray], notes: list[str]) -> list[TensorDiff]:  # fmt: skip
    from zonnx.backend.golden import compare_layers

    golden = (
        compare_layers(compiled, feeds, float_model=other)
        if other_float
        else compare_layers(compiled, feeds, qdq_model=other)
    )
    notes += [n for n in golden.notes if not n.startswith(("no float model", "no quantized model"))]
    rows = []
    for g in golden.rows:
        if other_float:  # vs the float model's tensor of the same meaning
            stats, peer, via = (g.cos_float, g.sqnr_db, g.max_abs_float), g.float_tensor, "NPU layer vs float"
        else:  # vs the fake-quant value of the same tensor
            stats, peer, via = (g.cos_fq, g.sqnr_fq_db, g.max_abs_fq), g.tensor, "NPU layer vs fake-quant"
        cos, sqnr, max_abs = stats
        if cos is None or sqnr is None or max_abs is None or peer is None:
            continue  # no counterpart (golden's notes count these)
        mine, theirs = (g.tensor, peer) if compiled_is_a else (peer, g.tensor)
        lsb = None if other_float else g.max_lsb
        rows.append(TensorDiff(g.index, mine, theirs, g.kind, g.shape, cos, sqnr, max_abs, via, lsb))
    return rows


def _two_compiled(
    a: onnx.ModelProto, b: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
) -> list[TensorDiff]:
    from zonnx.backend.dump import dump_layers

    theirs = {x.tensor: x for x in dump_layers(b, feeds).layers}
    rows = []
    for x in dump_layers(a, feeds).layers:
        y = theirs.get(x.tensor)
        if y is not None and x.value.shape == y.value.shape:
            diff = _diff(x.dequantize(), y.dequantize())
            rows.append(TensorDiff(x.index, x.tensor, y.tensor, x.op.kind, list(x.value.shape), *diff,
                                   "NPU layer, same name"))  # fmt: skip
    return rows


def _same_name(a: onnx.ModelProto, b: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
               notes: list[str]) -> list[TensorDiff]:  # fmt: skip
    from zonnx.backend.dump import run_exposed

    ops_a, ops_b = _producers(a), _producers(b)
    names = [n for n in ops_a if n in ops_b]
    if not names:
        return []
    va, vb = run_exposed(a, feeds, names, "model A"), run_exposed(b, feeds, names, "model B")
    rows, skipped = [], 0
    for n in names:
        x, y = np.asarray(va[n]), np.asarray(vb[n])
        if x.dtype.kind != "f" or y.dtype.kind != "f" or x.shape != y.shape:
            skipped += 1
            continue
        rows.append(TensorDiff(0, n, n, ops_a[n], list(x.shape), *_diff(x, y), "same name"))
    if skipped:
        notes.append(f"{skipped} tensor(s) of the same name are not floating point or differ in shape")
    return rows


def compare_models(
    a: ModelLike, b: ModelLike, feeds: Mapping[str, np.ndarray], *, tol_cos: float = DEFAULT_TOL_COS
) -> Comparison:
    """Compare every tensor A and B share on ``feeds`` (one input dict); see the module docstring.

    OptionError when ``tol_cos`` is outside [-1, 1] or the models share no tensor.
    """
    if not -1 <= tol_cos <= 1:
        raise OptionError(f"tolerance cos={tol_cos}: a cosine lies in [-1, 1]; 0.99 is the usual threshold.")
    pa, pb = to_proto(a), to_proto(b)
    label_a = str(a) if not isinstance(a, onnx.ModelProto) else "model A"
    label_b = str(b) if not isinstance(b, onnx.ModelProto) else "model B"
    ka, kb = model_kind(pa), model_kind(pb)
    notes: list[str] = []
    if ka == kb == "compiled":
        mode, rows = "two compiled models: NPU layers of the same name", _two_compiled(pa, pb, feeds)
    elif "compiled" in (ka, kb):
        a_is_compiled = ka == "compiled"
        compiled, other = (pa, pb) if a_is_compiled else (pb, pa)
        other_float = (kb if a_is_compiled else ka) == "float"
        mode = f"NPU layers vs {'float' if other_float else 'fake-quant'} (golden)"
        rows = _npu(compiled, other, other_float, a_is_compiled, feeds, notes)
        if a_is_compiled:
            rows.sort(key=lambda r: r.index)  # program order is A's order
    elif {ka, kb} == {"float", "quantized"}:
        mode, rows = "float vs quantized: traced tensors", _traced(pa, pb, ka == "float", feeds, notes)
    else:
        mode, rows = f"two {ka} models: tensors of the same name", _same_name(pa, pb, feeds, notes)
    if not rows:
        raise OptionError(
            f"{label_a} ({ka}) and {label_b} ({kb}) share no tensor to compare ({mode}); give two forms "
            "of the same network (float, quantized, compiled)."
        )
    rows = rows if ka == "compiled" else _ordered(rows, _positions(pa))
    result = Comparison(label_a, label_b, mode, rows, tol_cos, notes)
    logger.info("compare: %d tensors (%s); %s", len(rows), mode, result.summary())
    return result
