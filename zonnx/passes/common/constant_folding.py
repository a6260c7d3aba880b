"""Fold nodes whose inputs are all constant (and shape computations on static shapes) into initializers."""

from __future__ import annotations

__all__ = ["ConstantFoldingPass", "StaticInfo", "constant_array", "describe", "is_constant"]

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from zonnx.passes.base import Changes, ZonnxPass
from zonnx.passes.common.fold_evaluate import evaluate
from zonnx.passes.common.shape_vectors import Partial, shape_partial
from zonnx.passes.common.static_info import ONNX_DOMAINS, StaticInfo, constant_array, describe, is_constant

#: Random ops: folding would freeze one sample.
_RANDOM = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)
#: Quantization ops keep their constant inputs: folding them would turn quantized weights back to float.
_KEEP_QUANTIZED = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


def _predicted_elements(node: ir.Node, arrays: Sequence[np.ndarray | None], info: StaticInfo) -> int | None:
    """Element count of the largest output, known before evaluating (to refuse huge results cheaply)."""
    sizes = [math.prod(s) for s in (info.shape(v) for v in node.outputs) if s is not None]
    if sizes:
        return max(sizes)
    op = node.op_type
    try:
        if op == "ConstantOfShape":
            return int(np.prod(arrays[0]))
        if op == "Expand":
            return int(np.prod(np.broadcast_shapes(arrays[0].shape, tuple(int(d) for d in arrays[1]))))
        if op == "Tile":
            return int(np.prod(np.array(arrays[0].shape) * arrays[1]))
        if op == "Range":
            start, limit, delta = (float(a) for a in arrays[:3])
            return max(math.ceil((limit - start) / delta), 0)
    except (ValueError, TypeError, IndexError, ZeroDivisionError, AttributeError):
        return None
    return None


def _make_initializer(graph: ir.Graph, old: ir.Value, tensor: ir.TensorProtocol) -> ir.Value:
    """Register ``tensor`` as an initializer named like ``old`` and point every use of ``old`` at it."""
    tensor.name = old.name
    new = ir.Value(
        name=old.name, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype), const_value=tensor
    )
    new.metadata_props.update(old.metadata_props)
    graph.register_initializer(new)
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    return new


