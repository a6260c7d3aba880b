"""Shape inference that finishes on older exports: shape arithmetic is folded, custom Q/DQ ops pass shapes.

onnx's data propagation skips most ops before opset 13 (Cast, Slice, Concat, Unsqueeze...), so a
Reshape whose target is computed from ``Shape`` stays unshaped in older exports (PP-OCR). Once input
shapes are numbers, ``infer_folded`` evaluates those small integer computations with
``onnx.reference``, replaces them by Constants and infers again, until nothing changes. Ops onnx has
no schema for but whose output has the shape of their input (com.microsoft QuantizeLinear, FixNeuron)
get that shape, so the convolutions behind them can be counted.
"""

from __future__ import annotations

__all__ = ["infer_folded"]

import logging
from collections.abc import Mapping

import numpy as np
import onnx
import onnx.numpy_helper

from zonnx.inspection.shapes import DEFAULT_DOMAINS, ValueType, infer, iter_graphs, value_types

logger = logging.getLogger(__name__)

#: Ops folded once all their inputs hold known small values: the arithmetic of shape computations.
_FOLDABLE = frozenset(
    {
        "Shape", "Size", "Cast", "Slice", "Concat", "Gather", "Unsqueeze", "Squeeze", "Add", "Sub", "Mul",
        "Div", "Mod", "Reshape", "Identity", "Range", "Equal", "Where", "ReduceProd", "Floor", "Ceil",
        "Min", "Max", "Neg", "Abs", "Not", "Greater", "Less", "Transpose",
    }
)  # fmt: skip
#: Values with more elements than this are neither folded from nor folded into Constants.
_FOLD_MAX_ELEMENTS = 4096
_MAX_FOLD_ROUNDS = 8


