"""Remove the Relu/Clip nodes the plan marks as removable (ORT's rule for asymmetric activations).

The node's input takes the node's output name (so graph outputs keep their names) and the
quantization planned for that output; the QuantizeLinear's saturation at the calibrated range of the
activation's output then does the clipping: a Relu's range starts at 0, so every negative value
saturates to the zero point; a Clip's calibrated range lies inside [min, max]. The integer kernel
(QLinearConv, QGemm, ...) is then fused by ORT with no float node in between.
"""

from __future__ import annotations

__all__ = ["remove_activations"]

import logging
from collections.abc import Mapping

import onnx_ir as ir

logger = logging.getLogger(__name__)


def remove_activations(model: ir.Model, removed: Mapping[str, tuple[str, str]]) -> int:
    """Drop each named node, wiring its input to its readers under its output's name; returns the count."""
    graph = model.graph
    nodes = {n.name: n for n in graph}
    count = 0
    for name, (src_name, out_name) in removed.items():
        node = nodes.get(name)
        if node is None or not node.inputs or node.inputs[0] is None or node.inputs[0].name != src_name:
            continue
        src, out = node.inputs[0], node.outputs[0]
        out.replace_all_uses_with(src, replace_graph_outputs=True)
        graph.remove(node, safe=True)
        out.name = None
        src.name = out_name
        count += 1
    if count:
        logger.info("removed %d Relu/Clip node(s): their quantization does the clipping", count)
    return count
