"""Multiply-accumulate counts per op type from inferred shapes.

MAC rules (one MAC is one multiply plus one add; N is the batch; shapes are the inferred ones):

- Conv, ConvInteger, QLinearConv (and com.microsoft FusedConv): ``N * C_out * prod(out spatial) * (C_in / group) * prod(kernel)``,
  i.e. ``numel(Y) * prod(W.shape[1:])`` since ``W`` is ``[C_out, C_in/group, *kernel]``.
- ConvTranspose: ``N * C_in * prod(in spatial) * (C_out / group) * prod(kernel)``,
  i.e. ``numel(X) * prod(W.shape[1:])`` since ``W`` is ``[C_in, C_out/group, *kernel]``.
- Gemm (and com.microsoft QGemm): ``M * N * K = numel(Y) * K`` with ``K = A.shape[0]`` if ``transA`` else ``A.shape[1]``.
- MatMul, MatMulInteger, QLinearMatMul (and com.microsoft MatMulIntegerToFloat,
  DynamicQuantizeMatMul): ``numel(Y) * K`` with ``K = A.shape[-1]`` (broadcast batch
  dims are part of ``numel(Y)``).

Bias additions are not counted. A node's MACs are *unknown*, never zero, when a shape it needs is
missing or holds a dim that is not a number (a symbolic dim or one inference could not compute).
For counting, input dims that are not numbers are set first (``fix_input_shapes``).
"""

from __future__ import annotations

__all__ = [
    "MAC_OPS",
    "FixedDim",
    "OpMacs",
    "UnknownMacs",
    "Macs",
    "fix_input_shapes",
    "node_macs",
    "count_macs",
    "node_macs_by_name",
]

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from zonnx.errors import OptionError, did_you_mean
from zonnx.inspection.folding import infer_folded
from zonnx.inspection.shapes import (
    DEFAULT_DOMAINS,
    INFERENCE_SYMBOL,
    ValueType,
    iter_graphs,
    iter_nodes,
    op_key,
    shape_skeleton,
    value_types,
)

logger = logging.getLogger(__name__)

#: (domain, op type) -> (data input, weight input, rule); the rules are in the module docstring.
MAC_OPS: dict[tuple[str, str], tuple[int, int, str]] = {
    ("", "Conv"): (0, 1, "conv"),
    ("", "ConvInteger"): (0, 1, "conv"),
    ("", "QLinearConv"): (0, 3, "conv"),
    ("", "ConvTranspose"): (0, 1, "conv_transpose"),
    ("", "Gemm"): (0, 1, "gemm"),
    ("", "MatMul"): (0, 1, "matmul"),
    ("", "MatMulInteger"): (0, 1, "matmul"),
    ("", "QLinearMatMul"): (0, 3, "matmul"),
    ("com.microsoft", "FusedConv"): (0, 1, "conv"),
    ("com.microsoft", "QGemm"): (0, 3, "gemm"),
    ("com.microsoft", "MatMulIntegerToFloat"): (0, 1, "matmul"),
    ("com.microsoft", "DynamicQuantizeMatMul"): (0, 1, "matmul"),
}


def _mac_rule(node: onnx.NodeProto) -> tuple[int, int, str] | None:
    domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
    return MAC_OPS.get((domain, node.op_type))


@dataclasses.dataclass
class FixedDim:
    """A graph-input dim given a number for counting MACs.

    ``symbol`` is the dim's name ('?' when unnamed); ``source`` is 'batch' (set to the batch) or
    'shape' (given by the caller), also for dims that share their name with such a dim.
    """

    input: str
    axis: int
    symbol: str
    value: int
    source: str


@dataclasses.dataclass
class OpMacs:
    """MACs of one op type: ``macs`` sums the ``nodes - unknown`` nodes whose shapes are known."""

    op_type: str
    nodes: int
    macs: int
    unknown: int


@dataclasses.dataclass
class UnknownMacs:
    """A node whose MACs could not be counted and why."""

    node: str
    op_type: str
    reason: str


@dataclasses.dataclass
class Macs:
    """MAC counts: ``total`` sums the known nodes; ``complete`` is False when any node is unknown.

    ``batch`` is the value symbolic batch dims were set to (None when the model had none);
    ``fixed_dims`` lists every input dim that was set; ``unknown_dims`` the input dims left without
    a number (``"x[2] ('H')"``), which keep the nodes that depend on them from being counted.
    """

    total: int = 0
    complete: bool = True
    by_op: list[OpMacs] = dataclasses.field(default_factory=list)
    unknown: list[UnknownMacs] = dataclasses.field(default_factory=list)
    unknown_dims: list[str] = dataclasses.field(default_factory=list)
    batch: int | None = None
    fixed_dims: list[FixedDim] = dataclasses.field(default_factory=list)


def _symbol(d: onnx.TensorShapeProto.Dimension) -> str | None:
    """The dim's name, None when it has none (or the anonymous '?')."""
    return d.dim_param if d.HasField("dim_param") and d.dim_param not in ("", "?") else None


