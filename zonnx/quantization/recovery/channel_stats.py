"""Per-channel activation abs-max of chosen tensors, measured with ORT on calibration feeds.

For every requested tensor ``t`` with channel axis ``a`` the graph gets one extra output
``ReduceMax(Abs(t), axes = every axis but a, keepdims=0)``, a vector of its channel count. Each batch
is run once and folded into the running maximum, so memory is one vector per tensor whatever the
number of samples.
"""

from __future__ import annotations

__all__ = ["channel_absmax"]

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from zonnx.errors import first_line
from zonnx.ir.io import default_opset
from zonnx.quantization.calibration.readers import CalibrationError

logger = logging.getLogger(__name__)


def _augmented(
    model: onnx.ModelProto, tensors: Mapping[str, tuple[int, int]]
) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` whose outputs are the per-channel abs-max of ``tensors`` (name -> (axis, rank))."""
    aug = onnx.ModelProto()
    aug.CopyFrom(model)
    del aug.graph.output[:]
    opset = default_opset(model)
    outputs = []
    for k, (name, (axis, rank)) in enumerate(tensors.items()):
        pos = axis % rank
        axes = [i for i in range(rank) if i != pos]
        prefix = f"zonnx_smooth_{k}_"
        aug.graph.node.append(helper.make_node("Abs", [name], [prefix + "abs"]))
        if opset >= 18:
            axes_name = prefix + "axes"
            aug.graph.initializer.append(
                onnx.numpy_helper.from_array(np.array(axes, dtype=np.int64), axes_name)
            )
            node = helper.make_node("ReduceMax", [prefix + "abs", axes_name], [prefix + "max"], keepdims=0)
        else:
            node = helper.make_node("ReduceMax", [prefix + "abs"], [prefix + "max"], axes=axes, keepdims=0)
        aug.graph.node.append(node)
        aug.graph.output.append(helper.make_tensor_value_info(prefix + "max", onnx.TensorProto.FLOAT, None))
        outputs.append(prefix + "max")
    return aug, outputs


def channel_absmax(
    model: onnx.ModelProto,
    tensors: Mapping[str, tuple[int, int]],
    feeds: Iterable[Mapping[str, np.ndarray]],
    *,
    providers: Sequence[Any] | None = None,
) -> tuple[dict[str, np.ndarray], int]:
    """Return ``({tensor: max |t| per channel}, batches run)``; ``tensors`` maps name -> (channel axis, rank).

    The tensors must be float32. A run that fails or a set of feeds that is empty raises CalibrationError.
    """
    aug, outputs = _augmented(model, tensors)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(
            aug.SerializeToString(), opts, providers=list(providers or ["CPUExecutionProvider"])
        )
    except Exception as e:  # ORT's own exception types
        first = first_line(e)
        raise CalibrationError(
            f"SmoothQuant: onnxruntime could not load the statistics model: {first}"
        ) from e
    del aug
    acc: dict[str, np.ndarray] = {}
    batches = 0
    for batches, feed in enumerate(feeds, start=1):
        try:
            res = sess.run(outputs, dict(feed))
        except Exception as e:  # ORT's own exception types
            msg = first_line(e)
            raise CalibrationError(
                f"SmoothQuant statistics, sample {batches - 1}: onnxruntime failed: {msg}"
            ) from e
        for name, value in zip(tensors, res, strict=True):
            acc[name] = value if name not in acc else np.maximum(acc[name], value)
    if not batches:
        raise CalibrationError("SmoothQuant: the calibration reader produced no samples.")
    logger.debug("SmoothQuant statistics: %d tensors over %d batches", len(acc), batches)
    return acc, batches
