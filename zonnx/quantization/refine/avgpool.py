"""Average pooling: the hardware divides by kh*kw with a multiply and a shift, ``sum * k >> n``.

Rule (vai_q_tensorflow/vai_q_onnx DPU simulation; the factors come from ``[quant.avgpool]``)::

    1/(kh*kw) ~ k / 2^n        3x3: 7/64, 5x5: 10/256, 6x6: 7/256, 7x7: 21/1024, 14x14: 21/4096,
                               else the closest k/2^n (see ``AvgPoolFactor.factor``)
    mean * (kh*kw*k / 2^n)     what the NPU computes; e.g. 3x3: mean * 63/64

When the division is inexact the pass inserts ``Mul(pool_out, kh*kw*k/2^n)`` between the pool and
its output quantizer, so the quantized model computes what the NPU will, and records the factor on the
pool (metadata "zonnx.avgpool_factor" = "k/2^n") and in the changes. A pool whose output already goes
through such a Mul is left alone. GlobalAveragePool needs its input's spatial shape (run shape
inference first); padded windows are scaled like full ones, as the NPU does.
"""

from __future__ import annotations

__all__ = ["AvgPoolFactorPass", "FACTOR_KEY"]

import logging

import numpy as np
import onnx_ir as ir

from zonnx.backend.targets import AvgPoolFactor
from zonnx.passes.base import Changes
from zonnx.passes.fusion.matching import label
from zonnx.quantization.refine.base import RefinePass
from zonnx.quantization.refine.positions import REFINE_MARK, QuantGraph, is_refine_node

logger = logging.getLogger(__name__)

#: Pool metadata key recording the factor "k/2^n" the hardware multiplies the window sum by.
FACTOR_KEY = "zonnx.avgpool_factor"
_MARK_VALUE = "avgpool_factor"


def _kernel(node: ir.Node) -> tuple[int, int] | str:
    """(kh, kw) of a 2-D average pool, or why it has none."""
    if node.op_type == "AveragePool":
        kernel = node.attributes.get_ints("kernel_shape")
        if kernel is None or len(kernel) != 2:
            return f"kernel_shape {kernel} is not 2-D"
        return int(kernel[0]), int(kernel[1])
    shape = node.inputs[0].shape
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape[2:]):
        return f"input {node.inputs[0].name!r} has no static 4-D shape ({shape}); run shape-inference first"
    return int(shape[2]), int(shape[3])


class AvgPoolFactorPass(RefinePass):
    """Makes average pools compute the NPU's ``sum * k / 2^n`` instead of the exact mean.

    Acts when the target has ``[quant.avgpool]``. Options: see ``RefinePass``.
    """

    name = "refine-avgpool-factor"
    rule_key = "avgpool"

    def sweep(self, model: ir.Model, graph: QuantGraph, rule: AvgPoolFactor, changes: Changes) -> None:
        for node in list(model.graph):
            if node.op_type not in ("AveragePool", "GlobalAveragePool") or node.domain not in ("", "ai.onnx"):
                continue
            out = node.outputs[0]
            if any(
                is_refine_node(c) and c.metadata_props.get(REFINE_MARK) == _MARK_VALUE
                for c in out.consumers()
            ):
                continue
            kernel = _kernel(node)
            if isinstance(kernel, str):
                changes.miss(f"{label(node)}: {kernel}")
                continue
            kh, kw = kernel
            factor = rule.factor(kh, kw)
            if factor is None:
                continue
            k, n = factor
            scale = kh * kw * k / 2**n
            self._insert(model.graph, graph, node, np.float32(scale))
            node.metadata_props[FACTOR_KEY] = f"{k}/2^{n}"
            changes.add(f"{node.op_type} {label(node)} {kh}x{kw}: NPU factor {k}/2^{n} (mean x {scale:.8g})")

    @staticmethod
    def _insert(graph: ir.Graph, index: QuantGraph, pool: ir.Node, scale: np.float32) -> None:
        """Put ``Mul(out, scale)`` between the pool and every reader of its output."""
        out = pool.outputs[0]
        uses = list(out.uses())
        base = pool.name or out.name or "avgpool"
        cname = index.unique_name(f"{base}_npu_factor")
        const = ir.Value(
            name=cname,
            shape=ir.Shape([]),
            type=ir.TensorType(ir.DataType.FLOAT),
            const_value=ir.tensor(np.asarray(scale, np.float32), name=cname),
        )
        graph.register_initializer(const)
        mul = ir.node(
            "Mul",
            [out, const],
            name=index.unique_name(f"{base}_npu_factor_Mul"),
            metadata_props={REFINE_MARK: _MARK_VALUE},
        )
        scaled = mul.outputs[0]
        scaled.name = index.unique_name(f"{out.name}_npu")
        scaled.type, scaled.shape = out.type, out.shape
        graph.insert_after(pool, mul)
        for use in uses:
            use.node.replace_input_with(use.idx, scaled)
        if out.is_graph_output():
            original = out.name
            out.name = index.unique_name(f"{original}_mean")
            graph.outputs[:] = [scaled if o is out else o for o in graph.outputs]
            scaled.name = original