def _numeric(d: onnx.TensorShapeProto.Dimension) -> bool:
    return d.HasField("dim_value") and d.dim_value > 0


def _check_shapes(by_name: Mapping[str, onnx.ValueInfoProto], shapes: Mapping[str, Sequence[int]]) -> None:
    for name, dims in shapes.items():
        if name not in by_name:
            raise OptionError(
                f"input shape for {name!r}: the model has no input of that name.{did_you_mean(name, by_name)} "
                f"Inputs: {', '.join(by_name) or '(none)'}."
            )
        tt = by_name[name].type.tensor_type
        if tt.HasField("shape") and len(tt.shape.dim) != len(dims):
            raise OptionError(
                f"input shape for {name!r}: the input has rank {len(tt.shape.dim)}, got {len(dims)} dims."
            )
        for axis, (d, v) in enumerate(zip(tt.shape.dim, dims, strict=False)):
            if v < 1 or (_numeric(d) and d.dim_value != v):
                raise OptionError(
                    f"input shape for {name!r}: dim {axis} is {v}, but the model says "
                    f"{d.dim_value or d.dim_param or '?'}; give a positive size that fits the model."
                )


def fix_input_shapes(
    model: onnx.ModelProto, batch: int, shapes: Mapping[str, Sequence[int]] | None = None
) -> tuple[list[FixedDim], list[str]]:
    """Give graph-input dims numbers in place; return (dims set, dims left without a number).

    ``shapes`` sets whole inputs by name. In the other inputs a leading dim that is not a number gets
    ``batch``, and a named dim gets the value its name was given anywhere else (names are shared
    across inputs, as in ONNX). Dims left open are described as ``"x[2] ('H')"``.
    """
    if batch < 1:
        raise OptionError(f"batch: must be at least 1, got {batch}.")
    inits = {t.name for t in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits and vi.type.HasField("tensor_type")]
    shapes = dict(shapes or {})
    _check_shapes({vi.name: vi for vi in inputs}, shapes)
    symbols: dict[str, tuple[int, str]] = {}
    for vi in inputs:
        dims = vi.type.tensor_type.shape.dim
        if vi.name in shapes:
            for d, v in zip(dims, shapes[vi.name], strict=False):
                if _symbol(d):
                    symbols[_symbol(d)] = (int(v), "shape")  # type: ignore[index]
    for vi in inputs:
        dims = vi.type.tensor_type.shape.dim
        if vi.name not in shapes and dims and not _numeric(dims[0]) and _symbol(dims[0]):
            symbols.setdefault(_symbol(dims[0]), (batch, "batch"))  # type: ignore[arg-type]
    fixed: list[FixedDim] = []
    left: list[str] = []
    for vi in inputs:
        tt = vi.type.tensor_type
        if vi.name in shapes and not tt.HasField("shape"):
            for _ in shapes[vi.name]:
                tt.shape.dim.add()
        for axis, d in enumerate(tt.shape.dim):
            if _numeric(d):
                continue
            symbol = _symbol(d)
            if vi.name in shapes:
                value, source = int(shapes[vi.name][axis]), "shape"
            elif symbol in symbols:
                value, source = symbols[symbol]  # type: ignore[index]
            elif axis == 0:
                value, source = batch, "batch"
            else:
                left.append(f"{vi.name}[{axis}] ({symbol or '?'!r})")
                continue
            d.Clear()
            d.dim_value = value
            fixed.append(FixedDim(vi.name, axis, symbol or "?", value, source))
        if not tt.HasField("shape"):
            left.append(f"{vi.name} (no shape)")
    _set_symbols(model, {f.symbol: f.value for f in fixed if f.symbol != "?"})
    return fixed, left


def _set_symbols(model: onnx.ModelProto, values: Mapping[str, int]) -> None:
    """Give every declared dim named in ``values`` (value_info, outputs, subgraphs too) its number,
    so declared shapes such as ``[N, 16, 8, 8]`` do not keep the symbol after inference."""
    if not values:
        return
    for graph in iter_graphs(model.graph):
        for vi in [*graph.value_info, *graph.output]:
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param") and d.dim_param in values:
                    value = values[d.dim_param]
                    d.Clear()
                    d.dim_value = value


def _known(name: str, types: Mapping[str, ValueType]) -> tuple[tuple[int, ...] | None, str]:
    """Concrete dims of ``name``, else (None, why not)."""
    vt = types.get(name)
    if vt is None or vt.dims is None:
        return None, f"{name!r} has no inferred shape"
    symbolic = [d for d in vt.dims if isinstance(d, str) and not d.startswith(INFERENCE_SYMBOL)]
    if symbolic:
        return None, f"{name!r} has symbolic dim(s) {', '.join(map(repr, symbolic))}"
    if any(not isinstance(d, int) for d in vt.dims):
        return None, f"{name!r} has a dim shape inference could not compute"
    return tuple(int(d) for d in vt.dims), ""  # type: ignore[arg-type]