def _small_values(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Values of the graph's small inline initializers and Constant nodes."""
    values: dict[str, np.ndarray] = {}
    tensors = [(t.name, t) for t in graph.initializer]
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS and len(node.attribute) == 1:
            attr = node.attribute[0]
            if attr.name == "value":
                tensors.append((node.output[0], attr.t))
            elif attr.name in ("value_int", "value_ints"):
                values[node.output[0]] = np.array(
                    attr.i if attr.name == "value_int" else list(attr.ints), np.int64
                )
            elif attr.name in ("value_float", "value_floats"):
                values[node.output[0]] = np.array(
                    attr.f if attr.name == "value_float" else list(attr.floats), np.float32
                )
    for name, t in tensors:
        size = int(np.prod(t.dims)) if t.dims else 1
        if t.data_location != onnx.TensorProto.EXTERNAL and size <= _FOLD_MAX_ELEMENTS:
            try:
                values[name] = onnx.numpy_helper.to_array(t)
            except Exception:  # unusual types (strings, float8) are not shape arithmetic
                continue
    return values


def _shape_value(node: onnx.NodeProto, types: Mapping[str, ValueType]) -> np.ndarray | None:
    vt = types.get(node.input[0])
    if vt is None or vt.dims is None or not all(isinstance(d, int) for d in vt.dims):
        return None
    start = next((a.i for a in node.attribute if a.name == "start"), 0)
    end = next((a.i for a in node.attribute if a.name == "end"), None)
    return np.array(vt.dims[start:end], np.int64)


def _evaluate(
    nodes: list[onnx.NodeProto], values: dict[str, np.ndarray], opsets: list[onnx.OperatorSetIdProto]
) -> dict[str, np.ndarray]:
    """Run ``nodes`` with onnx.reference on known ``values``; returns the outputs it could compute.

    All at once first; if the evaluator rejects that (an op version it lacks), node by node, skipping
    the nodes that fail and those that depend on them.
    """
    from onnx.reference import ReferenceEvaluator

    def run(batch: list[onnx.NodeProto], known: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = [o for n in batch for o in n.output if o]
        feeds = sorted({i for n in batch for i in n.input if i} - set(outputs))
        graph = onnx.helper.make_graph(
            batch,
            "fold",
            [],
            [onnx.helper.make_empty_tensor_value_info(o) for o in outputs],
            [onnx.numpy_helper.from_array(np.asarray(known[i]), i) for i in feeds],
        )
        got = ReferenceEvaluator(onnx.helper.make_model(graph, opset_imports=opsets)).run(None, {})
        return {o: np.asarray(v) for o, v in zip(outputs, got, strict=True)}

    try:
        return run(nodes, values)
    except Exception as e:  # the reference evaluator raises many types
        logger.info("shape folding node by node: %s", e)
    known = dict(values)
    for node in nodes:
        if all(not i or i in known for i in node.input):
            try:
                known.update(run([node], known))
            except Exception:  # this node cannot be evaluated: leave it (and its users) to inference
                continue
    return {o: known[o] for n in nodes for o in n.output if o in known}


def _fold_once(model: onnx.ModelProto, types: Mapping[str, ValueType]) -> int:
    """Replace foldable main-graph nodes by Constants in place; return how many were replaced.

    A ``Shape`` folds when its input's dims are numbers; other ``_FOLDABLE`` ops fold when every input
    is a small constant or a folded value.
    """
    graph = model.graph
    values = _small_values(graph)
    reachable = set(values)
    folded: dict[str, np.ndarray] = {}
    chosen: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.domain not in DEFAULT_DOMAINS or node.op_type not in _FOLDABLE or not node.output:
            continue
        if node.op_type == "Shape":
            value = _shape_value(node, types)
            if value is not None:
                values[node.output[0]] = folded[node.output[0]] = value
                reachable.add(node.output[0])
        elif all(not i or i in reachable for i in node.input):
            chosen.append(node)
            reachable.update(o for o in node.output if o)
    if chosen:
        folded.update(
            _evaluate(chosen, values, [op for op in model.opset_import if op.domain in DEFAULT_DOMAINS])
        )
    replaced = 0
    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        outputs = [o for o in node.output if o]
        if (
            node.op_type in _FOLDABLE
            and node.domain in DEFAULT_DOMAINS
            and outputs
            and all(o in folded and folded[o].size <= _FOLD_MAX_ELEMENTS for o in outputs)
        ):
            new_nodes.extend(
                onnx.helper.make_node("Constant", [], [o], value=onnx.numpy_helper.from_array(folded[o], o))
                for o in outputs
            )
            replaced += 1
        else:
            new_nodes.append(node)
    if replaced:
        del graph.node[:]
        graph.node.extend(new_nodes)
    return replaced


#: Ops outside onnx's schemas whose output has the shape of input 0 (quantize/dequantize-like).
_PASSTHROUGH = frozenset(
    {"QuantizeLinear", "DequantizeLinear", "FixNeuron", "VitisQuantizeLinear", "VitisDequantizeLinear"}
)


def _is_passthrough(node: onnx.NodeProto) -> bool:
    if node.domain in DEFAULT_DOMAINS:
        return False
    lower = node.op_type.lower()
    return node.op_type in _PASSTHROUGH or ("zonnx" in node.domain and ("quant" in lower or "fix" in lower))


def _passthrough_once(model: onnx.ModelProto, types: Mapping[str, ValueType]) -> int:
    """Give shapeless outputs of quantize-like custom ops (com.microsoft Q/DQ, FixNeuron) input 0's shape.

    The element type is the scale's for a dequantize, the zero point's (else uint8) for a quantize,
    and input 0's otherwise. Returns how many outputs got a shape.
    """
    added = 0
    for graph in iter_graphs(model.graph):
        for node in graph.node:
            if not _is_passthrough(node) or not node.input or not node.output or node.output[0] in types:
                continue
            src = types.get(node.input[0])
            if src is None or src.dims is None:
                continue
            elem = src.elem_type
            if "Dequantize" in node.op_type and len(node.input) > 1:
                elem = types[node.input[1]].elem_type if node.input[1] in types else onnx.TensorProto.FLOAT
            elif "Quantize" in node.op_type:
                zp = types.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
                elem = zp.elem_type if zp is not None else onnx.TensorProto.UINT8
            shape = [d if d is not None else "?" for d in src.dims]
            graph.value_info.append(onnx.helper.make_tensor_value_info(node.output[0], elem, shape))
            added += 1
    return added


def infer_folded(model: onnx.ModelProto) -> tuple[onnx.ModelProto | None, str]:
    """Infer shapes of ``model`` (changed in place: shape arithmetic becomes Constants) until stable.

    Each round folds shape arithmetic and gives quantize-like custom ops their input's shape, then
    infers again.
    """
    inferred, error = infer(model)
    for _ in range(_MAX_FOLD_ROUNDS):
        if inferred is None:
            break
        types = value_types(inferred)
        if not _passthrough_once(inferred, types) + _fold_once(inferred, types):
            break
        inferred, error = infer(inferred)
    return inferred, error
