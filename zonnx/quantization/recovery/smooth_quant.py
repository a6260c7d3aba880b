"""SmoothQuant: move activation outliers into the weights of the linear ops that read them.

For a linear op ``Y = X W`` (X [..., K] per input channel j, W [K, N]) and any s > 0 per channel::

    Y = (X diag(s)^-1) (diag(s) W)

so dividing channel j of X by s_j and multiplying row j of W by s_j leaves Y unchanged, while the
per-tensor activation range shrinks to that of the smoothed channels. With alpha in [0, 1]::

    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)

max|X_j| over every calibration token, max|W_j| over row j of every weight that reads X (Q, K and V
projections of one LayerNorm output share one s). s_j = 1 where either maximum is 0; s is clipped
to [1e-5, 1e5]. Ops: MatMul with a constant 2-D B (channel = last axis of A), Gemm with transA=0
(row j of B, or column j when transB=1), and 1x1 Conv with group 1 (channel axis 1, W[:, j]).

Where 1/s goes. With folding, the producer of X absorbs it when every reader of X is smoothed:
LayerNormalization (Scale and B divided by s); a Mul or Div by a constant (the constant scaled); an Add
or Sub of a constant (the constant divided, then the same fold into its other input when that is read
only by it, as in a decomposed LayerNorm's ``Add(Mul(n, gamma), beta)``, else that input multiplied by
1/s right there: the gamma of a decomposed LayerNorm whose gamma of ones was removed as a no-op); or a
MatMul, Gemm or Conv whose output channels are X's channels (those columns or filters, and the bias,
divided). Otherwise (X also read elsewhere, e.g. by a post-LN residual Add, or a producer that cannot
take the scale) an explicit ``Mul(X, 1/s)`` is inserted before the smoothed readers; the quantizer
then quantizes its output like any activation. That helps when X itself is not quantized (e.g.
op_types_to_quantize=["MatMul"]); when X is quantized anyway its error is already made. (Folding into
the LayerNorm and giving the residual ``Mul(X/s, s)`` instead measured worse on the BERT zoo model in
both settings: it adds a quantization of X/s, or a second one, to the residual stream.)
"""

from __future__ import annotations

__all__ = [
    "SmoothGroup",
    "SmoothQuantResult",
    "smooth_groups",
    "smooth_scales",
    "apply_smoothing",
    "smooth_quant",
    "smooth_quant_reader",
]

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from zonnx.errors import OptionError
from zonnx.ir.io import to_proto
from zonnx.passes.fusion.matching import Context, const_array, label, prune
from zonnx.quantization.calibration.readers import validated
from zonnx.quantization.recovery.channel_stats import channel_absmax
from zonnx.quantization.recovery.replay import TwoPass

logger = logging.getLogger(__name__)

#: Bounds of a smoothing factor.
S_MIN, S_MAX = 1e-5, 1e5


