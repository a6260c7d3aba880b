"""Rewrite ONNX Runtime's dynamic quantization forms into ``DynamicQuantizeLinear -> DequantizeLinear -> float op``.

``quantize_dynamic`` writes, with ``(q, s, z) = DynamicQuantizeLinear(x)`` computed per run::

    XInteger(q, w, z, zw) [-> Add(b_i32)] -> Cast(float) -> Mul(f)        f = Mul(s, sw) (either order)

Both integer ops multiply exact integers, so with ``acc = sum (q - z)(w - zw)`` the result is
``(acc + b) * s * sw``. The rewrite computes the same numbers in float::

    y = Op(DQ(q, s, z), DQ(w, sw, zw, axis)) [+ Cast(b) * f]

Op is MatMul (weight scale per column: axis -1) or Conv (per output channel: axis 0, a [C,1,1] scale is
flattened). com.microsoft ``MatMulIntegerToFloat(A, B, sa, sb, za, zb, bias)`` becomes
``MatMul(DQ(A, sa, za), DQ(B, sb, zb)) [+ bias]``; ``DynamicQuantizeMatMul(A, B, sb, zb, bias)`` becomes
``MatMul(DQ(DynamicQuantizeLinear(A)), DQ(B, sb, zb)) [+ bias]`` (the activation is still quantized per run,
as in the kernel). The activation codes keep their dynamic parameters, so the output equals the integer
kernels' up to float rounding; a later import strips ``DQ(DynamicQuantizeLinear(x))`` to ``x``.

com.microsoft ``DynamicQuantizeLSTM(X, W, R, B, seq, h0, c0, P, sw, zw, sr, zr)`` stores ``W`` as
``[D, input, 4H]`` and ``R`` as ``[D, H, 4H]`` codes with a scale per direction (``[D]``) or per direction
and gate column (``[D, 4H]``). It becomes a float ``LSTM`` (same attributes) whose weights are the
dequantized constants ``((q - z) * s)`` transposed to ONNX's ``[D, 4H, input]`` / ``[D, 4H, H]``: the
weights are exact; the kernel's per-step quantization of X and of the hidden state is not reproduced (it
is activation rounding, which the target's quantization replaces). Forms it does not know (a tail that is
not Cast -> Mul, non-constant LSTM weights) are left and reported as misses.
"""

from __future__ import annotations

__all__ = ["DynamicToQDQPass"]

import logging

import numpy as np
import onnx_ir as ir

from zonnx.ir.names import NameSource
from zonnx.passes.base import Changes, ZonnxPass
from zonnx.passes.fusion.matching import const_array, label, prune, replace_value

logger = logging.getLogger(__name__)

_MS = "com.microsoft"


def _in(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


def _only_consumer(value: ir.Value, op_type: str) -> ir.Node | None:
    users = value.consumers()
    if len(value.uses()) != 1 or value.is_graph_output() or users[0].op_type != op_type:
        return None
    return users[0]


class _Emitter:
    """Creates default-domain nodes in front of an anchor node, with fresh names."""

    def __init__(self, graph: ir.Graph) -> None:
        self.graph = graph
        self.names = NameSource.of(graph)

    def fresh(self, hint: str) -> str:
        return self.names.fresh(hint)

    def node(
        self, anchor: ir.Node, op: str, inputs: list[ir.Value | None], hint: str, **attrs: object
    ) -> ir.Value:
        out = ir.Value(name=self.fresh(hint))
        node = ir.node(op, inputs, attributes=attrs, outputs=[out], name=self.fresh(f"{hint}_node"))
        self.graph.insert_before(anchor, node)
        return out

    def const(self, array: np.ndarray, hint: str) -> ir.Value:
        name = self.fresh(hint)
        value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                         const_value=ir.tensor(array, name=name))  # fmt: skip
        self.graph.register_initializer(value)
        return value


def _weight_axis(em: _Emitter, op: str, scale: ir.Value) -> tuple[ir.Value, int | None] | str:
    """The weight scale as DequantizeLinear wants it and its axis; a message when it is neither form."""
    arr = const_array(scale)
    if arr is None or arr.size == 1:
        return scale, None
    if op == "MatMul" and arr.ndim == 1:
        return scale, -1
    if op == "Conv" and arr.squeeze().ndim == 1:
        return (em.const(arr.reshape(-1), f"{scale.name}_per_channel") if arr.ndim != 1 else scale), 0
    return f"weight scale of shape {arr.shape} is not per-tensor or per-channel"


