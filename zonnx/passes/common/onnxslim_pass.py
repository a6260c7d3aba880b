"""Run onnxslim on the model; keep its result only if it is valid and keeps the opset and output names."""

from __future__ import annotations

__all__ = ["OnnxSlimPass"]

import logging
from collections import Counter

import onnx
import onnx_ir as ir

from zonnx.errors import VerificationError, first_line
from zonnx.ir.io import default_opset, to_proto
from zonnx.passes.base import Changes, ZonnxPass
from zonnx.verify import check_loadable

logger = logging.getLogger(__name__)


def _slim(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Call onnxslim, turning every way it can fail into a RuntimeError with its first line."""
    import onnxslim  # imported here: it is optional and slow to import

    try:
        slimmed = onnxslim.slim(proto)
    except Exception as e:  # onnxslim raises whatever its rewrites and onnx raise
        raise RuntimeError(first_line(e)) from None
    if not isinstance(slimmed, onnx.ModelProto):
        raise RuntimeError(f"it returned {type(slimmed).__name__} instead of a model")
    return slimmed


def _check(original: onnx.ModelProto, slimmed: onnx.ModelProto) -> None:
    """Refuse a result with another opset or other output names, or that onnx/ORT cannot load."""
    if default_opset(slimmed) != default_opset(original):
        raise RuntimeError(f"it changed the opset from {default_opset(original)} to {default_opset(slimmed)}")
    before = [o.name for o in original.graph.output]
    after = [o.name for o in slimmed.graph.output]
    if before != after:
        raise RuntimeError(f"it changed the graph outputs from {before} to {after}")
    slimmed.ir_version = original.ir_version
    try:
        check_loadable(slimmed, full_check=False)
    except VerificationError as e:
        raise RuntimeError(str(e)) from None


class OnnxSlimPass(ZonnxPass):
    """Replace the graph with onnxslim's optimized version (constant folding, fusions, dead code).

    The result is kept only when onnxslim succeeds, the default-domain opset and the graph output
    names are unchanged, and ``onnx.checker`` and an ORT session accept it; otherwise the model is left
    unchanged, a warning is logged and the reason is recorded as a miss. Counts are per op type:
    ``onnxslim removed <op>`` and ``onnxslim added <op>``. Not in the default pipelines.
    """

    name = "onnxslim"

    def apply(self, model: ir.Model) -> Changes:
        changes = Changes()
        original = to_proto(model)
        try:
            slimmed = _slim(onnx.ModelProto.FromString(original.SerializeToString()))
            _check(original, slimmed)
            new = ir.serde.deserialize_model(slimmed)
        except Exception as e:  # every failure leaves the model as it was
            reason = f"onnxslim failed: {first_line(e)}; model left unchanged"
            logger.warning("%s", reason)
            changes.miss(reason)
            return changes
        before = Counter(n.op_type for n in ir.traversal.RecursiveGraphIterator(model.graph))
        after = Counter(n.op_type for n in ir.traversal.RecursiveGraphIterator(new.graph))
        if before == after:
            return changes
        for op in sorted(before | after):
            changes.add(f"onnxslim removed {op}", max(before[op] - after[op], 0))
            changes.add(f"onnxslim added {op}", max(after[op] - before[op], 0))
        model.graph = new.graph
        model.functions.clear()
        model.functions.update(new.functions)
        return changes