def _attr(node: onnx.NodeProto, name: str) -> int:
    return next((a.i for a in node.attribute if a.name == name), 0)


def _reduction_dim(node: onnx.NodeProto, types: Mapping[str, ValueType]) -> tuple[int | None, str]:
    """K of a Gemm/MatMul-like node: from A, else from B (the weight is usually the known one)."""
    a_idx, b_idx, rule = _mac_rule(node)  # type: ignore[misc]
    a, why_a = _known(node.input[a_idx], types)
    b, _ = _known(node.input[b_idx], types) if len(node.input) > b_idx else (None, "")
    if rule == "gemm":
        if a is not None and len(a) == 2:
            return a[0] if _attr(node, "transA") else a[1], ""
        if b is not None and len(b) == 2:
            return b[1] if _attr(node, "transB") else b[0], ""
    else:
        if a is not None and a:
            return a[-1], ""
        if b is not None and b:
            return b[0] if len(b) == 1 else b[-2], ""
    return None, why_a


def _matmul_out(node: onnx.NodeProto, types: Mapping[str, ValueType]) -> tuple[int, ...] | None:
    """Output dims of a Gemm/MatMul-like node computed from A and B (for ops onnx cannot infer)."""
    a_idx, b_idx, rule = _mac_rule(node)  # type: ignore[misc]
    a, _ = _known(node.input[a_idx], types)
    b, _ = _known(node.input[b_idx], types) if len(node.input) > b_idx else (None, "")
    if a is None or b is None or not a or not b:
        return None
    if rule == "gemm":
        if len(a) != 2 or len(b) != 2:
            return None
        return (a[1] if _attr(node, "transA") else a[0], b[0] if _attr(node, "transB") else b[1])
    a2, b2 = (a if len(a) > 1 else (1, *a)), (b if len(b) > 1 else (*b, 1))
    try:
        batch = tuple(int(d) for d in np.broadcast_shapes(a2[:-2], b2[:-2]))
    except ValueError:
        return None
    return batch + (a2[-2],) * (len(a) > 1) + (b2[-1],) * (len(b) > 1)


def node_macs(node: onnx.NodeProto, types: Mapping[str, ValueType]) -> tuple[int | None, str]:
    """MACs of one node by the module's rules, or (None, why) when a shape it needs is not known."""
    x_idx, w_idx, rule = _mac_rule(node)  # type: ignore[misc]
    if rule in ("gemm", "matmul"):
        out, why = _known(node.output[0], types)
        out = out if out is not None else _matmul_out(node, types)
        if out is None:
            return None, why
        k, why = _reduction_dim(node, types)
        return (None, why) if k is None else (math.prod(out) * k, "")
    # convolutions: numel(Y) (ConvTranspose: numel(X)) times prod(W.shape[1:])
    big, why = _known(node.input[x_idx] if rule == "conv_transpose" else node.output[0], types)
    if big is None:
        return None, why
    w, why = _known(node.input[w_idx], types)
    if w is None:
        return None, why
    return math.prod(big) * math.prod(w[1:]), ""


def _node_label(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type}->{node.output[0] if node.output else '?'}"


def count_macs(model: onnx.ModelProto, types: Mapping[str, ValueType]) -> Macs:
    """Count MACs for every MAC op (subgraphs included) of ``model`` using the inferred ``types``."""
    macs = Macs()
    per_op: dict[str, OpMacs] = {}
    for node, _ in iter_nodes(model.graph):
        if _mac_rule(node) is None:
            continue
        key = op_key(node)
        entry = per_op.setdefault(key, OpMacs(key, 0, 0, 0))
        entry.nodes += 1
        n, reason = node_macs(node, types)
        if n is None:
            entry.unknown += 1
            macs.unknown.append(UnknownMacs(_node_label(node), key, reason))
        else:
            entry.macs += n
    macs.by_op = sorted(per_op.values(), key=lambda e: (-e.macs, -e.nodes, e.op_type))
    macs.total = sum(e.macs for e in macs.by_op)
    macs.complete = not macs.unknown
    return macs


def node_macs_by_name(
    model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> dict[str, int | None]:
    """MACs of every main-graph node (0 for ops without a MAC rule, None when shapes are unknown); the
    inputs' dims fixed to ``input_shapes`` and the shape arithmetic they make constant folded, as
    ``zonnx inspect`` counts them."""
    skeleton = shape_skeleton(model)
    fix_input_shapes(skeleton, 1, input_shapes)
    inferred, _ = infer_folded(skeleton)
    types = value_types(inferred if inferred is not None else skeleton)
    out: dict[str, int | None] = {}
    for node in model.graph.node:
        key = (node.domain if node.domain != "ai.onnx" else "", node.op_type)
        out[node.name] = node_macs(node, types)[0] if key in MAC_OPS else 0
    return out
