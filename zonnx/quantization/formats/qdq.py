"""QDQ writer: standard QuantizeLinear/DequantizeLinear around every planned tensor.

- Tensors that share one scale (a latent op's input and output) share one scale and one zero-point
  initializer, named after the first of them (as ORT writes them).
- Activation T: ``Q(T) -> DQ -> consumers`` (every consumer, so float consumers see what an
  integer producer would write; only the planned consumers under the "kernels" placement); a graph
  output keeps its name.
- Weight W: stored as integer codes with a DequantizeLinear (``axis`` when per channel); with
  ``AddQDQPairToWeight`` the float weight stays and gets a Q/DQ pair instead.
- Bias B: int32 codes at s_X * s_W with a DequantizeLinear.
- bfloat16 "quantization" of a tensor is a Cast pair (to bfloat16 and back to float).

A float16 tensor gets float16 scales and a float16 DequantizeLinear output (opset 19+).

The opset must allow what is used: per-channel needs 13, 16-bit and 4-bit types need 21; the
caller upgrades the model first (``required_opset``).
"""

from __future__ import annotations

__all__ = ["write_qdq", "required_opset"]

import logging
from collections import Counter

import numpy as np
import onnx_ir as ir

from zonnx.quantization.formats.common import ValueIndex, add_initializer, consumer_nodes, insert_on_value
from zonnx.quantization.plan import QuantPlan, Role, TensorPlan
from zonnx.quantization.schemes import QuantParams, quantize

logger = logging.getLogger(__name__)

_IR_TYPES = {
    "int8": ir.DataType.INT8,
    "uint8": ir.DataType.UINT8,
    "int16": ir.DataType.INT16,
    "uint16": ir.DataType.UINT16,
    "int4": ir.DataType.INT4,
    "uint4": ir.DataType.UINT4,
    "int32": ir.DataType.INT32,
    "float8e4m3fn": ir.DataType.FLOAT8E4M3FN,
}


def required_opset(plan: QuantPlan) -> int:
    """Lowest default-domain opset whose Q/DQ ops accept every type and axis in the plan."""
    need = 13  # zonnx writes opset 13+ so per-channel DQ and int32 bias DQ are always valid
    for tp in plan.tensors.values():
        if tp.params is not None:
            need = max(need, tp.params.dtype.min_opset)
            if tp.params.block_size:  # block_size is an attribute of opset 21's Q/DQ
                need = max(need, 21)
            if tp.float16:  # QuantizeLinear/DequantizeLinear take float16 from opset 19
                need = max(need, 19)
        if tp.convert_params is not None:
            need = max(need, tp.convert_params.dtype.min_opset)
    return need


def _qdq_nodes(
    index: ValueIndex,
    graph: ir.Graph,
    name: str,
    params: QuantParams,
    src: ir.Value,
    pair: bool,
    float_type: ir.DataType = ir.DataType.FLOAT,
    shared: tuple[ir.Value, ir.Value] | None = None,
) -> tuple[list[ir.Node], ir.Value]:
    np_float = np.float16 if float_type == ir.DataType.FLOAT16 else np.float32
    if shared is not None:
        scale, zp = shared
    else:
        scale = add_initializer(graph, index, f"{name}_scale", np.asarray(params.scale, np_float))
        zp = add_initializer(
            graph, index, f"{name}_zero_point", np.asarray(params.zero_point), _IR_TYPES[params.dtype.name]
        )
    attrs: dict[str, int] = {"axis": params.axis} if params.axis is not None else {}
    if params.block_size:
        attrs["block_size"] = params.block_size
    nodes: list[ir.Node] = []
    codes = src
    if pair:
        q_out = ir.Value(name=index.unique(f"{name}_QuantizeLinear_Output"))
        nodes.append(
            ir.node(
                "QuantizeLinear",
                [src, scale, zp],
                attrs,
                outputs=[q_out],
                name=index.unique(f"{name}_QuantizeLinear"),
            )
        )
        codes = q_out
    dq_out = ir.Value(
        name=index.unique(f"{name}_DequantizeLinear_Output"),
        type=ir.TensorType(float_type),
        shape=src.shape,
    )
    nodes.append(
        ir.node(
            "DequantizeLinear",
            [codes, scale, zp],
            attrs,
            outputs=[dq_out],
            name=index.unique(f"{name}_DequantizeLinear"),
        )
    )
    return nodes, dq_out


