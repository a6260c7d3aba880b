"""Evaluate one node on constant inputs (reference evaluator or ONNX Runtime); log folding warnings once."""

from __future__ import annotations

__all__ = ["evaluate", "warn_once"]

import logging

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator

from zonnx.ir.io import MAX_IR_VERSION

# Logged under the pass's module name, as before these helpers moved out of it.
logger = logging.getLogger("zonnx.passes.common.constant_folding")

#: Ops the reference evaluator runs with Python loops (slow) or lacks: evaluate them with ORT first.
_ORT_FIRST = frozenset(
    {
        "Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool",
        "MaxRoiPool", "RoiAlign", "Resize", "Upsample", "LSTM", "GRU", "RNN", "GridSample",
        "DeformConv", "Col2Im", "NonMaxSuppression", "QLinearMatMul", "MatMulInteger",
    }
)  # fmt: skip


def _node_proto(node: ir.Node) -> tuple[onnx.NodeProto, list[str]]:
    """The node as a NodeProto with inputs renamed i0.. and outputs o0.. ('' kept for absent ones)."""
    proto = ir.serde.serialize_node(node)
    del proto.input[:], proto.output[:]
    proto.input.extend("" if v is None else f"i{i}" for i, v in enumerate(node.inputs))
    proto.output.extend(f"o{i}" if v.name else "" for i, v in enumerate(node.outputs))
    return proto, [n for n in proto.input if n]


def _run_reference(node: ir.Node, feeds: dict[str, np.ndarray], opsets: dict[str, int]) -> list[np.ndarray]:
    proto, _ = _node_proto(node)
    return list(ReferenceEvaluator(proto, opsets=opsets).run(None, feeds))


def _run_ort(node: ir.Node, feeds: dict[str, np.ndarray], opsets: dict[str, int]) -> list[np.ndarray]:
    from zonnx.verify import run_ort

    helper = onnx.helper
    proto, names = _node_proto(node)
    inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(feeds[n].dtype), None) for n in names
    ]
    outputs = [helper.make_empty_tensor_value_info(o) for o in proto.output if o]
    imports = [helper.make_opsetid(d, v) for d, v in opsets.items()]
    model = helper.make_model(helper.make_graph([proto], "fold", inputs, outputs), opset_imports=imports)
    model.ir_version = MAX_IR_VERSION
    out = run_ort(model, feeds)
    return [out[o] for o in proto.output if o]


def evaluate(node: ir.Node, arrays: list[np.ndarray | None], opsets: dict[str, int]) -> list[np.ndarray]:
    """Run one node on constant inputs: the reference evaluator, or ORT for ops it runs slowly or lacks."""
    feeds = {f"i{i}": a for i, a in enumerate(arrays) if a is not None}
    runners = [_run_ort, _run_reference] if node.op_type in _ORT_FIRST else [_run_reference, _run_ort]
    try:
        return runners[0](node, feeds, opsets)
    except Exception as first:  # either evaluator raises many types for ops it cannot run
        try:
            out = runners[1](node, feeds, opsets)
        except Exception:
            raise first from None
        names = [r.__name__.removeprefix("_run_") for r in runners]
        reason = (str(first).strip().splitlines() or [type(first).__name__])[0]
        warn_once(f"constant folding: {node.op_type} evaluated by {names[1]} ({names[0]} failed: {reason})")
        return out


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """Log ``message`` as a warning the first time this process sees it."""
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning("%s", message)
