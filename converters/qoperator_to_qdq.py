"""Rewrite ONNX Runtime QOperator models into QDQ form, so the zonnx backend sees one kind of model.

Every integer op becomes ``DequantizeLinear -> float op -> QuantizeLinear`` with the same scales and
zero points; the codes a QDQ runtime writes then match the integer kernels' within rounding (1 LSB)::

    QLinearConv(x,sx,zx, w,sw,zw, sy,zy, B)     -> Q(Conv(DQ(x), DQ(w, axis 0), DQ(B, sx*sw)), sy, zy)
    QLinearMatMul(a,sa,za, b,sb,zb, sy,zy)      -> Q(MatMul(DQ(a), DQ(b, axis -1)), sy, zy)
    QGemm(a,sa,za, b,sb,zb, C, sy,zy)           -> Q(Gemm(DQ(a), DQ(b), DQ(C, alpha*sa*sb)), sy, zy)
                                                   (no sy: the float Gemm output is the result)
    QLinear{Add,Mul}(A,sA,zA, B,sB,zB, sC,zC)   -> Q(op(DQ(A), DQ(B)), sC, zC)
    QLinearConcat(sy,zy, (x,sx,zx)...)          -> Q(Concat(DQ(x)...), sy, zy)
    QLinear{GlobalAveragePool,AveragePool,Sigmoid,LeakyRelu,Softmax}(x,sx,zx, sy,zy)
                                                -> Q(op(DQ(x)), sy, zy)

The bias rule follows the kernels: QLinearConv adds int32 B to the accumulator, so B is at sx*sw;
QGemm scales (acc + C) by alpha*sa*sb. A vector weight scale is per output channel (Conv: axis 0;
Gemm: axis 0 with transB, else 1; MatMul: the last axis). Attributes carry over, except
``channels_last`` (only 0 is rewritten) and QLinearSoftmax's ``opset`` (below 13 with a non-last axis
the 2-D semantics become Flatten -> Softmax -> Reshape).

Integer ops that only move or select codes (MaxPool, Reshape, Flatten, Transpose, ...) run on a
quantized input with known parameters p: ``op(q) = Q(op(DQ(q, p)), p)`` exactly (max commutes with
the increasing map DQ); Pad's constant code c becomes the float (c - z) * s.

Dynamic quantization (``quantize_dynamic``): ``DynamicQuantizeLinear(x) -> (q, s, z)`` then
``MatMulInteger|ConvInteger(q, w, z, zw) -> Cast(float) -> Mul(Mul(s, sw))`` becomes
``MatMul|Conv(DQ(q, s, z), DQ(w, sw, zw))``: the same product, in float.
"""

from __future__ import annotations

__all__ = ["QOperatorToQDQPass", "qoperator_to_qdq", "LATENT_OPS"]

import logging
from collections.abc import Callable, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from zonnx.converters.common import ConversionError
from zonnx.ir.io import default_opset, to_proto
from zonnx.ir.large import copy_model
from zonnx.ir.names import NameSource
from zonnx.passes.base import Changes, ZonnxPass
from zonnx.passes.fusion.matching import const_array, label, prune, replace_value

logger = logging.getLogger(__name__)

_MS = "com.microsoft"
#: Ops that move or select codes: wrapped as DQ -> op -> Q with their input's parameters.
LATENT_OPS = frozenset(
    {
        "MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Gather",
        "Split", "Identity", "DepthToSpace", "SpaceToDepth", "Resize", "Pad", "Expand", "Tile",
    }
)  # fmt: skip
_UNARY = {"QLinearGlobalAveragePool": "GlobalAveragePool", "QLinearAveragePool": "AveragePool",
          "QLinearSigmoid": "Sigmoid", "QLinearLeakyRelu": "LeakyRelu", "QLinearSoftmax": "Softmax"}  # fmt: skip
_BINARY = {"QLinearAdd": "Add", "QLinearMul": "Mul"}
_Params = tuple[ir.Value, ir.Value | None]  # (scale, zero point) of a code tensor