def _same(a: QuantParams, b: QuantParams) -> bool:
    return (
        a.dtype == b.dtype
        and a.axis == b.axis
        and np.array_equal(a.scale, b.scale)
        and np.array_equal(a.zero_point, b.zero_point)
    )


def _write_tensor(
    graph: ir.Graph,
    index: ValueIndex,
    tp: TensorPlan,
    add_pair_to_weight: bool,
    group: dict[str, tuple[QuantParams, ir.DataType, tuple[ir.Value, ir.Value]]],
    root: str,
) -> None:
    value = index[tp.name]
    params = tp.params
    assert params is not None, f"tensor {tp.name} has no parameters"
    ftype = ir.DataType.FLOAT16 if value.dtype == ir.DataType.FLOAT16 else ir.DataType.FLOAT
    first = group.get(root)
    shared = first[2] if first is not None and first[1] == ftype and _same(first[0], params) else None
    if tp.role is Role.ACTIVATION and tp.convert_params is not None:
        _write_converted(graph, index, tp, ftype, shared)
        return
    if tp.role is Role.ACTIVATION or (tp.role is Role.WEIGHT and add_pair_to_weight):

        def build(v: ir.Value) -> tuple[list[ir.Node], ir.Value]:
            nodes, out = _qdq_nodes(
                index, graph, tp.name, params, v, pair=True, float_type=ftype, shared=shared
            )
            if root not in group and tp.role is Role.ACTIVATION:
                group[root] = (params, ftype, (nodes[0].inputs[1], nodes[0].inputs[2]))
            return nodes, out

        insert_on_value(graph, value, build, consumer_nodes(value, tp.consumers))
        return
    array = np.asarray(value.const_value.numpy(), np.float32)
    codes = quantize(array, params)
    stored = add_initializer(graph, index, f"{tp.name}_quantized", codes, _IR_TYPES[params.dtype.name])
    insert_on_value(
        graph,
        value,
        lambda _v: _qdq_nodes(index, graph, tp.name, params, stored, pair=False, float_type=ftype),
    )


def _dq(index: ValueIndex, src: ir.Value, qdq: tuple[ir.Value, ir.Value], out: str, node: str, ftype: ir.DataType,
        like: ir.Value) -> ir.Node:  # fmt: skip
    value = ir.Value(name=index.unique(out), type=ir.TensorType(ftype), shape=like.shape)
    return ir.node("DequantizeLinear", [src, *qdq], outputs=[value], name=index.unique(node))


def _q(index: ValueIndex, src: ir.Value, qdq: tuple[ir.Value, ir.Value], out: str, node: str) -> ir.Node:
    return ir.node(
        "QuantizeLinear", [src, *qdq], outputs=[ir.Value(name=index.unique(out))], name=index.unique(node)
    )


