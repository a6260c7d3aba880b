"""Re-encode int8 weights of ORT's unsigned-activation integer ops as uint8, so they run exactly on every x86 CPU.

ORT's u8 x s8 kernels add pairs of products in saturating 16-bit registers on x86 without VNNI
(``zonnx.hostcpu``); u8 x u8 is exact everywhere. The rewrite keeps every product::

    x * (w - z_w) = x * ((w + 128) - (z_w + 128)),   w, z_w in [-128, 127]  ->  w + 128, z_w + 128 in [0, 255]

Ops (activation zero point, weight, weight zero point by input index): QLinearConv (2, 3, 5; also
``com.microsoft`` channels-last), QLinearMatMul (2, 3, 5), MatMulInteger (2, 1, 3), ConvInteger (2, 1, 3),
``com.microsoft`` QGemm (2, 3, 5), MatMulIntegerToFloat (4, 1, 5) and DynamicQuantizeMatMul (its
activation is always quantized to uint8; weight 1, zero point 3). Only constant int8 weights with a
uint8 activation are rewritten: ORT has no kernel for int8 activations with uint8 weights. In QDQ
models, a DequantizeLinear of constant int8 weights whose every reader (Conv, Gemm, MatMul) takes an
8-bit activation from another DequantizeLinear gets the same treatment: ORT's optimizer would fuse the
group into a u8 x s8 kernel, int8 activations included (on x86 it first moves int8 QDQ activations to
uint8, its fastest form). The dequantized weights are the same floats, so the group either fuses into an
exact u8 x u8 kernel or runs in float. (ORT's own remedy, the session option ``session.x64quantprecision``, is
not used: it failed at session creation on lowered NPU models with "Attempt to replace the existing
tensor".)
"""

from __future__ import annotations

__all__ = ["ExactIntWeightsPass", "INTEGER_WEIGHT_OPS", "has_integer_weight_ops"]

import logging

import numpy as np
import onnx
import onnx_ir as ir

from zonnx.passes.base import Changes, ZonnxPass
from zonnx.passes.fusion.matching import const_array, label

logger = logging.getLogger(__name__)

_MS = "com.microsoft"
#: (domain, op type) -> (activation zero point index or None, weight index, weight zero point index).
INTEGER_WEIGHT_OPS: dict[tuple[str, str], tuple[int | None, int, int]] = {
    ("", "QLinearConv"): (2, 3, 5),
    (_MS, "QLinearConv"): (2, 3, 5),
    ("", "QLinearMatMul"): (2, 3, 5),
    ("", "MatMulInteger"): (2, 1, 3),
    ("", "ConvInteger"): (2, 1, 3),
    (_MS, "QGemm"): (2, 3, 5),
    (_MS, "MatMulIntegerToFloat"): (4, 1, 5),
    (_MS, "DynamicQuantizeMatMul"): (None, 1, 3),
}


def has_integer_weight_ops(model: onnx.ModelProto) -> bool:
    """Whether any main-graph node may be rewritten: an integer op above or a DequantizeLinear whose weight
    input is an int8 initializer (a cheap check on the proto; a model already in u8 x u8 form has none)."""
    int8 = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8}
    if not int8:
        return False
    for n in model.graph.node:
        key = (n.domain if n.domain != "ai.onnx" else "", n.op_type)
        w_index = 0 if key == ("", "DequantizeLinear") else INTEGER_WEIGHT_OPS.get(key, (None, None, None))[1]
        if w_index is not None and w_index < len(n.input) and n.input[w_index] in int8:
            return True
    return False