def _input(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


class _Rewriter:
    """Builds the replacement nodes in front of the node being rewritten and tracks code parameters."""

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self.graph = model.graph
        self.names = NameSource.of(model.graph)
        self.params: dict[ir.Value, _Params] = {}
        self.dq_cache: dict[tuple[int, int, int, int | None], ir.Value] = {}
        self.anchor: ir.Node | None = None
        self.new_nodes: list[ir.Node] = []

    def fresh(self, hint: str) -> str:
        return self.names.fresh(hint)

    def emit(self, op: str, inputs: Sequence[ir.Value | None], hint: str, attrs: Sequence[ir.Attr] = (),
             num_outputs: int = 1, dtype: ir.DataType | None = None) -> list[ir.Value]:  # fmt: skip
        """A new default-domain node (inserted in front of the anchor by ``finish_output``)."""
        kind = ir.TensorType(dtype) if dtype else None
        outs = [ir.Value(name=self.fresh(hint if num_outputs == 1 else f"{hint}_{k}"), type=kind)
                for k in range(num_outputs)]  # fmt: skip
        self.new_nodes.append(
            ir.Node("", op, list(inputs), list(attrs), outputs=outs, name=self.fresh(f"{hint}_node"))
        )
        return outs

    def const(self, array: np.ndarray, hint: str) -> ir.Value:
        name = self.fresh(hint)
        value = ir.Value(
            name=name,
            type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
            shape=ir.Shape(array.shape),
            const_value=ir.tensor(array, name=name),
        )
        self.graph.register_initializer(value)
        return value

    def dq(self, code: ir.Value, scale: ir.Value, zp: ir.Value | None, axis: int | None = None) -> ir.Value:
        """DequantizeLinear of ``code`` (shared by every consumer with the same parameters)."""
        key = (id(code), id(scale), id(zp), axis)
        if key not in self.dq_cache:
            attrs = [ir.AttrInt64("axis", axis)] if axis is not None else []
            self.dq_cache[key] = self.emit(
                "DequantizeLinear", [code, scale, zp], f"{code.name}_dequantized", attrs, dtype=scale.dtype
            )[0]
        return self.dq_cache[key]

    def q(self, value: ir.Value, scale: ir.Value, zp: ir.Value | None, old: ir.Value) -> None:
        """QuantizeLinear of ``value`` replacing the codes ``old`` (graph outputs keep their name)."""
        out = self.emit("QuantizeLinear", [value, scale, zp], f"{old.name}_q")[0]
        out.type, out.shape = old.type, old.shape
        self.params[out] = (scale, zp)
        self.finish_output(old, out)

    def finish_output(self, old: ir.Value, new: ir.Value) -> None:
        assert self.anchor is not None
        self.graph.insert_before(self.anchor, self.new_nodes)
        self.new_nodes = []
        name = old.name
        replace_value(old, new)
        if name and new.name != name:  # keep the tensor's name: codes stay comparable by name
            old.name = self.fresh(f"{name}_replaced")
            new.name = name

    def scale_product(self, a: ir.Value, b: ir.Value, alpha: float, hint: str) -> ir.Value:
        """float32 alpha * a * b as a constant (ORT's quantizer computes bias scales the same way)."""
        sa, sb = const_array(a), const_array(b)
        if sa is None or sb is None:
            prod = self.emit("Mul", [a, b], f"{hint}_scale", dtype=a.dtype)[0]
            return (
                prod
                if alpha == 1.0
                else self.emit(
                    "Mul", [prod, self.const(np.float32(alpha), hint)], f"{hint}_scale_alpha", dtype=a.dtype
                )[0]
            )
        prod = (sa.astype(np.float32) * sb.astype(np.float32)).reshape(-1)
        prod = prod * np.float32(alpha) if alpha != 1.0 else prod
        return self.const(prod.reshape(()) if prod.size == 1 else prod, f"{hint}_scale")

    def zero_point(self, zp: ir.Value | None, like: ir.Value | None) -> ir.Value | None:
        """An absent output zero point means 0 of the input codes' type (com.microsoft ops)."""
        if zp is not None or like is None:
            return zp
        arr = const_array(like)
        return self.const(np.zeros((), arr.dtype if arr is not None else np.uint8), "zero_point")


def _hint(node: ir.Node) -> str:
    return node.name or (node.outputs[0].name or node.op_type)


def _axis_for(scale: ir.Value, axis: int) -> int | None:
    arr = const_array(scale)
    return axis if arr is not None and arr.size > 1 else None


def _attrs(node: ir.Node, drop: Sequence[str] = ()) -> list[ir.Attr]:
    return [a for name, a in node.attributes.items() if name not in drop]


def _qlinear_conv(rw: _Rewriter, n: ir.Node) -> str | None:
    x, sx, zx, w, sw, zw, sy, zy = (_input(n, i) for i in range(8))
    b = _input(n, 8)
    ins = [rw.dq(x, sx, zx), rw.dq(w, sw, zw, _axis_for(sw, 0))]
    if b is not None:
        ins.append(rw.dq(b, rw.scale_product(sx, sw, 1.0, b.name or "bias"), None, _axis_for(sw, 0)))
    y = rw.emit("Conv", ins, f"{_hint(n)}_float", _attrs(n), dtype=sx.dtype)[0]
    rw.q(y, sy, zy, n.outputs[0])
    return None


def _qlinear_matmul(rw: _Rewriter, n: ir.Node) -> str | None:
    a, sa, za, b, sb, zb, sy, zy = (_input(n, i) for i in range(8))
    sb_arr = const_array(sb)
    if sb_arr is not None and sb_arr.ndim > 1 and sb_arr.size > 1:
        return f"{label(n)} (QLinearMatMul): b_scale of shape {sb_arr.shape} is not per-tensor or per-column"
    y = rw.emit(
        "MatMul", [rw.dq(a, sa, za), rw.dq(b, sb, zb, _axis_for(sb, -1))], f"{_hint(n)}_float", dtype=sa.dtype
    )[0]
    rw.q(y, sy, zy, n.outputs[0])
    return None


def _qgemm(rw: _Rewriter, n: ir.Node) -> str | None:
    a, sa, za, b, sb, zb, c, sy, zy = (_input(n, i) for i in range(9))
    alpha = n.attributes.get_float("alpha", 1.0)
    axis = _axis_for(sb, 0 if n.attributes.get_int("transB", 0) else 1)
    ins = [rw.dq(a, sa, za), rw.dq(b, sb, zb, axis)]
    if c is not None:
        ins.append(
            rw.dq(c, rw.scale_product(sa, sb, alpha, c.name or "bias"), None, None if axis is None else 0)
        )
    y = rw.emit("Gemm", ins, f"{_hint(n)}_float", _attrs(n), dtype=sa.dtype)[0]
    if sy is None:
        y.type, y.shape = n.outputs[0].type, n.outputs[0].shape
        rw.finish_output(n.outputs[0], y)
    else:
        rw.q(y, sy, rw.zero_point(zy, za), n.outputs[0])
    return None


def _binary(rw: _Rewriter, n: ir.Node) -> str | None:
    a, sa, za, b, sb, zb, sc, zc = (_input(n, i) for i in range(8))
    y = rw.emit(
        _BINARY[n.op_type], [rw.dq(a, sa, za), rw.dq(b, sb, zb)], f"{_hint(n)}_float", dtype=sa.dtype
    )[0]
    rw.q(y, sc, rw.zero_point(zc, za), n.outputs[0])
    return None


def _concat(rw: _Rewriter, n: ir.Node) -> str | None:
    sy, zy, rest = _input(n, 0), _input(n, 1), list(n.inputs[2:])
    if len(rest) % 3:
        return f"{label(n)} (QLinearConcat): inputs do not come in (x, scale, zero point) triples"
    ins = [rw.dq(rest[i], rest[i + 1], rest[i + 2]) for i in range(0, len(rest), 3)]
    y = rw.emit("Concat", ins, f"{_hint(n)}_float", _attrs(n), dtype=sy.dtype)[0]
    rw.q(y, sy, rw.zero_point(zy, rest[2]), n.outputs[0])
    return None


def _unary(rw: _Rewriter, n: ir.Node) -> str | None:
    x, sx, zx, sy, zy = (_input(n, i) for i in range(5))
    if n.attributes.get_int("channels_last", 0):
        return f"{label(n)} ({n.op_type}): channels_last=1 is not rewritten"
    xf = rw.dq(x, sx, zx)
    op = _UNARY[n.op_type]
    if op == "Softmax":
        axis = n.attributes.get_int("axis", -1)
        rank = len(x.shape) if x.shape is not None else None
        last = axis == -1 or (rank is not None and axis == rank - 1)
        two_d = n.attributes.get_int("opset", 13) < 13
        if not last and not two_d and default_opset(rw.model) < 13:
            return f"{label(n)} (QLinearSoftmax): a non-last axis needs opset 13 Softmax; upgrade the model"
        if two_d and not last:  # Softmax-1/11: 2-D at ``axis``, softmax of rows, original shape back
            h, f = _hint(n), sx.dtype
            flat = rw.emit("Flatten", [xf], f"{h}_flat", [ir.AttrInt64("axis", axis)], dtype=f)[0]
            soft = rw.emit("Softmax", [flat], f"{h}_softmax2d", [ir.AttrInt64("axis", -1)], dtype=f)[0]
            shape = rw.emit("Shape", [xf], f"{h}_shape", dtype=ir.DataType.INT64)[0]
            y = rw.emit("Reshape", [soft, shape], f"{h}_float", dtype=f)[0]
            rw.q(y, sy, rw.zero_point(zy, zx), n.outputs[0])
            return None
        attrs = [ir.AttrInt64("axis", axis)]
    else:
        attrs = _attrs(n, drop=("channels_last",))
    y = rw.emit(op, [xf], f"{_hint(n)}_float", attrs, dtype=sx.dtype)[0]
    rw.q(y, sy, rw.zero_point(zy, zx), n.outputs[0])
    return None


def _latent(rw: _Rewriter, n: ir.Node) -> str | None:
    """DQ -> op -> Q with the input's parameters, for ops that move or select codes."""
    x = _input(n, 0)
    if x is None or x not in rw.params:
        return ""  # not reading codes (or parameters unknown): a float op, nothing to do
    if n.op_type == "Resize" and n.attributes.get_string("mode", "nearest") != "nearest":
        return f"{label(n)} (Resize): mode {n.attributes.get_string('mode')!r} on codes is not exact in float"
    scale, zp = rw.params[x]
    ins = [rw.dq(x, scale, zp), *n.inputs[1:]]
    if n.op_type == "Pad" and _input(n, 2) is not None:
        c, s, z = const_array(_input(n, 2)), const_array(scale), const_array(zp) if zp is not None else 0
        if c is None or s is None or z is None:
            return f"{label(n)} (Pad): its constant value or the input's parameters are not constant"
        ins[2] = rw.const(((np.int64(c) - np.int64(z)) * s).astype(s.dtype), f"{_hint(n)}_pad_value")
    n_codes = len(n.outputs) if n.op_type == "Split" else 1
    outs = rw.emit(
        n.op_type, ins, f"{_hint(n)}_float", _attrs(n), num_outputs=len(n.outputs), dtype=scale.dtype
    )
    for i, out in enumerate(outs[n_codes:], start=n_codes):  # MaxPool's Indices stay as they are
        out.type = n.outputs[i].type
        replace_value(n.outputs[i], out)
    for i in range(n_codes):
        rw.q(outs[i], scale, zp, n.outputs[i])
    return None


def _integer_product(rw: _Rewriter, n: ir.Node) -> str | None:
    """MatMulInteger/ConvInteger -> Cast(float) -> Mul(s_a * s_b) of dynamic quantization."""
    a, b, za, zb = (_input(n, i) for i in range(4))
    where = f"{label(n)} ({n.op_type})"
    cast = next(iter(c for c in n.outputs[0].consumers() if c.op_type == "Cast"), None)
    mul = next(iter(c for c in cast.outputs[0].consumers() if c.op_type == "Mul"), None) if cast else None
    if cast is None or mul is None or len(n.outputs[0].uses()) != 1 or len(cast.outputs[0].uses()) != 1:
        return f"{where}: not followed by Cast -> Mul (the dequantization ORT writes)"
    factor = mul.inputs[1] if mul.inputs[0] is cast.outputs[0] else mul.inputs[0]
    prod = factor.producer() if factor is not None else None
    if a not in rw.params or prod is None or prod.op_type != "Mul":
        return (
            f"{where}: the scale {factor.name if factor else '?'} is not a Mul of the input and weight scales"
        )
    sa = rw.params[a][0]
    if sa not in prod.inputs:
        return f"{where}: the scale {factor.name} does not use the input's scale {sa.name}"
    sb = prod.inputs[1] if prod.inputs[0] is sa else prod.inputs[0]
    sb_arr = const_array(sb)
    axis = None
    if sb_arr is not None and sb_arr.size > 1:
        if n.op_type == "MatMulInteger" and sb_arr.ndim == 1:
            axis = -1
        elif n.op_type == "ConvInteger" and sb_arr.squeeze().ndim == 1:
            sb, axis = rw.const(sb_arr.reshape(-1), f"{sb.name}_per_channel"), 0
        else:
            return f"{where}: weight scale of shape {sb_arr.shape} is not per-tensor or per-channel"
    op = "MatMul" if n.op_type == "MatMulInteger" else "Conv"
    y = rw.emit(
        op, [rw.dq(a, sa, za), rw.dq(b, sb, zb, axis)], f"{_hint(n)}_float", _attrs(n), dtype=sa.dtype
    )[0]
    y.type, y.shape = mul.outputs[0].type, mul.outputs[0].shape
    rw.anchor = mul
    rw.finish_output(mul.outputs[0], y)
    for node in (mul, cast):
        node.graph.remove(node, safe=True)
    if not prod.outputs[0].uses() and not prod.outputs[0].is_graph_output():
        prod.graph.remove(prod, safe=True)
    return None


_HANDLERS: dict[tuple[str, str], Callable[[_Rewriter, ir.Node], str | None]] = {
    ("", "QLinearConv"): _qlinear_conv,
    ("", "QLinearMatMul"): _qlinear_matmul,
    (_MS, "QGemm"): _qgemm,
    (_MS, "QLinearConcat"): _concat,
    **{(_MS, op): _binary for op in _BINARY},
    **{(_MS, op): _unary for op in _UNARY},
    **{("", op): _latent for op in LATENT_OPS},
    ("", "MatMulInteger"): _integer_product,
    ("", "ConvInteger"): _integer_product,
}


class QOperatorToQDQPass(ZonnxPass):
    """Rewrites QOperator integer ops into ``DQ -> float op -> Q`` with the same parameters.

    No options. Counts one change per rewritten op (``QLinearConv -> DQ/Conv/Q``...); an integer op it
    cannot rewrite stays and is reported as a miss with the reason.
    """

    name = "qoperator-to-qdq"

    def apply(self, model: ir.Model) -> Changes:
        changes = Changes()
        rw = _Rewriter(model)
        for node in list(model.graph):
            if node.graph is None:
                continue  # removed by an earlier rewrite (a dynamic-quantization Cast/Mul)
            domain = "" if node.domain in ("", "ai.onnx") else node.domain
            if (domain, node.op_type) in (("", "QuantizeLinear"), ("", "DynamicQuantizeLinear")):
                scale, zp = (
                    (node.inputs[1], _input(node, 2))
                    if node.op_type == "QuantizeLinear"
                    else node.outputs[1:3]
                )
                rw.params[node.outputs[0]] = (scale, zp)
                continue
            handler = _HANDLERS.get((domain, node.op_type))
            if handler is None:
                continue
            rw.anchor, rw.new_nodes = node, []
            reason = handler(rw, node)
            if reason is None:
                inputs = list(node.inputs)
                model.graph.remove(node, safe=True)
                prune(inputs)
                changes.add(f"{node.op_type} -> DequantizeLinear/float op/QuantizeLinear")
            else:  # nothing emitted is kept: forget cached DQs that never reached the graph
                dropped = {id(v) for n in rw.new_nodes for v in n.outputs}
                rw.dq_cache = {k: v for k, v in rw.dq_cache.items() if id(v) not in dropped}
                if reason:
                    changes.miss(reason)
        if _MS in model.opset_imports and not any(n.domain == _MS for n in model.graph):
            del model.opset_imports[_MS]
        return changes


def _needs_axis(model: ir.Model) -> bool:
    """Whether a weight has per-channel parameters (its DequantizeLinear will need ``axis``)."""
    where = {"QLinearConv": 4, "QLinearMatMul": 4, "QGemm": 4, "MatMulInteger": 3, "ConvInteger": 3}
    for node in model.graph:
        i = where.get(node.op_type)
        arr = const_array(_input(node, i)) if i is not None else None
        if arr is not None and arr.size > 1:
            return True
    return False


def qoperator_to_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return ``model`` (an ORT QOperator model) rewritten to QDQ form by QOperatorToQDQPass.

    Per-channel parameters need opset 13 (DequantizeLinear ``axis``): an older model is upgraded first.
    Raises ConversionError when an integer op is left that the pass could not rewrite.
    """
    work = ir.serde.deserialize_model(copy_model(model))
    if default_opset(work) < 13 and _needs_axis(work):
        from zonnx.passes.common.opset_upgrade import OpsetUpgradePass

        try:
            OpsetUpgradePass(13)(work)
        except Exception as e:
            raise ConversionError(
                f"model {model.graph.name!r}: cannot upgrade it to opset 13 for per-channel "
                f"DequantizeLinear ({e}); re-quantize it at opset 13 or newer."
            ) from None
    result = QOperatorToQDQPass()(work)
    left = result.changes.misses
    if left:
        raise ConversionError(
            f"model {model.graph.name!r}: {len(left)} integer op(s) could not be rewritten to "
            f"QDQ; the first: {left[0]}."
        )
    logger.info("qoperator-to-qdq: %s", dict(result.changes.counts))
    return to_proto(result.model)
