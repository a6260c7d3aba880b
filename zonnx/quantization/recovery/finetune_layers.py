"""The layers fast finetune can tune in a quantized model, where their weights live, and writing them back.

A *layer* is a Conv, Gemm or MatMul of the quantized model whose weight is a constant read through one
quantizer, with the node of the same name in the float model (``quantize_static`` names every node
before writing, so both models share names). The weight's integer grid is ``value = (q - zp) * scale``
with ``q`` in ``[qmin, qmax]``; each format stores it in one of two ways:

==========================  ===========================================  ===============================
form                        nodes                                        written back
==========================  ===========================================  ===============================
QDQ                         DequantizeLinear(int codes, scale, zp)       the codes initializer
VitisQDQ (stored codes)     VitisDequantizeLinear(int codes; pos)        the codes initializer
FixNeuron                   FixNeuron(float W; pos, bit_width, narrow)   ``W := (q - zp) * scale``
VitisQDQ / QDQ pair         (Vitis)QuantizeLinear(float W) -> (Vitis)DQ   ``W := (q - zp) * scale``
==========================  ===========================================  ===============================

A float weight written back lies exactly on the grid, so the quantizer's rounding mode gives ``q`` again
whatever it is; scales, positions, zero points and rounding attributes are never touched. The code range
of stored codes is the plan's (restricted or full) when given, else the storage type's; FixNeuron and
Vitis ops carry it in ``bit_width``/``signed``/``narrow``. The bias is read the same way (int32 codes at
``s_x * s_w``, or a FixNeuron'd float bias); a float bias with no quantizer is a plain constant.

Conv ``auto_pad`` other than NOTSET, Gemm with ``transA`` or ``alpha``/``beta`` other than 1, MatMul with
the constant as first input or not 2-D, weights read by another node, and weights not quantized are
left alone with a reason.
"""

from __future__ import annotations

__all__ = ["Grid", "StoredTensor", "Layer", "find_layers", "stored_tensor"]

import dataclasses
import logging
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from zonnx.custom_ops import ZONNX_DOMAIN
from zonnx.custom_ops.grid import qrange, round_reference
from zonnx.passes.fusion.matching import const_array, label
from zonnx.quantization.refine.positions import INT_RANGES

logger = logging.getLogger(__name__)

_DEFAULT = ("", "ai.onnx")


@dataclasses.dataclass(frozen=True)
class Grid:
    """An integer grid ``value = (q - zero_point) * scale``, q in [qmin, qmax] (arrays broadcast to the tensor)."""

    scale: np.ndarray
    zero_point: np.ndarray
    qmin: int
    qmax: int

    def values(self, codes: np.ndarray) -> np.ndarray:
        """float32 values of integer codes."""
        return ((np.asarray(codes, np.float64) - self.zero_point) * self.scale).astype(np.float32)

    def nearest(self, x: np.ndarray) -> np.ndarray:
        """Codes of ``x`` rounded half to even and clipped (int64)."""
        q = np.rint(np.asarray(x, np.float64) / self.scale) + self.zero_point
        return np.clip(q, self.qmin, self.qmax).astype(np.int64)


@dataclasses.dataclass
class StoredTensor:
    """A layer's weight or bias in the quantized model: the initializer behind it and its grid.

    ``holds_codes``: the initializer holds integer codes (else float values); ``grid`` None: a float bias
    with no quantizer; ``round_mode`` and ``pos``: how a power-of-two quantizer reading a float
    initializer rounds it (None for QuantizeLinear, which rounds half to even).
    """

    init: ir.Value
    holds_codes: bool
    grid: Grid | None
    round_mode: str | None = None
    pos: int = 0

    def codes(self) -> np.ndarray:
        """The integer codes the quantized model computes with (int64)."""
        data = np.asarray(const_array(self.init))
        if self.holds_codes:
            return data.astype(np.int64)
        assert self.grid is not None
        if self.round_mode is None:
            return self.grid.nearest(data)
        # a power-of-two fake quantizer: round_mode(fl32(x * 2^pos)), clipped (clipping first or last agrees)
        scaled = (np.asarray(data, np.float32) * np.float32(2.0**self.pos)).astype(np.float64)
        q = round_reference(scaled, self.round_mode)
        return np.clip(q, self.grid.qmin, self.grid.qmax).astype(np.int64)

    def values(self) -> np.ndarray:
        """The float values the quantized model computes with."""
        if self.grid is None:
            return np.asarray(const_array(self.init), np.float32)
        return self.grid.values(self.codes())

    def write(self, codes_or_values: np.ndarray) -> onnx.TensorProto:
        """Store new codes (or float values for an unquantized bias); return the new initializer proto."""
        if self.grid is None:
            array = np.asarray(codes_or_values, np.float32)
        elif self.holds_codes:
            array = np.asarray(codes_or_values).astype(np.asarray(const_array(self.init)).dtype)
        else:
            array = self.grid.values(codes_or_values)
        dtype = self.init.dtype if self.holds_codes else ir.DataType.FLOAT
        old = self.init.const_value
        shape = tuple(old.shape) if old is not None else array.shape
        tensor = ir.tensor(array.reshape(shape), dtype=dtype, name=self.init.name)
        self.init.const_value = tensor
        return ir.serde.serialize_tensor(tensor)


