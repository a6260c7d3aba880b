"""Re-express imported grids in the plan of a target: pin activation ranges, say what changed.

Activations: the source grid's range ``[lo, hi] = [(qmin - z) s, (qmax - z) s]`` becomes the plan's fixed
range, so the target's own rules make its parameters: a symmetric target takes ``max(|lo|, |hi|)`` on both
sides, a power-of-two target the finest position whose grid holds the range. A planned tensor with no
grid of its own takes one by these rules, else it is calibrated (calibration data needed):

- the output of a sign-keeping op (MaxPool, Reshape, Flatten, ...) takes its input's grid;
- the output of a Relu takes ``[0, hi]`` of its input's grid; the input of a Relu whose output has a grid
  takes that grid (the source quantized after the ReLU, clipping what lies below 0 anyway).

Weights keep their float values (the source's dequantized codes) and get the target's parameters from
them. Per tensor, the change is *kept* (same step, zero point and type), *snapped* (with the step ratio
and, for weights, the SQNR of the target's codes against the source weights), *propagated* or
*calibrated*. On calibration samples the output of the retargeted model is compared with the source
model run by ONNX Runtime (cosine, SQNR); without samples no check is done, and the report says so.
"""

from __future__ import annotations

__all__ = [
    "GridChange",
    "RetargetReport",
    "pin_ranges",
    "keep_unsigned",
    "grid_changes",
    "compare_outputs",
    "exact_session",
    "source_outputs",
]

import dataclasses
import logging
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from zonnx.errors import VerificationError, first_line
from zonnx.quantization.plan import QuantPlan, Role
from zonnx.quantization.prequant.grids import Grid
from zonnx.quantization.prequant.importer import ImportedModel
from zonnx.quantization.schemes import QuantParams, dequantize, qdtype, quantize

logger = logging.getLogger(__name__)

_SIGN_KEEPING = frozenset(
    {"MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Identity", "GlobalMaxPool",
     "Resize", "Gather", "Split", "DepthToSpace", "SpaceToDepth", "Expand", "Tile"}
)  # fmt: skip


@dataclasses.dataclass
class GridChange:
    """One quantized tensor of the retargeted model against the source's grid."""

    tensor: str
    role: str
    action: str  # kept | snapped | propagated | calibrated
    source: str
    target: str
    step_ratio: float | None = None
    weight_sqnr_db: float | None = None


@dataclasses.dataclass
class RetargetReport:
    """What retargeting did: the source form, per-tensor changes, and the check against the source."""

    form: str
    changes: list[GridChange]
    outputs: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    checked: bool = False
    notes: list[str] = dataclasses.field(default_factory=list)

    def counts(self) -> Counter[str]:
        return Counter(f"{c.role} {c.action}" for c in self.changes)

    def summary(self) -> str:
        """One line: form, counts by action, and the output check (or that none was done)."""
        parts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts().items()))
        if self.checked:
            worst = min(self.outputs.values(), key=lambda r: r["cosine"]) if self.outputs else None
            check = (f"against the source on calibration samples: cosine {worst['cosine']:.5f}, SQNR "
                     f"{worst['sqnr_db']:.1f} dB (worst output)" if worst else "no outputs compared")  # fmt: skip
        else:
            check = "no accuracy check against the source was done (no calibration data)"
        return f"retargeted a pre-quantized {self.form} model: {parts}; {check}"

    def to_json(self) -> dict[str, Any]:
        return {"form": self.form, "changes": [dataclasses.asdict(c) for c in self.changes],
                "outputs": self.outputs, "checked": self.checked, "notes": self.notes}  # fmt: skip


def _relu_grid(grid: Grid) -> tuple[float, float]:
    return 0.0, max(grid.real_range()[1], 0.0)


def _propagated(
    name: str, model: ir.Model, ranges: dict[str, tuple[float, float]]
) -> tuple[float, float] | None:
    """A range for a planned tensor without a grid, from its producer's input or its Relu reader."""
    values = ir.convenience.create_value_mapping(model.graph)
    value = values.get(name)
    if value is None:
        return None
    node = value.producer()
    if node is not None and node.inputs and node.inputs[0] is not None and node.inputs[0].name in ranges:
        src = ranges[node.inputs[0].name]
        if node.op_type in _SIGN_KEEPING:
            return src
        if node.op_type == "Relu":
            return 0.0, max(src[1], 0.0)
    for user in value.consumers():
        if user.op_type == "Relu" and user.outputs[0].name in ranges:
            return ranges[user.outputs[0].name]
    return None