def _write_converted(
    graph: ir.Graph,
    index: ValueIndex,
    tp: TensorPlan,
    ftype: ir.DataType,
    shared: tuple[ir.Value, ir.Value] | None,
) -> None:
    """TensorQuantOverrides 'convert' (ORT's layout): ``Q1 -> DQ1`` for the other readers and
    ``Q1 -> DQ1' -> Q2 -> DQ2`` for the converting readers (one DQ1 when every reader converts); a graph
    output keeps its name on the last DQ its readers' type ends in."""
    value, n = index[tp.name], tp.name
    assert tp.params is not None and tp.convert_params is not None
    np_float = np.float16 if ftype == ir.DataType.FLOAT16 else np.float32

    def qparams(params: QuantParams, suffix: str) -> tuple[ir.Value, ir.Value]:
        scale = add_initializer(graph, index, f"{n}_scale{suffix}", np.asarray(params.scale, np_float))
        zp = add_initializer(graph, index, f"{n}_zero_point{suffix}", np.asarray(params.zero_point),
                             _IR_TYPES[params.dtype.name])  # fmt: skip
        return scale, zp

    first = shared if shared is not None else qparams(tp.params, "")
    second = qparams(tp.convert_params, "_convert")
    uses = list(value.uses())
    recv = {u.node.name for u in uses} if tp.convert_recv is None else set(tp.convert_recv)
    original = [u for u in uses if u.node.name not in recv]
    converted = [u for u in uses if u.node.name in recv]
    all_converted = not original
    is_output = value.is_graph_output()
    q1 = _q(index, value, first, f"{n}_QuantizeLinear_Output", f"{n}_QuantizeLinear")
    dq1 = _dq(
        index, q1.outputs[0], first, f"{n}_DequantizeLinear_Output", f"{n}_DequantizeLinear", ftype, value
    )
    nodes = [q1, dq1]
    src2 = dq1.outputs[0]
    if not all_converted:
        clone = _dq(index, q1.outputs[0], first, f"{n}_convert_QuantizeLinear_Input",
                    f"{n}_convert_clone_DequantizeLinear", ftype, value)  # fmt: skip
        nodes.append(clone)
        src2 = clone.outputs[0]
    q2 = _q(index, src2, second, f"{n}_convert_QuantizeLinear_Output", f"{n}_convert_QuantizeLinear")
    dq2 = _dq(index, q2.outputs[0], second, f"{n}_convert_DequantizeLinear_Output",
              f"{n}_convert_DequantizeLinear", ftype, value)  # fmt: skip
    nodes += [q2, dq2]
    producer = value.producer()
    if producer is not None:
        graph.insert_after(producer, nodes)
    else:
        graph.insert_before(next(iter(graph)), nodes)
    for use in original:
        use.node.replace_input_with(use.idx, dq1.outputs[0])
    for use in converted:
        use.node.replace_input_with(use.idx, dq2.outputs[0])
    if is_output:
        final = dq2.outputs[0] if all_converted else dq1.outputs[0]
        graph.outputs[:] = [final if o is value else o for o in graph.outputs]
        value.name = f"{n}_QuantizeLinear_Input"
        final.name = n
        final.type, final.shape = value.type, value.shape


def write_qdq(model: ir.Model, plan: QuantPlan, *, add_qdq_pair_to_weight: bool = False) -> Counter[str]:
    """Insert the nodes for every planned tensor with parameters; returns counts by role."""
    graph = model.graph
    index = ValueIndex(graph)
    counts: Counter[str] = Counter()
    groups: dict[str, tuple[QuantParams, ir.DataType, tuple[ir.Value, ir.Value]]] = {}
    for tp in plan.tensors.values():
        if tp.params is None or tp.name not in index or tp.prequantized:
            continue
        _write_tensor(graph, index, tp, add_qdq_pair_to_weight, groups, plan.find(tp.name))
        counts[tp.role.value] += 1
    for name, v in list(graph.initializers.items()):
        if not v.uses() and not v.is_graph_output():
            graph.initializers.pop(name)
    return counts


def write_bfloat16(model: ir.Model, plan: QuantPlan) -> Counter[str]:
    """Round every planned activation and weight to bfloat16 with a Cast pair."""
    graph = model.graph
    index = ValueIndex(graph)
    counts: Counter[str] = Counter()

    def cast_pair(v: ir.Value, name: str) -> tuple[list[ir.Node], ir.Value]:
        mid = ir.Value(name=index.unique(f"{name}_bf16"))
        out = ir.Value(
            name=index.unique(f"{name}_bf16_float"), type=ir.TensorType(ir.DataType.FLOAT), shape=v.shape
        )
        return [
            ir.node(
                "Cast", [v], {"to": ir.DataType.BFLOAT16}, outputs=[mid], name=index.unique(f"{name}_ToBF16")
            ),
            ir.node(
                "Cast", [mid], {"to": ir.DataType.FLOAT}, outputs=[out], name=index.unique(f"{name}_FromBF16")
            ),
        ], out

    for tp in plan.tensors.values():
        if tp.role is Role.BIAS or tp.name not in index:
            continue
        insert_on_value(graph, index[tp.name], lambda v, n=tp.name: cast_pair(v, n))
        counts[tp.role.value] += 1
    return counts
