"""Refuse a pre-quantized model that holds one layer twice: once in float, once quantized.

A half-converted model, or a QAT export that kept its float branch, can compute a layer twice from
the same input. Retargeting it would quantize the float copy too (from a calibrated range, with no
source grid), so the model written would hold two quantized copies where the user had one of each,
and neither copy alone is what was meant: the import refuses it and names both nodes.

The rule, checked on the imported model (every accepted form is then float weights + grids, the
integer ops rewritten as their float op: QLinearConv and ConvInteger are Conv, QGemm is Gemm,
QLinearMatMul and MatMulInteger are MatMul), for two compute nodes ``a`` and ``b``:

- same op type, one of Conv, ConvTranspose, Gemm, MatMul; a Gemm without transA and with alpha 1 is
  the fully connected layer ``x @ W`` a MatMul computes, its weights compared as ``[K, N]`` (a transB
  weight transposed), since ORT's ``quantize_dynamic`` writes a Gemm as MatMulInteger + Add;
- the same activation tensor of the source model as input 0, read directly or through its quantizer:
  ``DequantizeLinear(QuantizeLinear(x))`` counts as ``x`` (the import makes it ``x``), and so does the
  ``Relu(x)`` the import makes explicit for a grid that holds only values >= 0 (an image input quantized
  with zero point 0);
- weights (input 1) constant and of one shape, ``a``'s float (no source grid) and ``b``'s quantized
  (dequantized codes with step ``s``, per channel along the grid's axis), within one step of each other:
  ``|w_a - w_b| <= s`` for every element. Quantizing ``w_a`` rounds each weight within ``s / 2``; a
  different layer's weights differ by many steps;
- equal attributes once those holding the op's default are dropped (``group=1``, unit strides and
  dilations, zero pads, a ``kernel_shape`` equal to the weights', ``alpha=beta=1``, no transposes).

Biases (and a Gemm's beta) are not compared: a quantized bias lies on the finer grid ``s_x s_w``, and
a dynamic model adds it after the MatMul.
"""

from __future__ import annotations

__all__ = ["DuplicateLayer", "find_duplicate_layers", "refuse_duplicate_layers"]

import dataclasses
import logging
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from zonnx.errors import UnsupportedModelError
from zonnx.passes.fusion.matching import const_array, label
from zonnx.quantization.prequant.grids import Grid

logger = logging.getLogger(__name__)

COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
_DEFAULTS: dict[str, Any] = {
    "auto_pad": "NOTSET",
    "group": 1,
    "alpha": 1.0,
    "beta": 1.0,
    "transA": 0,
    "transB": 0,
}
_DEFAULT_EACH = {"strides": 1, "dilations": 1, "pads": 0, "output_padding": 0}
_FC = "fully connected (MatMul / Gemm)"


@dataclasses.dataclass(frozen=True)
class DuplicateLayer:
    """A layer found twice: its float node, its quantized node, and the source activation both read."""

    float_node: ir.Node
    quantized_node: ir.Node
    activation: str


@dataclasses.dataclass
class _Layer:
    """A compute node as the rule compares it: kind, attributes, weights (and their steps) in one layout."""

    node: ir.Node
    kind: str
    attrs: dict[str, Any]
    weights: np.ndarray
    step: np.ndarray | None  # per weight element; None for float weights


def _attributes(node: ir.Node, kernel: tuple[int, ...]) -> dict[str, Any]:
    """The node's attributes without those holding the op's default value."""
    out: dict[str, Any] = {}
    for name, attr in node.attributes.items():
        value = attr.value
        if isinstance(value, list | tuple):
            value = tuple(value)
        if _DEFAULTS.get(name, object()) == value or (name == "kernel_shape" and value == kernel):
            continue
        if (
            name in _DEFAULT_EACH
            and isinstance(value, tuple)
            and all(v == _DEFAULT_EACH[name] for v in value)
        ):
            continue
        out[name] = value
    return out


def _step(grid: Grid, shape: tuple[int, ...]) -> np.ndarray | None:
    """The grid's step for every element of weights of ``shape`` (per channel along its axis); None
    when the grid does not fit the shape."""
    scale = grid.scale.astype(np.float64).reshape(-1)
    if scale.size == 1 or grid.axis is None:
        return np.full(shape, scale[0])
    if grid.axis >= len(shape) or shape[grid.axis] != scale.size:
        return None
    view = [1] * len(shape)
    view[grid.axis] = scale.size
    return np.broadcast_to(scale.reshape(view), shape)