def pin_ranges(plan: QuantPlan, imported: ImportedModel, model: ir.Model) -> dict[str, str]:
    """Set ``fixed_range`` of planned activations from the imported grids; returns tensor -> action.

    Actions: ``imported``, ``propagated``, or ``calibrated`` (no range: calibration must give it).
    """
    ranges = {n: g.real_range() for n, g in imported.activations.items()}
    actions: dict[str, str] = {}
    todo = [n for n in plan.activations() if plan.tensors[n].fixed_range is None]
    for n in todo:
        if n in ranges:
            plan.tensors[n].fixed_range = ranges[n]
            actions[n] = "imported"
    for _ in range(4):  # chains of sign-keeping ops
        for n in todo:
            if n in actions:
                continue
            got = _propagated(n, model, ranges)
            if got is not None:
                plan.tensors[n].fixed_range = ranges[n] = got
                actions[n] = "propagated"
    for n in todo:
        actions.setdefault(n, "calibrated")
    return actions


def keep_unsigned(plan: QuantPlan, imported: ImportedModel, activation_dtypes: Sequence[str]) -> int:
    """Pinned activations whose range holds no negative value take unsigned codes with zero point 0
    when the target lists that unsigned type (e.g. bm1684x: uint8 for non-negative tensors, as TPU-MLIR
    does), instead of a symmetric signed grid twice as coarse; returns how many changed.

    The rule: spec symmetric, signed, not power-of-two; ``u<bits>`` in ``activation_dtypes``; fixed range
    ``[lo, hi]`` with ``lo >= 0``. The tensor is then quantized asymmetric unsigned on ``[0, hi]``, which
    gives zero point 0 and step ``hi / (2^bits - 1)`` (the source's own grid when it was ``u8, z=0``).
    """
    changed = 0
    for name in plan.activations():
        tp = plan.tensors[name]
        spec, rng = tp.spec, tp.fixed_range
        if rng is None or not spec.symmetric or not spec.dtype.signed or spec.power_of_two or tp.fixed_params:
            continue
        unsigned = "u" + spec.dtype.name
        if unsigned not in activation_dtypes or rng[0] < 0 or rng[1] <= 0:
            continue
        tp.spec = dataclasses.replace(spec, dtype=qdtype(unsigned), symmetric=False, restricted=False)
        tp.fixed_range = (0.0, float(rng[1]))
        changed += 1
    return changed


def _describe(p: QuantParams) -> str:
    s = np.asarray(p.scale).reshape(-1)
    z = np.asarray(p.zero_point).reshape(-1)
    kind = "pof2 " if p.pos is not None else ""
    zs = f"z={int(z[0])}" if np.all(z == z[0]) else f"z=[{int(z.min())}, {int(z.max())}]"
    if s.size == 1:
        return f"{p.dtype.name} {kind}s={float(s[0]):.4g} {zs}"
    return f"{p.dtype.name} {kind}per-channel({s.size}) s=[{float(s.min()):.3g}, {float(s.max()):.3g}] {zs}"


def _same(grid: Grid, p: QuantParams) -> bool:
    s_new = np.asarray(p.scale, np.float64).reshape(-1)
    s_old = grid.scale.astype(np.float64).reshape(-1)
    if s_new.size != s_old.size or p.dtype.name != grid.dtype:
        return False
    z_new = np.asarray(p.zero_point, np.int64).reshape(-1)
    return bool(
        np.allclose(s_new, s_old, rtol=1e-6, atol=0) and np.array_equal(z_new, grid.zero_point.reshape(-1))
    )


def _step_ratio(grid: Grid, p: QuantParams) -> float:
    s_new = np.asarray(p.scale, np.float64).reshape(-1)
    s_old = grid.scale.astype(np.float64).reshape(-1)
    if s_new.size != s_old.size:
        s_new, s_old = np.array([s_new.max()]), np.array([s_old.max()])
    return float(np.max(s_new / np.maximum(s_old, 1e-30)))


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((ref.astype(np.float64) - got) ** 2))
    signal = float(np.sum(ref.astype(np.float64) ** 2))
    return math.inf if noise == 0 else 10 * math.log10(max(signal, 1e-30) / noise)


