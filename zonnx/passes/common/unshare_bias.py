"""Give each Conv/ConvTranspose/Gemm its own bias initializer when several share one.

Weight deduplication (``dead-code``) merges equal biases, zero biases above all. A quantized bias is
stored as int32 codes at ``s_X * s_W`` of its own node, so a bias shared by nodes with different input
or weight scales has no single correct encoding, and ONNX Runtime fuses a QDQ group into an integer
kernel only when each DequantizeLinear feeds one node. The copy keeps the values; only names change.
"""

from __future__ import annotations

__all__ = ["UnshareBiasPass"]

import onnx_ir as ir

from zonnx.passes.base import Changes, ZonnxPass

_BIAS_INDEX = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}


def _unique(graph: ir.Graph, base: str) -> str:
    name, i = base, 1
    while name in graph.initializers:
        name, i = f"{base}_{i}", i + 1
    return name


class UnshareBiasPass(ZonnxPass):
    """Replaces a bias initializer read by several linear nodes with one copy per extra node.

    Preserves every output bit for bit; leaves biases that are graph inputs alone.
    """

    name = "unshare-bias"

    def apply(self, model: ir.Model) -> Changes:
        changes = Changes()
        graph = model.graph
        for node in graph:
            index = _BIAS_INDEX.get(node.op_type)
            if index is None or node.domain not in ("", "ai.onnx") or len(node.inputs) <= index:
                continue
            bias = node.inputs[index]
            if (
                bias is None
                or bias.const_value is None
                or bias.is_graph_input()
                or bias.name not in graph.initializers
            ):
                continue
            readers = {id(use.node) for use in bias.uses()}
            if len(readers) < 2 or next(iter(bias.uses())).node is node:
                continue  # the first reader keeps the original
            copy = ir.Value(
                name=_unique(graph, f"{bias.name}_{node.name or node.op_type}"),
                shape=bias.shape,
                type=bias.type,
                const_value=ir.tensor(bias.const_value.numpy().copy()),
            )
            graph.register_initializer(copy)
            node.replace_input_with(index, copy)
            changes.add(f"gave {node.op_type} its own bias")
        return changes
