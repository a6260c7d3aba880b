"""Held-out accuracy of a quantized model layer by layer: SQNR of every Conv/Gemm output against the float."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort


def _run(model: onnx.ModelProto, names: list[str], feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    proto = onnx.ModelProto.FromString(model.SerializeToString())
    have = {o.name for o in proto.graph.output}
    proto.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(names, dict(feed))


def layer_sqnrs(
    float_model: onnx.ModelProto, quant_model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]]
) -> np.ndarray:
    """SQNR (dB) of each Conv/Gemm output of the quantized model against the float tensor of that name,
    over all ``feeds``, in graph order; nodes are matched by name (the quantizer keeps node names)."""
    float_out = {n.name: n.output[0] for n in float_model.graph.node}
    nodes = [n for n in quant_model.graph.node if n.op_type in ("Conv", "Gemm") and n.name in float_out]
    qnames, fnames = [n.output[0] for n in nodes], [float_out[n.name] for n in nodes]
    signal, noise = np.zeros(len(nodes)), np.zeros(len(nodes))
    for feed in feeds:
        f, q = _run(float_model, fnames, feed), _run(quant_model, qnames, feed)
        for i, (a, b) in enumerate(zip(f, q, strict=True)):
            signal[i] += np.square(a.astype(np.float64)).sum()
            noise[i] += np.square(a.astype(np.float64) - b).sum()
    return 10 * np.log10(signal / noise)