def _dq(em: _Emitter, anchor: ir.Node, code: ir.Value, scale: ir.Value, zp: ir.Value | None,
        axis: int | None = None) -> ir.Value:  # fmt: skip
    attrs = {"axis": axis} if axis is not None else {}
    return em.node(anchor, "DequantizeLinear", [code, scale, zp], f"{code.name}_dequantized", **attrs)


def _take_over(em: _Emitter, old: ir.Value, new: ir.Value) -> None:
    """``new`` replaces ``old`` and takes its name (tensors stay comparable by name)."""
    name = old.name
    replace_value(old, new)
    if name and new.name != name:
        old.name = em.fresh(f"{name}_replaced")
        new.name = name


def _integer_tail(em: _Emitter, n: ir.Node) -> tuple[list[ir.Node], str | None]:
    """MatMulInteger/ConvInteger [-> Add(int32)] -> Cast -> Mul(s * sw): the rewrite, or why not."""
    where = f"{label(n)} ({n.op_type})"
    q, w, z, zw = (_in(n, i) for i in range(4))
    dql = q.producer() if q is not None else None
    if dql is None or dql.op_type != "DynamicQuantizeLinear":
        return [], f"{where}: its input is not produced by DynamicQuantizeLinear"
    s = dql.outputs[1]
    tail = [n]
    add = _only_consumer(n.outputs[0], "Add")
    bias = None
    if add is not None:
        bias = add.inputs[1] if add.inputs[0] is n.outputs[0] else add.inputs[0]
        tail.append(add)
    cast = _only_consumer(tail[-1].outputs[0], "Cast")
    mul = _only_consumer(cast.outputs[0], "Mul") if cast is not None else None
    if cast is None or mul is None:
        return (
            [],
            f"{where}: not followed by [Add(int32 bias) ->] Cast -> Mul (the dequantization ORT writes)",
        )
    factor = mul.inputs[1] if mul.inputs[0] is cast.outputs[0] else mul.inputs[0]
    prod = factor.producer() if factor is not None else None
    if prod is None or prod.op_type != "Mul" or s not in prod.inputs:
        return (
            [],
            f"{where}: the scale {factor.name if factor else '?'} is not a Mul of the input and weight scales",
        )
    sw = prod.inputs[1] if prod.inputs[0] is s else prod.inputs[0]
    op = "MatMul" if n.op_type == "MatMulInteger" else "Conv"
    got = _weight_axis(em, op, sw)
    if isinstance(got, str):
        return [], f"{where}: {got}"
    sw, axis = got
    attrs = {k: a.value for k, a in n.attributes.items()}
    xf = _dq(em, mul, q, s, z)
    wf = _dq(em, mul, w, sw, zw, axis)
    y = em.node(mul, op, [xf, wf], f"{n.name or op}_float", **attrs)
    if bias is not None:
        bf = em.node(mul, "Cast", [bias], f"{bias.name}_float", to=ir.DataType.FLOAT)
        y = em.node(
            mul,
            "Add",
            [y, em.node(mul, "Mul", [bf, factor], f"{bias.name}_scaled")],
            f"{n.name or op}_biased",
        )
    y.type, y.shape = mul.outputs[0].type, mul.outputs[0].shape
    _take_over(em, mul.outputs[0], y)
    return [mul, cast, *reversed(tail)], None


def _matmul_to_float(em: _Emitter, n: ir.Node) -> tuple[list[ir.Node], str | None]:
    """com.microsoft MatMulIntegerToFloat / DynamicQuantizeMatMul to DQ -> MatMul [-> Add(bias)]."""
    if n.op_type == "MatMulIntegerToFloat":
        a, b, sa, sb, za, zb, bias = (_in(n, i) for i in range(7))
        af = _dq(em, n, a, sa, za)
    else:
        x, b, sb, zb, bias = (_in(n, i) for i in range(5))
        qa = ir.Value(name=em.fresh(f"{x.name}_quantized"))
        sa, za = ir.Value(name=em.fresh(f"{x.name}_scale")), ir.Value(name=em.fresh(f"{x.name}_zero_point"))
        em.graph.insert_before(
            n, ir.node("DynamicQuantizeLinear", [x], outputs=[qa, sa, za], name=em.fresh(f"{x.name}_dql"))
        )
        af = _dq(em, n, qa, sa, za)
    got = _weight_axis(em, "MatMul", sb)
    if isinstance(got, str):
        return [], f"{label(n)} ({n.op_type}): {got}"
    y = em.node(n, "MatMul", [af, _dq(em, n, b, got[0], zb, got[1])], f"{n.name or 'MatMul'}_float")
    if bias is not None:
        y = em.node(n, "Add", [y, bias], f"{n.name or 'MatMul'}_biased")
    y.type, y.shape = n.outputs[0].type, n.outputs[0].shape
    _take_over(em, n.outputs[0], y)
    return [n], None


