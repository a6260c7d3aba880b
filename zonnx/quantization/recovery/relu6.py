"""``ReplaceClip6Relu``: ReLU6 written as ``Clip(x, 0, 6)`` becomes ``Relu(x)`` (Vitis AI's replace_relu6).

The float function changes wherever a Clip input exceeds 6 (Relu lets it through). Vitis AI does this
before cross-layer equalization, which cannot equalize through a finite Clip bound (see ``cle.py``).
"""

from __future__ import annotations

__all__ = ["replace_clip6_relu"]

import logging

import onnx_ir as ir

from zonnx.passes.fusion.matching import const_array

logger = logging.getLogger(__name__)


def _bound(node: ir.Node, index: int) -> float | None:
    value = node.inputs[index] if len(node.inputs) > index else None
    arr = const_array(value) if value is not None else None
    return float(arr.reshape(())) if arr is not None and arr.size == 1 else None


def replace_clip6_relu(model: ir.Model) -> int:
    """Replace every main-graph ``Clip`` with constant min 0 and max 6 by ``Relu``; return how many."""
    graph = model.graph
    count = 0
    for node in list(graph):
        if node.op_type != "Clip" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 3:
            continue
        if _bound(node, 1) != 0.0 or _bound(node, 2) != 6.0:
            continue
        out = node.outputs[0]
        relu = ir.node("Relu", [node.inputs[0]], name=node.name)
        graph.insert_after(node, relu)
        new = relu.outputs[0]
        new.type, new.shape = out.type, out.shape
        out.replace_all_uses_with(new, replace_graph_outputs=True)
        bounds = [v for v in node.inputs[1:] if v is not None]
        name = out.name
        graph.remove(node, safe=True)
        new.name = name
        for v in bounds:
            if (
                v.is_initializer()
                and not v.uses()
                and not v.is_graph_output()
                and v.name in graph.initializers
            ):
                graph.initializers.pop(v.name)
        count += 1
    if count:
        logger.warning(
            "ReplaceClip6Relu: replaced %d Clip(0, 6) by Relu; the float model now differs wherever those "
            "inputs exceed 6",
            count,
        )
    return count