def _input(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


def _activation_is_u8(node: ir.Node, zp_index: int | None) -> bool:
    if zp_index is None:
        return True  # DynamicQuantizeMatMul quantizes its float input to uint8
    zp = _input(node, zp_index)
    x = node.inputs[0]
    for value in (zp, x):  # ORT's dynamic quantization: DynamicQuantizeLinear always writes uint8
        src = value.producer() if value is not None else None
        if src is not None and src.op_type == "DynamicQuantizeLinear":
            return True
    if zp is not None and zp.type is not None:
        return zp.dtype == ir.DataType.UINT8
    if zp is None and x is not None and x.type is not None:
        return x.dtype == ir.DataType.UINT8
    return False


_QDQ_CONSUMERS = {"Conv": (0,), "Gemm": (0,), "MatMul": (0, 1)}


def _qdq_weight_is_exposed(dq: ir.Node) -> bool:
    """A DequantizeLinear of constant int8 weights that ORT may fuse into a u8 x s8 kernel.

    Every consumer is a Conv, Gemm or MatMul whose activation input comes from a DequantizeLinear of 8-bit codes.
    """
    out = dq.outputs[0]
    if not out.uses() or out.is_graph_output():
        return False
    for use in out.uses():
        user = use.node
        slots = _QDQ_CONSUMERS.get(user.op_type) if user.domain in ("", "ai.onnx") else None
        if slots is None:
            return False
        others = [user.inputs[i] for i in slots if i != use.idx and i < len(user.inputs)]
        if not others:
            return False
        for other in others:
            src = other.producer() if other is not None else None
            if src is None or src.op_type != "DequantizeLinear" or not _reads_8bit(src):
                return False
    return True


def _reads_8bit(dq: ir.Node) -> bool:
    """Whether a DequantizeLinear reads 8-bit codes (its input's type, else its zero point's)."""
    for value in (dq.inputs[0], _input(dq, 2)):
        if value is not None and value.type is not None:
            return value.dtype in (ir.DataType.UINT8, ir.DataType.INT8)
    return False


class ExactIntWeightsPass(ZonnxPass):
    """Replaces int8 constant weights (and their zero points) of u8-activation integer ops with uint8 + 128.

    Also a QDQ model's int8 weight DequantizeLinear when every reader multiplies it with a uint8 activation
    (ORT would fuse the group into a u8 x s8 kernel). Numerics are unchanged (module docstring); shared
    weights get one uint8 copy. Options: none.
    """

    name = "exact-int-weights"

    def apply(self, model: ir.Model) -> Changes:
        changes = Changes()
        graph = model.graph
        made: dict[int, ir.Value] = {}
        replaced: list[ir.Value] = []
        for node in list(graph):
            key = (node.domain if node.domain != "ai.onnx" else "", node.op_type)
            if key == ("", "DequantizeLinear"):
                if node.inputs[0] is None or node.inputs[0].dtype != ir.DataType.INT8:
                    continue
                if not _qdq_weight_is_exposed(node):
                    continue
                w_index, wzp_index = 0, 2
            elif key in INTEGER_WEIGHT_OPS:
                zp_index, w_index, wzp_index = INTEGER_WEIGHT_OPS[key]
                w = _input(node, w_index)
                if w is None or w.dtype != ir.DataType.INT8 or not _activation_is_u8(node, zp_index):
                    continue
            else:
                continue
            if self._rewrite(graph, node, w_index, wzp_index, made, replaced, changes):
                changes.add(f"int8 weights as uint8 + 128 ({node.op_type})")
        for old in replaced:  # the int8 originals, once nothing else uses them
            if old.name in graph.initializers and not old.uses() and not old.is_graph_output():
                graph.initializers.pop(old.name)
        return changes

    @staticmethod
    def _rewrite(
        graph: ir.Graph,
        node: ir.Node,
        w_index: int,
        wzp_index: int,
        made: dict[int, ir.Value],
        replaced: list[ir.Value],
        changes: Changes,
    ) -> bool:
        """Point ``node`` at uint8 copies of its weights (``w + 128``) and zero point (``z + 128``)."""
        w = node.inputs[w_index]
        warr = const_array(w)
        wzp_value = _input(node, wzp_index)
        wzp = np.zeros((), np.int8) if wzp_value is None else const_array(wzp_value)
        if warr is None or wzp is None:
            changes.miss(f"{label(node)}: int8 weights or zero point are not constant")
            return False
        new_w = made.get(id(w))
        if new_w is None:
            new_w = ir.Value(
                name=f"{w.name}_u8", const_value=ir.tensor((warr.astype(np.int16) + 128).astype(np.uint8))
            )
            graph.register_initializer(new_w)
            made[id(w)] = new_w
        base = (wzp_value.name if wzp_value is not None else f"{w.name}_zp") + f"_u8_{label(node)}"
        new_zp = ir.Value(name=base, const_value=ir.tensor((wzp.astype(np.int16) + 128).astype(np.uint8)))
        graph.register_initializer(new_zp)
        if len(node.inputs) <= wzp_index:
            node.resize_inputs(wzp_index + 1)
        node.replace_input_with(w_index, new_w)
        node.replace_input_with(wzp_index, new_zp)
        replaced += [w] + ([wzp_value] if wzp_value is not None else [])
        return True