def _layer(node: ir.Node, weight_grids: Mapping[str, Grid]) -> _Layer | None:
    """The node's comparable view. A Gemm without transA and with alpha 1 is a fully connected layer
    ``x @ W`` like a MatMul, its weights taken as ``[K, N]`` (a transB weight transposed): ORT's
    ``quantize_dynamic`` writes a Gemm as MatMulInteger + Add."""
    w_value = node.inputs[1]
    w = const_array(w_value)
    if w is None or not (np.issubdtype(w.dtype, np.floating) or w_value.name in weight_grids):
        return None
    grid = weight_grids.get(w_value.name)
    step = _step(grid, w.shape) if grid is not None else None
    if grid is not None and step is None:
        return None
    kind, attrs = node.op_type, _attributes(node, tuple(w.shape[2:]))
    if node.op_type == "MatMul" or (node.op_type == "Gemm" and set(attrs) <= {"beta", "transB"}):
        if attrs.pop("transB", 0):
            w, step = w.T, (step.T if step is not None else None)
        kind, attrs = _FC, {}
    return _Layer(node, kind, attrs, w.astype(np.float64), step)


def _same_layer(f: _Layer, q: _Layer) -> bool:
    """Same kind and attributes, weights of one shape within one step of the quantized ones."""
    assert q.step is not None
    if f.kind != q.kind or f.attrs != q.attrs or f.weights.shape != q.weights.shape:
        return False
    return bool(np.all(np.abs(f.weights - q.weights) <= q.step * (1 + 1e-6)))


def _source_tensor(x: ir.Value, relus: Collection[str]) -> ir.Value:
    """The source tensor ``x`` stands for: the input of a Relu the import made explicit, else ``x``."""
    node = x.producer()
    if x.name in relus and node is not None and node.op_type == "Relu" and node.inputs[0] is not None:
        return node.inputs[0]
    return x


def find_duplicate_layers(
    model: ir.Model, weight_grids: Mapping[str, Grid], relus: Collection[str] = ()
) -> list[DuplicateLayer]:
    """Pairs of nodes of the imported ``model`` that compute one layer twice, float and quantized (module
    rule); ``weight_grids`` maps the quantized weights' names to their source grids, ``relus`` names the
    outputs of the ReLUs the import made explicit."""
    readers: dict[int, list[ir.Node]] = {}
    for node in model.graph:
        if node.op_type in COMPUTE_OPS and node.domain in ("", "ai.onnx") and len(node.inputs) > 1:
            x = node.inputs[0]
            if x is not None and node.inputs[1] is not None and const_array(x) is None:
                readers.setdefault(id(_source_tensor(x, relus)), []).append(node)
    found: list[DuplicateLayer] = []
    for nodes in readers.values():
        gridded = {n.inputs[1].name in weight_grids for n in nodes}
        if gridded != {True, False}:  # no float copy next to a quantized one: weights never read
            continue
        layers = [lay for lay in (_layer(n, weight_grids) for n in nodes) if lay is not None]
        quantized = [lay for lay in layers if lay.step is not None]
        floats = [lay for lay in layers if lay.step is None]
        for q in quantized:
            for f in floats:
                if _same_layer(f, q):
                    src = _source_tensor(f.node.inputs[0], relus)
                    found.append(DuplicateLayer(f.node, q.node, src.name or "?"))
    if found:
        logger.info(
            "%d layer(s) held both float and quantized, e.g. %s", len(found), label(found[0].float_node)
        )
    return found


def _source_name(node: ir.Node, source_names: Collection[str]) -> str:
    """The node's name in the source model: its own, or the longest source name it was derived from
    (the import names a QLinearConv ``N``'s float Conv ``N_float_node``)."""
    if node.name in source_names or not node.name:
        return label(node)
    stems = [s for s in source_names if s and node.name.startswith(s + "_")]
    return max(stems, key=len) if stems else label(node)


def refuse_duplicate_layers(
    model: ir.Model,
    weight_grids: Mapping[str, Grid],
    relus: Collection[str] = (),
    source_names: Collection[str] = (),
) -> None:
    """Raise UnsupportedModelError naming the first layer held twice (module rule); nothing otherwise.
    ``source_names`` are the node names before the import, for naming the nodes as the user knows them."""
    found = find_duplicate_layers(model, weight_grids, relus)
    if not found:
        return
    first = found[0]
    f_name = _source_name(first.float_node, source_names)
    q_name = _source_name(first.quantized_node, source_names)
    more = f" ({len(found) - 1} more layer(s) likewise)" if len(found) > 1 else ""
    raise UnsupportedModelError(
        f"this pre-quantized model holds a layer twice, float {f_name!r} and quantized {q_name!r} "
        f"({first.float_node.op_type} on {first.activation!r}, weights within one quantization step){more}. "
        "Keep one of them: re-export the model without the float branch, or quantize the float model "
        "instead (zonnx quantize FLOAT.onnx OUT.onnx --target T --calib DATA)."
    )