def grid_changes(
    plan: QuantPlan, imported: ImportedModel, model: ir.Model, actions: dict[str, str]
) -> list[GridChange]:
    """Per planned activation and weight: how the target's parameters relate to the source grid."""
    rows: list[GridChange] = []
    inits = model.graph.initializers
    for name, tp in plan.tensors.items():
        if tp.params is None or tp.role is Role.BIAS:
            continue
        if tp.role is Role.ACTIVATION:
            grid = imported.activations.get(name)
            action = actions.get(name, "calibrated")
            if grid is None:
                rows.append(
                    GridChange(
                        name,
                        "activation",
                        action,
                        "dynamic" if name in imported.dynamic else "none",
                        _describe(tp.params),
                    )
                )
                continue
            same = _same(grid, tp.params)
            rows.append(GridChange(name, "activation", "kept" if same else "snapped", grid.describe(),
                                   _describe(tp.params), _step_ratio(grid, tp.params)))  # fmt: skip
            continue
        grid = imported.weights.get(name)
        if grid is None or name not in inits:
            continue
        w = np.asarray(inits[name].const_value.numpy(), np.float32)
        sq = _sqnr(w, dequantize(quantize(w, tp.params), tp.params))
        same = _same(grid, tp.params) or math.isinf(sq)
        rows.append(GridChange(name, "weight", "kept" if same else "snapped", grid.describe(), _describe(tp.params),
                               _step_ratio(grid, tp.params), None if math.isinf(sq) else round(sq, 2)))  # fmt: skip
    return rows


def exact_session(m: onnx.ModelProto | str, providers: Sequence[str] | None = None) -> Any:
    """ORT's session on ``m`` in its exact integer form (``verify.exact_integer_form``: no saturating
    u8 x s8 kernels on a host without VNNI), optimized; when ORT's fusions refuse a valid QDQ graph
    (4-bit codes into QLinearConv), the graph as written; when that fails too, one VerificationError line."""
    import onnxruntime as ort

    from zonnx.ir.io import to_proto
    from zonnx.ir.large import ort_session as large_session
    from zonnx.verify import exact_integer_form

    proto = exact_integer_form(onnx.load(m) if isinstance(m, str) else to_proto(m))
    levels = [ort.GraphOptimizationLevel.ORT_ENABLE_ALL, ort.GraphOptimizationLevel.ORT_DISABLE_ALL]
    while True:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.graph_optimization_level = levels.pop(0)
        try:
            return large_session(proto, opts, list(providers or ["CPUExecutionProvider"]))
        except Exception as e:  # ORT's exception classes share no public base
            first = first_line(e)
            if not levels:
                raise VerificationError(
                    f"onnxruntime cannot run the model to compare outputs with the source: {first}"
                ) from None
            logger.info(
                "comparing outputs: ORT's graph optimizations failed (%s); running it as written", first
            )


def compare_outputs(source: onnx.ModelProto | str, result: onnx.ModelProto, feeds: Sequence[dict[str, Any]],
                    providers: Sequence[str] | None = None) -> dict[str, dict[str, float]]:  # fmt: skip
    """Cosine and SQNR of each output of ``result`` against the source model, both run by ONNX Runtime."""
    src, got = exact_session(source, providers), exact_session(result, providers)
    names = [o.name for o in got.get_outputs() if o.name in {s.name for s in src.get_outputs()}]
    acc: dict[str, list[np.ndarray]] = {n: [] for n in names}
    ref: dict[str, list[np.ndarray]] = {n: [] for n in names}
    want = {i.name for i in src.get_inputs()}
    for feed in feeds:
        f = {k: v for k, v in feed.items() if k in want}
        a = dict(zip(names, src.run(names, f), strict=True))
        b = dict(zip(names, got.run(names, f), strict=True))
        for n in names:
            ref[n].append(np.asarray(a[n], np.float64).ravel())
            acc[n].append(np.asarray(b[n], np.float64).ravel())
    out: dict[str, dict[str, float]] = {}
    for n in names:
        r, g = np.concatenate(ref[n]), np.concatenate(acc[n])
        cos = float(r @ g / max(np.linalg.norm(r) * np.linalg.norm(g), 1e-30))
        sq = _sqnr(r, g)
        out[n] = {"cosine": round(cos, 6), "sqnr_db": round(sq, 2) if not math.isinf(sq) else 999.0}
    return out


def source_outputs(
    source: onnx.ModelProto | str, names: Sequence[str], feeds: Sequence[dict[str, Any]],
    providers: Sequence[str] | None = None,
) -> list[list[np.ndarray]]:  # fmt: skip
    """The source model's outputs ``names`` on each feed, run by ORT exactly (``exact_session``)."""
    sess = exact_session(source, providers)
    want = {i.name for i in sess.get_inputs()}
    return [sess.run(list(names), {k: v for k, v in f.items() if k in want}) for f in feeds]