def _lstm_to_float(em: _Emitter, n: ir.Node) -> tuple[list[ir.Node], str | None]:
    """com.microsoft DynamicQuantizeLSTM to a float LSTM on its dequantized, transposed weights."""
    x, w, r, b, seq, h0, c0, p, sw, zw, sr, zr = (_in(n, i) for i in range(12))
    mats = []
    for code, scale, zero, what in ((w, sw, zw, "W"), (r, sr, zr, "R")):
        q, s = const_array(code), const_array(scale)
        z = const_array(zero) if zero is not None else np.zeros(1, np.float32)
        if q is None or s is None or z is None or q.ndim != 3:
            return [], f"{label(n)} (DynamicQuantizeLSTM): {what}, its scale or zero point is not a constant"
        if s.size not in (1, q.shape[0], q.shape[0] * q.shape[2]) or z.size not in (1, s.size):
            return (
                [],
                f"{label(n)} (DynamicQuantizeLSTM): {what} scale of shape {s.shape} is not per direction or per column",
            )
        shape = (q.shape[0], 1, -1) if s.size > 1 else ()
        zs = z.astype(np.float32).reshape(shape if z.size > 1 else ())
        real = (q.astype(np.float32) - zs) * s.astype(np.float32).reshape(shape)
        mats.append(em.const(np.ascontiguousarray(real.transpose(0, 2, 1), np.float32), f"{code.name}_float"))
    attrs = {k: a.value for k, a in n.attributes.items()}
    outs = [ir.Value(name=em.fresh(f"{o.name or 'lstm_out'}_float")) for o in n.outputs]
    em.graph.insert_before(n, ir.node("LSTM", [x, *mats, b, seq, h0, c0, p], attributes=attrs, outputs=outs,
                                      name=em.fresh(f"{n.name or 'LSTM'}_float")))  # fmt: skip
    for old, new in zip(n.outputs, outs, strict=True):
        new.type, new.shape = old.type, old.shape
        _take_over(em, old, new)
    return [n], None


class DynamicToQDQPass(ZonnxPass):
    """Rewrites dynamic-quantization integer ops into ``DynamicQuantizeLinear -> DQ -> float op``.

    No options. One change per rewritten op; an op it cannot rewrite stays and is a miss with the reason.
    """

    name = "dynamic-to-qdq"

    def apply(self, model: ir.Model) -> Changes:
        changes = Changes()
        em = _Emitter(model.graph)
        for node in list(model.graph):
            if node.graph is None:
                continue
            domain = "" if node.domain in ("", "ai.onnx") else node.domain
            if domain == "" and node.op_type in ("MatMulInteger", "ConvInteger"):
                dead, reason = _integer_tail(em, node)
            elif domain == _MS and node.op_type in ("MatMulIntegerToFloat", "DynamicQuantizeMatMul"):
                dead, reason = _matmul_to_float(em, node)
            elif domain == _MS and node.op_type == "DynamicQuantizeLSTM":
                dead, reason = _lstm_to_float(em, node)
            else:
                continue
            if reason is not None:
                changes.miss(reason)
                continue
            inputs = [v for d in dead for v in d.inputs]
            for d in dead:
                model.graph.remove(d, safe=True)
            prune(inputs)
            for v in inputs:  # the scale product Mul(s, sw) when nothing else reads it
                p = v.producer() if v is not None else None
                if (
                    p is not None
                    and p.graph is not None
                    and p.op_type == "Mul"
                    and not p.outputs[0].uses()
                    and not p.outputs[0].is_graph_output()
                ):
                    model.graph.remove(p, safe=True)
            changes.add(f"{node.op_type} -> DequantizeLinear/float op")
        if _MS in model.opset_imports and not any(n.domain == _MS for n in model.graph):
            del model.opset_imports[_MS]
        return changes
