"""Remove the Relu/Clip nodes the plan marks as removable (ORT's rule for asymmetric activations).

The node's input takes the node's output name (so graph outputs keep their names) and the
quantization planned for that output; the QuantizeLinear's saturation at the calibrated range of the
activation's output then does the clipping: a Relu's range starts at 0, so every negative value
saturates to the zero point; a Clip's calibrated range lies inside [min, max]. The integer kernel
(QLinearConv, QGemm, ...) is then fused by ORT with no float node in between. A node whose output
range does not clip where it does (a symmetric range under a Relu, e.g. from a symmetric calibration
method) is kept: its input then stays float, which is exact.
"""

from __future__ import annotations

__all__ = ["remove_activations", "METADATA_KEY"]

import json
import logging

import numpy as np
import onnx_ir as ir

from zonnx.quantization.plan import QuantPlan
from zonnx.quantization.schemes import QuantParams

logger = logging.getLogger(__name__)


def _clips(node: ir.Node, params: QuantParams | None) -> bool:
    """True when the output's quantization saturates where the node clips: a Relu's lowest code is 0.0,
    a Clip's codes stay within [min, max] (one step of slack: the zero point is rounded)."""
    if params is None or params.axis is not None:
        return False
    scale = float(np.asarray(params.scale).reshape(-1)[0])
    zp = int(np.asarray(params.zero_point).reshape(-1)[0])
    low, high = (params.qmin - zp) * scale, (params.qmax - zp) * scale
    if node.op_type == "Relu":
        return low >= 0.0
    bounds = [
        v.const_value.numpy() if v is not None and v.const_value is not None else None
        for v in node.inputs[1:3]
    ]
    lo = float(bounds[0]) if len(bounds) > 0 and bounds[0] is not None else -np.inf
    hi = float(bounds[1]) if len(bounds) > 1 and bounds[1] is not None else np.inf
    return low >= lo - scale and high <= hi + scale


#: Quantized-model metadata key: JSON {tensor: [op, min, max]} of the removed activations, so tools that
#: bypass quantizers (``triage.bypass``) can put the clipping back.
METADATA_KEY = "zonnx.removed_activations"


def _bounds(node: ir.Node) -> tuple[float | None, float | None]:
    if node.op_type == "Relu":
        return 0.0, None
    vals = [
        v.const_value.numpy() if v is not None and v.const_value is not None else None
        for v in node.inputs[1:3]
    ]
    vals += [None] * (2 - len(vals))
    return tuple(float(v) if v is not None else None for v in vals)  # type: ignore[return-value]


def remove_activations(model: ir.Model, plan: QuantPlan) -> int:
    """Drop each node of ``plan.removed`` whose output quantization does its clipping, wiring its input to
    its readers under its output's name; a node whose calibrated range does not clip (a symmetric range
    under a Relu) stays, with its input float. Returns the count removed."""
    graph = model.graph
    nodes = {n.name: n for n in graph}
    count = 0
    removed: dict[str, list] = {}
    for name, (src_name, out_name) in plan.removed.items():
        node = nodes.get(name)
        if node is None or not node.inputs or node.inputs[0] is None or node.inputs[0].name != src_name:
            continue
        out_plan = plan.tensors.get(out_name)
        if not _clips(node, out_plan.params if out_plan is not None else None):
            logger.info(
                "%s %r kept: the quantization of %r does not clip as it does", node.op_type, name, out_name
            )
            continue
        src, out = node.inputs[0], node.outputs[0]
        out.replace_all_uses_with(src, replace_graph_outputs=True)
        graph.remove(node, safe=True)
        out.name = None
        src.name = out_name
        removed[out_name] = [node.op_type, *_bounds(node)]
        count += 1
    if removed:
        model.metadata_props[METADATA_KEY] = json.dumps(removed)
    if count:
        logger.info("removed %d Relu/Clip node(s): their quantization does the clipping", count)
    return count