class ConstantFoldingPass(ZonnxPass):
    """Lift ``Constant`` nodes to initializers, then replace nodes computable at export time by initializers.

    A node folds when every input is constant, or when it computes a shape vector whose entries are
    all static (``Shape``/``Size`` and ``Cast``/``Gather``/``Slice``/``Concat``/``(Un)Squeeze`` on it).
    Never folded: random ops, ops with subgraphs, non-ONNX domains, (De)QuantizeLinear, and any result
    over ``size_limit`` bytes (recorded as a miss). Folded values keep their names, so graph outputs
    keep theirs. Nodes and initializers left unused by folding are removed.

    Options:
        size_limit: largest folded output in bytes (default 1 << 24, 16 MiB).
    """

    name = "constant-folding"

    #: Rounds of inference+folding while shape computations keep folding.
    max_rounds = 4

    def __init__(self, size_limit: int = 1 << 24) -> None:
        super().__init__()
        self.size_limit = size_limit

    def apply(self, model: ir.Model) -> Changes:
        changes = Changes()
        opsets = dict(model.opset_imports)
        if "" not in opsets and "ai.onnx" in opsets:
            opsets[""] = opsets["ai.onnx"]
        for graph in list(model.graphs()):
            _lift_constants(graph, changes)
        # Folding a shape computation can make more shapes static: infer again and repeat (few rounds).
        for _ in range(self.max_rounds):
            info, round_changes = StaticInfo.of(model), Changes()
            shape_folds = sum(self._fold_graph(g, info, opsets, round_changes) for g in list(model.graphs()))
            changes.counts.update(round_changes.counts)
            if not shape_folds:
                break
        changes.misses.extend(round_changes.misses)
        if model.ir_version < 4 and changes.total:
            model.ir_version = 4  # IR 3 wants every initializer listed as an input; 4 does not
            changes.add("raised IR version 3 to 4 for initializers that are not inputs")
        return changes

    def _fold_graph(self, graph: ir.Graph, info: StaticInfo, opsets: dict[str, int], changes: Changes) -> int:
        """Fold one graph in topological order; return how many shape computations folded."""
        partials: dict[ir.Value, Partial] = {}
        kept_quantized = shape_folds = 0
        folded_inputs: list[ir.Value] = []
        for node in list(graph):
            if node.domain not in ONNX_DOMAINS or node.op_type == "Constant":
                continue
            if any(
                a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()
            ):
                continue
            all_const = bool(node.inputs) and all(v is None or is_constant(v) for v in node.inputs)
            if node.op_type == "CastLike" and is_constant(node.inputs[0]) and info.dtype(node.inputs[1]):
                all_const = True  # only the target's type matters, and it is known
            if node.op_type in _RANDOM:
                if all_const or not node.inputs:
                    changes.miss(f"{describe(node)}: random; not folded")
                continue
            if node.op_type in _KEEP_QUANTIZED:
                kept_quantized += all_const
                continue
            results: list[np.ndarray] | None = None
            if not all_const:
                part = shape_partial(node, info, partials)
                if part is None:
                    continue
                known = part.known()
                if known is None:
                    partials[node.outputs[0]] = part
                    continue
                results = [known]
                shape_folds += 1
            else:
                results = self._evaluate_checked(node, info, opsets, changes)
                if results is None:
                    continue
            folded_inputs.extend(v for v in node.inputs if v is not None)
            for value, array in zip([v for v in node.outputs if v.name], results, strict=True):
                # keeps 0-d scalars 0-d
                _make_initializer(graph, value, ir.tensor(np.asarray(array, order="C")))
            graph.remove(node, safe=True)
            changes.add(f"folded {node.op_type}")
        if kept_quantized:
            changes.miss(
                f"{kept_quantized} constant (De)QuantizeLinear node(s) kept so weights stay quantized"
            )
        _drop_dead(graph, folded_inputs, changes)
        return shape_folds

    def _evaluate_checked(
        self, node: ir.Node, info: StaticInfo, opsets: dict[str, int], changes: Changes
    ) -> list[np.ndarray] | None:
        """Evaluate, refusing results over the size limit or of another type than the graph declares."""
        arrays = [constant_array(v) if v is not None else None for v in node.inputs]
        if node.op_type == "CastLike" and arrays[1] is None:
            arrays[1] = np.empty((0,), info.dtype(node.inputs[1]).numpy())  # type: ignore[union-attr]
        if any(a is None for v, a in zip(node.inputs, arrays, strict=True) if v is not None):
            return None
        dtypes = [info.dtype(v) for v in node.outputs]
        if ir.DataType.STRING in dtypes:
            return None
        itemsize = max((d.itemsize for d in dtypes if d is not None), default=1)
        predicted = _predicted_elements(node, arrays, info)
        if predicted is not None and int(predicted * itemsize) > self.size_limit:
            changes.miss(
                f"{describe(node)}: result of about {int(predicted * itemsize)} bytes is over "
                f"the folding limit of {self.size_limit}; kept"
            )
            return None
        try:
            results = [np.asarray(r) for r in evaluate(node, arrays, opsets)]
        except Exception as e:  # evaluators raise many types; a miss is the right outcome here
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            changes.miss(f"{describe(node)}: cannot be evaluated ({first}); kept")
            return None
        named = [v for v in node.outputs if v.name]
        if len(results) != len(named):
            return None
        for value, array in zip(named, results, strict=True):
            if array.nbytes > self.size_limit:
                changes.miss(
                    f"{describe(node)}: output {value.name!r} has {array.nbytes} bytes, "
                    f"over the folding limit of {self.size_limit}; kept"
                )
                return None
            expected = info.dtype(value)
            if array.dtype == object or (expected is not None and expected.numpy() != array.dtype):
                changes.miss(
                    f"{describe(node)}: evaluated type {array.dtype} is not the declared {expected}; kept"
                )
                return None
        return results


def _lift_constants(graph: ir.Graph, changes: Changes) -> None:
    """Turn each Constant node into an initializer of the same name (graph outputs stay Constant nodes)."""
    for node in list(graph):
        if node.op_type != "Constant" or node.domain not in ONNX_DOMAINS:
            continue
        value = node.outputs[0]
        if value.is_graph_output():
            continue
        if len(node.attributes) != 1 or "sparse_value" in node.attributes or value.name in graph.initializers:
            changes.miss(f"{describe(node)}: sparse, malformed or name taken by an initializer; kept")
            continue
        tensor = ir.convenience.get_const_tensor(value)
        if tensor is None or tensor.dtype == ir.DataType.STRING:
            continue
        _make_initializer(graph, value, tensor)
        graph.remove(node, safe=True)
        changes.add("lifted Constant to initializer")


def _drop_dead(graph: ir.Graph, candidates: list[ir.Value], changes: Changes) -> None:
    """Remove the folded nodes' former inputs (and their producers, transitively) once nothing uses them."""
    work = list(candidates)
    while work:
        value = work.pop()
        if value.uses() or value.is_graph_output() or value.is_graph_input():
            continue
        if value.is_initializer() and value.graph is graph and value.name in graph.initializers:
            graph.initializers.pop(value.name)
            changes.add("removed initializer left unused by folding")
            continue
        node = value.producer()
        if (
            node is None
            or node.graph is not graph
            or any(o.uses() or o.is_graph_output() for o in node.outputs)
        ):
            continue
        work.extend(v for v in node.inputs if v is not None)
        graph.remove(node, safe=True)
        changes.add(f"removed {node.op_type} left unused by folding")
