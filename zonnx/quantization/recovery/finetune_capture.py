"""The ORT sessions fast finetune captures layer inputs and outputs with (``graph_runs.GraphRuns`` runs).

Rule: graph optimizations off, so the captured tensors are those of the graph as written (a fused or
folded node would hide the tensor a layer reads); ``threads`` intra-op threads; ORT's refusal of a stretch
is one CalibrationError line.
"""

from __future__ import annotations

__all__ = ["segment_session"]

import onnx
import onnxruntime as ort

from zonnx.errors import first_line
from zonnx.quantization.calibration.readers import CalibrationError


def segment_session(model: onnx.ModelProto, threads: int = 1) -> ort.InferenceSession:
    """An ORT CPU session over one stretch of the model (module docstring)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT's own exception types: make it one user-facing line
        raise CalibrationError(
            f"onnxruntime could not run a stretch of the model for fast finetune: {first_line(e)}"
        ) from e