@dataclasses.dataclass
class SmoothGroup:
    """An activation and the linear readers smoothed with it: (node, weight input index, weight row axis)."""

    activation: ir.Value
    axis: int  # channel axis of the activation, negative
    rank: int
    readers: list[tuple[ir.Node, int, int]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class SmoothQuantResult:
    """What SmoothQuant did: activations smoothed, scales folded into producers, Mul nodes inserted."""

    alpha: float
    folding: bool
    smoothed: int = 0
    folded: int = 0
    inserted: int = 0
    samples: int = 0
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # activation -> reason
    outlier_ratio: dict[str, float] = dataclasses.field(default_factory=dict)  # max_j / median_j of max|X_j|

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _reader(node: ir.Node) -> tuple[int, int, int] | str | None:
    """(weight input index, weight row axis, activation channel axis) of a linear reader; a reason; or None."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm", "Conv"):
        return None
    if len(node.inputs) < 2 or node.inputs[0] is None or const_array(node.inputs[0]) is not None:
        return None
    w = const_array(node.inputs[1])
    if w is None:
        return None
    if w.dtype.kind != "f":
        return f"{label(node)}: weight is {w.dtype}"
    if node.op_type == "MatMul":
        return (1, 0, -1) if w.ndim == 2 else f"{label(node)}: weight has rank {w.ndim}"
    if node.op_type == "Gemm":
        if node.attributes.get_int("transA", 0):
            return f"{label(node)}: transA=1"
        return 1, 1 if node.attributes.get_int("transB", 0) else 0, -1
    if node.attributes.get_int("group", 1) != 1 or w.ndim < 3 or any(d != 1 for d in w.shape[2:]):
        return None  # only 1x1 Conv with group 1 is a per-channel linear map
    return 1, 1, 1 - w.ndim


def smooth_groups(model: ir.Model) -> tuple[list[SmoothGroup], dict[str, str]]:
    """The activations read by MatMul/Gemm/1x1 Conv with constant weights, grouped; and the refusals."""
    groups: dict[str, SmoothGroup] = {}
    skipped: dict[str, str] = {}
    ctx = Context(model)
    for node in model.graph:
        found = _reader(node)
        if found is None:
            continue
        x = node.inputs[0]
        if isinstance(found, str):
            skipped[x.name] = found
            continue
        w_index, row_axis, axis = found
        rank = ctx.rank(x)  # runs shape inference once when a shape is missing
        if rank is None or (x.dtype is not None and x.dtype != ir.DataType.FLOAT):
            skipped[x.name] = f"{x.name}: rank unknown or not float32"
            continue
        group = groups.setdefault(x.name, SmoothGroup(x, axis, rank))
        if group.axis != axis:
            skipped[x.name] = f"{x.name}: read by linear ops on different channel axes"
            continue
        group.readers.append((node, w_index, row_axis))
    out = []
    for name, g in groups.items():
        if name in skipped:
            continue
        sizes = {const_array(n.inputs[i]).shape[a] for n, i, a in g.readers}
        if len(sizes) != 1:
            skipped[name] = (
                f"{name}: its readers' weights have different input channel counts {sorted(sizes)}"
            )
            continue
        out.append(g)
    return out, skipped


def smooth_scales(x_max: np.ndarray, w_max: np.ndarray, alpha: float) -> np.ndarray:
    """s = max|X|^alpha / max|W|^(1-alpha) per channel, 1 where either is 0, clipped to [S_MIN, S_MAX]."""
    x = x_max.astype(np.float64)
    w = w_max.astype(np.float64)
    ok = (x > 0) & (w > 0) & np.isfinite(x) & np.isfinite(w)
    s = np.ones_like(x)
    s[ok] = np.power(x[ok], alpha) / np.power(w[ok], 1.0 - alpha)
    return np.clip(s, S_MIN, S_MAX)


def _scaled(c: np.ndarray, factor: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """``c * factor`` with ``factor`` on the channel ``axis`` of a rank-``rank`` value; ``c`` gains leading
    dims only when it has no channel axis of its own (a LayerNorm scale [C] stays [C])."""
    neg = axis - rank if axis >= 0 else axis
    padded = c.reshape((1,) * max(0, -neg - c.ndim) + c.shape)
    shape = [1] * padded.ndim
    shape[neg] = len(factor)
    return (padded.astype(np.float64) * factor.reshape(shape)).astype(c.dtype)


def _row_absmax(w: np.ndarray, row_axis: int) -> np.ndarray:
    """max |W| over everything but ``row_axis`` (the input channels)."""
    return np.abs(w).max(axis=tuple(d for d in range(w.ndim) if d != row_axis))


Edit = Callable[[Context, np.ndarray], None]


def _set_const(ctx: Context, node: ir.Node, index: int, array: np.ndarray) -> None:
    """Give ``node`` a new initializer as input ``index`` (the old constant stays if others read it)."""
    old = node.inputs[index]
    assert node.graph is not None
    hint = f"{old.name}_smooth" if old is not None and old.name else "smooth"
    node.replace_input_with(index, ctx.initializer(node.graph, hint, array))
    prune([old])


def _const_edit(node: ir.Node, index: int, axis: int, rank: int, power: int) -> Edit | str:
    """Scale the constant input ``index`` of ``node`` by s**power along the channel axis."""
    c = const_array(node.inputs[index])
    if c is None or c.dtype.kind != "f":
        return f"{label(node)}: input {index} is not a float constant"
    if c.ndim > rank:
        return f"{label(node)}: constant of rank {c.ndim} above the activation's {rank}"

    def edit(ctx: Context, s: np.ndarray) -> None:
        _set_const(ctx, node, index, _scaled(const_array(node.inputs[index]), s**power, axis, rank))

    return edit


def _weight_columns_edit(node: ir.Node, index: int, col_axis: int) -> Edit | str:
    """Divide the output-channel slices (``col_axis`` of the constant weight) by s."""
    w = const_array(node.inputs[index])
    if w is None or w.dtype.kind != "f":
        return f"{label(node)}: weight is not a float constant"

    def edit(ctx: Context, s: np.ndarray) -> None:
        cur = const_array(node.inputs[index])
        shape = [1] * cur.ndim
        shape[col_axis] = len(s)
        _set_const(ctx, node, index, (cur.astype(np.float64) / s.reshape(shape)).astype(cur.dtype))

    return edit


def _input_mul_edit(node: ir.Node, index: int, axis: int) -> Edit:
    """Make input ``index`` of ``node`` read ``Mul(input, 1/s)`` (s on the channel ``axis``)."""

    def edit(ctx: Context, s: np.ndarray) -> None:
        x = node.inputs[index]
        assert node.graph is not None and x is not None
        shape = [1] * (-axis)
        shape[0] = len(s)
        inv = ctx.initializer(node.graph, f"{x.name}_smooth_inv", (1.0 / s).reshape(shape).astype(np.float32))
        out = ir.Value(name=f"{x.name}_smoothed", type=x.type, shape=x.shape)
        node.graph.insert_before(node, ir.node("Mul", [x, inv], outputs=[out], name=f"{x.name}_smooth_Mul"))
        node.replace_input_with(index, out)

    return edit


def _fold_plan(value: ir.Value, axis: int, rank: int, readers: set[ir.Node]) -> list[Edit] | str:
    """Edits that divide ``value``'s channels by s inside its producer, or why that is not possible."""
    if value.is_graph_output():
        return f"{value.name} is a graph output"
    for node in value.consumers():
        if node not in readers:
            return f"{value.name} is also read by {label(node)}"
    node = value.producer()
    if node is None:
        return f"{value.name} is a graph input or constant"
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
    ins = list(node.inputs)
    consts = [i for i, v in enumerate(ins) if v is not None and const_array(v) is not None]
    if op == "LayerNormalization":
        ln_axis = node.attributes.get_int("axis", -1)
        if axis != -1 or ln_axis not in (-1, rank - 1):
            return f"{label(node)}: normalizes axis {ln_axis}, not the channel axis"
        edits = [_const_edit(node, i, axis, rank, -1) for i in (1, 2) if i < len(ins) and ins[i] is not None]
        bad = [e for e in edits if isinstance(e, str)]
        return bad[0] if bad else edits  # type: ignore[return-value]
    if op in ("Mul", "Div", "Add", "Sub") and len(ins) == 2 and len(consts) == 1:
        c = consts[0]
        if op == "Div" and c == 0:
            return f"{label(node)}: divides a constant by the activation"
        edit = _const_edit(node, c, axis, rank, 1 if op == "Div" else -1)
        if isinstance(edit, str):
            return edit
        if op in ("Mul", "Div"):
            return [edit]
        rest = _fold_plan(ins[1 - c], axis, rank, {node})
        if isinstance(
            rest, str
        ):  # scale the other input here: a LayerNorm affine whose gamma of ones was removed
            rest = [_input_mul_edit(node, 1 - c, axis)]
        return [edit, *rest]
    if op in ("MatMul", "Gemm") and axis == -1 and 1 in consts and 0 not in consts:
        w = const_array(ins[1])
        if w.ndim != 2:
            return f"{label(node)}: weight has rank {w.ndim}"
        col = 0 if op == "Gemm" and node.attributes.get_int("transB", 0) else 1
        edits: list[Edit | str] = [_weight_columns_edit(node, 1, col)]
        if op == "Gemm" and len(ins) > 2 and ins[2] is not None:
            edits.append(_const_edit(node, 2, -1, 2, -1))
        bad = [e for e in edits if isinstance(e, str)]
        return bad[0] if bad else edits  # type: ignore[return-value]
    if op == "Conv" and axis == 1 - rank and 1 in consts and node.attributes.get_int("group", 1) == 1:
        edits = [_weight_columns_edit(node, 1, 0)]
        if len(ins) > 2 and ins[2] is not None:
            edits.append(_const_edit(node, 2, 0, 1, -1))
        bad = [e for e in edits if isinstance(e, str)]
        return bad[0] if bad else edits  # type: ignore[return-value]
    return f"producer {label(node)} ({op}) cannot absorb the scale"


def _insert_mul(
    ctx: Context, g: SmoothGroup, factor: np.ndarray, readers: Iterable[ir.Node], what: str
) -> None:
    """Insert ``Mul(X, factor)`` (factor on X's channel axis) before the first of ``readers`` and point
    every input of theirs that reads X at its output."""
    graph = ctx.model.graph
    x = g.activation
    readers = set(readers)
    shape = [1] * (-g.axis)
    shape[0] = len(factor)
    const = ctx.initializer(graph, f"{x.name}_{what}", factor.reshape(shape).astype(np.float32))
    out = ir.Value(name=f"{x.name}_{what}ed", type=x.type, shape=x.shape)
    mul = ir.node("Mul", [x, const], outputs=[out], name=f"{x.name}_{what}_Mul")
    graph.insert_before(next(n for n in graph if n in readers), mul)
    for node in readers:
        for i, v in enumerate(node.inputs):
            if v is x:
                node.replace_input_with(i, out)


def apply_smoothing(
    model: ir.Model,
    groups: Sequence[SmoothGroup],
    x_max: Mapping[str, np.ndarray],
    alpha: float,
    folding: bool,
    result: SmoothQuantResult,
) -> None:
    """Scale each group's weights by s and its activation by 1/s (folded, else an inserted Mul)."""
    ctx = Context(model)
    plans: list[tuple[SmoothGroup, np.ndarray, list[Edit] | str]] = []
    for g in groups:  # scales and fold plans from the unmodified graph
        w_max = np.max([_row_absmax(const_array(n.inputs[i]), a) for n, i, a in g.readers], axis=0)
        xm = x_max[g.activation.name]
        if xm.shape != w_max.shape:
            result.skipped[g.activation.name] = (
                f"{g.activation.name}: {xm.size} measured channels but the weights have {w_max.size}"
            )
            continue
        s = smooth_scales(xm, w_max, alpha)
        readers = {n for n, _, _ in g.readers}
        plan = _fold_plan(g.activation, g.axis, g.rank, readers) if folding else "folding is off"
        plans.append((g, s, plan))
        med = float(np.median(xm))
        result.outlier_ratio[g.activation.name] = float(xm.max() / med) if med > 0 else float("inf")
    for g, s, plan in plans:
        for node, index, row_axis in g.readers:
            w = const_array(node.inputs[index])
            shape = [1] * w.ndim
            shape[row_axis] = len(s)
            _set_const(ctx, node, index, (w.astype(np.float64) * s.reshape(shape)).astype(w.dtype))
        readers = {n for n, _, _ in g.readers}
        if isinstance(plan, str):
            _insert_mul(ctx, g, 1.0 / s, readers, "smooth")
            result.inserted += 1
            logger.debug("SmoothQuant %s: Mul inserted (%s)", g.activation.name, plan)
        else:
            for edit in plan:
                edit(ctx, s)
            result.folded += 1
        result.smoothed += 1


def smooth_quant(
    model: ir.Model,
    feeds: Any,
    *,
    alpha: float = 0.5,
    folding: bool = True,
    providers: Sequence[Any] | None = None,
) -> SmoothQuantResult:
    """Smooth every eligible activation of ``model`` in place, with max|X_j| measured in ORT on ``feeds``
    (a calibration reader with ``get_next()`` or an iterable of feed dicts, checked against the model)."""
    result = SmoothQuantResult(alpha=alpha, folding=folding)
    groups, result.skipped = smooth_groups(model)
    if not groups:
        logger.warning(
            "SmoothQuant: no MatMul/Gemm/1x1 Conv with a constant weight reads an activation; "
            "nothing smoothed"
        )
        return result
    tensors = {g.activation.name: (g.axis, g.rank) for g in groups}
    proto = to_proto(model)
    x_max, result.samples = channel_absmax(proto, tensors, validated(feeds, proto), providers=providers)
    apply_smoothing(model, groups, x_max, alpha, folding, result)
    return result


def smooth_quant_reader(
    model: ir.Model, reader: Any, extra: Any, *, providers: Sequence[Any] | None = None
) -> tuple[Any, dict[str, Any]]:
    """Run SmoothQuant with ``extra``'s SmoothQuantAlpha/SmoothQuantFolding on the reader's feeds; return the
    reader calibration must use next (rewound or replaying, see ``replay``) and the result as a dict."""
    if reader is None:
        raise OptionError(
            "extra_options['SmoothQuant']: needs calibration data to measure activations; pass a "
            "calibration_data_reader (--calib), or remove SmoothQuant."
        )
    two = TwoPass(reader)
    result = smooth_quant(
        model,
        two.first(),
        alpha=extra.smooth_quant_alpha,
        folding=extra.smooth_quant_folding,
        providers=providers,
    )
    reader = two.second()
    logger.info(
        "SmoothQuant alpha %.2f: %d activations smoothed (%d scales folded into producers, %d Mul inserted), "
        "%d skipped, statistics from %d samples (%s)",
        result.alpha,
        result.smoothed,
        result.folded,
        result.inserted,
        len(result.skipped),
        result.samples,
        two.mode,
    )
    return reader, {**result.as_dict(), "reader": two.mode, "partial_statistics": two.partial}