@dataclasses.dataclass
class Layer:
    """One tunable node: its op, tensors and where its inputs and targets are in both models."""

    node: ir.Node
    kind: str  # "conv", "gemm", "matmul"
    weight: StoredTensor
    bias: StoredTensor | None
    float_weight: np.ndarray
    attrs: dict[str, Any]
    activation: tuple[str, float, float] | None  # ("relu"|"clip", lo, hi) applied before the loss
    float_input: str
    float_target: str
    quant_input: str

    @property
    def name(self) -> str:
        return label(self.node)


def _is(node: ir.Node | None, op: str, domains: Collection[str]) -> bool:
    return node is not None and node.op_type == op and node.domain in domains


def _only_reader(value: ir.Value, node: ir.Node) -> bool:
    return not value.is_graph_output() and all(u.node is node for u in value.uses())


def _pof2_grid(node: ir.Node) -> Grid:
    attrs = node.attributes
    pos = attrs.get_int("pos", 0)
    qmin, qmax = qrange(attrs.get_int("bit_width", 8), attrs.get_int("signed", 1), attrs.get_int("narrow", 0))
    return Grid(np.asarray(2.0**-pos), np.asarray(0.0), qmin, qmax)


def _qdq_grid(node: ir.Node, ndim: int, qmin: int, qmax: int) -> Grid | str:
    scale = const_array(node.inputs[1])
    zp = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
    if scale is None or (len(node.inputs) > 2 and node.inputs[2] is not None and zp is None):
        return f"the scale or zero point of {label(node)} is not a constant"
    scale = np.asarray(scale, np.float64)
    zp = np.zeros_like(scale) if zp is None else np.asarray(zp, np.float64)
    if scale.size > 1:
        axis = node.attributes.get_int("axis", 1) % ndim
        shape = [1] * ndim
        shape[axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return Grid(scale, zp, qmin, qmax)


def stored_tensor(
    value: ir.Value, reader: ir.Node, ranges: Mapping[str, tuple[int, int]], key: str
) -> StoredTensor | str:
    """How the constant input ``value`` of ``reader`` is stored, or why it cannot be tuned."""
    if not _only_reader(value, reader):
        return f"{value.name!r} is also read by another node"
    node = value.producer()
    arr = const_array(value)
    if node is None or arr is not None:
        if arr is None:
            return f"{value.name!r} is not a constant"
        return (
            StoredTensor(value, False, None)
            if value.is_initializer()
            else f"{value.name!r} is not an initializer"
        )
    src = node.inputs[0] if node.inputs else None
    if src is None:
        return f"{label(node)} has no input"
    src_node = src.producer()
    if _is(node, "FixNeuron", (ZONNX_DOMAIN,)) or (
        _is(node, "VitisDequantizeLinear", (ZONNX_DOMAIN,))
        and _is(src_node, "VitisQuantizeLinear", (ZONNX_DOMAIN,))
    ):
        first = node if src_node is None else src_node
        float_w = first.inputs[0]
        if src_node is not None and not _only_reader(src, node):
            return f"the codes of {value.name!r} are read by another node"
        if not (float_w.is_initializer() and _only_reader(float_w, first)):
            return f"{float_w.name!r} is not an initializer read only by its quantizer"
        mode = first.attributes.get_string("round_mode", "half_even")
        return StoredTensor(float_w, False, _pof2_grid(first), mode, first.attributes.get_int("pos", 0))
    if _is(node, "VitisDequantizeLinear", (ZONNX_DOMAIN,)):
        if not (src.is_initializer() and _only_reader(src, node)):
            return f"the codes of {value.name!r} are not an initializer read only by its dequantizer"
        return StoredTensor(src, True, _pof2_grid(node))
    if _is(node, "DequantizeLinear", _DEFAULT):
        if _is(src_node, "QuantizeLinear", _DEFAULT):
            float_w = src_node.inputs[0]
            if not (_only_reader(src, node) and float_w.is_initializer() and _only_reader(float_w, src_node)):
                return f"the Q/DQ pair of {value.name!r} shares its tensors with other nodes"
            zp = src_node.inputs[2] if len(src_node.inputs) > 2 else None
            dtype = src.dtype or (zp.dtype if zp is not None else ir.DataType.UINT8)
            lo, hi = ranges.get(key, INT_RANGES.get(dtype, (-128, 127)))
            grid = _qdq_grid(src_node, np.ndim(const_array(float_w)), lo, hi)
            return grid if isinstance(grid, str) else StoredTensor(float_w, False, grid)
        if not (src.is_initializer() and _only_reader(src, node)):
            return f"the codes of {value.name!r} are not an initializer read only by its dequantizer"
        lo, hi = ranges.get(key, INT_RANGES.get(src.dtype, (-128, 127)))
        grid = _qdq_grid(node, np.ndim(const_array(src)), lo, hi)
        return grid if isinstance(grid, str) else StoredTensor(src, True, grid)
    return f"{value.name!r} comes from {label(node)} ({node.op_type}), not a weight quantizer"


def _activation(value: ir.Value) -> tuple[tuple[str, float, float] | None, ir.Value]:
    """The Relu/Clip (constant bounds) right after a float layer output, and the loss target."""
    users = value.consumers()
    if value.is_graph_output() or len(users) != 1 or users[0].domain not in _DEFAULT:
        return None, value
    act = users[0]
    if act.op_type == "Relu":
        return ("relu", 0.0, float("inf")), act.outputs[0]
    if act.op_type == "Clip":
        bounds = []
        for i, attr, default in ((1, "min", float("-inf")), (2, "max", float("inf"))):
            v = act.inputs[i] if len(act.inputs) > i else None
            if v is None:
                bounds.append(act.attributes.get_float(attr, default))
                continue
            arr = const_array(v)
            if arr is None or arr.size != 1:
                return None, value
            bounds.append(float(arr.reshape(())))
        return ("clip", bounds[0], bounds[1]), act.outputs[0]
    return None, value


def _op_attrs(node: ir.Node, w: np.ndarray) -> dict[str, Any] | str:
    a = node.attributes
    if node.op_type == "Conv":
        if a.get_string("auto_pad", "NOTSET") != "NOTSET":
            return "auto_pad is not NOTSET"
        spatial = w.ndim - 2
        if not 1 <= spatial <= 3:
            return f"{spatial}-D convolution"
        return {
            "strides": tuple(a.get_ints("strides", [1] * spatial)),
            "dilations": tuple(a.get_ints("dilations", [1] * spatial)),
            "pads": tuple(a.get_ints("pads", [0] * 2 * spatial)),
            "group": a.get_int("group", 1),
        }
    if node.op_type == "Gemm":
        if a.get_int("transA", 0) or a.get_float("alpha", 1.0) != 1.0 or a.get_float("beta", 1.0) != 1.0:
            return "Gemm with transA or alpha/beta other than 1"
        return {"trans_b": bool(a.get_int("transB", 0))}
    return {}


def _layer(node: ir.Node, fnode: ir.Node, ranges: Mapping[str, tuple[int, int]]) -> Layer | str:
    kind = node.op_type.lower()
    if len(node.inputs) < 2 or node.inputs[1] is None or len(fnode.inputs) < 2:
        return "no weight input"
    if kind == "matmul" and const_array(node.inputs[0]) is not None:
        return "the constant is MatMul's first input"
    fw = const_array(fnode.inputs[1])
    if fw is None:
        return "its second input is not a constant weight in the float model"
    if kind != "conv" and fw.ndim != 2:
        return f"{fw.ndim}-D weight"
    attrs = _op_attrs(node, fw)
    if isinstance(attrs, str):
        return attrs
    weight = stored_tensor(node.inputs[1], node, ranges, fnode.inputs[1].name)
    if isinstance(weight, str):
        return f"weight: {weight}"
    if weight.grid is None:
        return "the weight is not quantized"
    if weight.init.const_value is not None and tuple(weight.init.const_value.shape) != fw.shape:
        return "the quantized weight's shape differs from the float weight's"
    bias = None
    if kind != "matmul" and len(node.inputs) > 2 and node.inputs[2] is not None:
        fb = fnode.inputs[2] if len(fnode.inputs) > 2 else None
        bias = stored_tensor(node.inputs[2], node, ranges, fb.name if fb is not None else "")
        if isinstance(bias, str):
            return f"bias: {bias}"
        if bias.values().size not in (1, fw.shape[1 if kind == "gemm" and not attrs["trans_b"] else 0]):
            return "the bias is not one value per output channel"
    activation, target = _activation(fnode.outputs[0])
    return Layer(
        node,
        kind,
        weight,
        bias,
        np.asarray(fw, np.float32),
        attrs,
        activation,
        fnode.inputs[0].name,
        target.name,
        node.inputs[0].name,
    )


def find_layers(
    float_model: ir.Model,
    model: ir.Model,
    op_types: Collection[str],
    ranges: Mapping[str, tuple[int, int]] | None = None,
) -> tuple[list[Layer], dict[str, str]]:
    """Tunable layers of ``model`` in topological order, and why each other ``op_types`` node is skipped.

    ``ranges``: code range by float weight/bias name (the plan's, so restricted ranges are kept).
    """
    by_name = {n.name: n for n in float_model.graph if n.name}
    layers: list[Layer] = []
    skipped: dict[str, str] = {}
    for node in model.graph:
        if node.op_type not in op_types or node.domain not in _DEFAULT:
            continue
        fnode = by_name.get(node.name)
        if fnode is None or fnode.op_type != node.op_type:
            skipped[label(node)] = "no float node of the same name and type"
            continue
        found = _layer(node, fnode, ranges or {})
        if isinstance(found, str):
            skipped[label(node)] = found
        else:
            layers.append(found)
    for name, why in skipped.items():
        logger.debug("fast finetune: %s left alone: %s", name, why)
    return layers, skipped
