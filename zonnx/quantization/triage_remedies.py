"""Remedies triage tries on each culprit quantizer, in the quantized graph itself, without re-quantizing.

For a culprit site (``triage.Site``) each remedy is a copy of the quantized model with only that site
changed, scored with the same metric against float:

- ``float``: the site bypassed (its readers take the unrounded value; ``triage.bypass``).
- ``16-bit``: the same range on a 16-bit grid. A QuantizeLinear/DequantizeLinear pair of scale ``s`` and
  zero point ``z`` on 8 bits gets ``s / 257`` and ``257 z`` on 16 bits (``(2^16 - 1) / (2^8 - 1) = 257``:
  the grid's end points stay where they were); below opset 21 the pair moves to ORT's ``com.microsoft``
  QuantizeLinear/DequantizeLinear, which take 16-bit types. A FixNeuron gets ``bit_width`` 16 and
  ``pos + 8``.
- ``range``: the range searched again on the triage samples: the values reaching the quantizer are
  recorded, and of the ranges ``f * [min, max]`` (f from 1 down to 0.2) the one with the least mean
  squared rounding error on those values is kept (for FixNeuron, the power-of-two position with the least
  error among ``pos - 1 .. pos + 3``).

A remedy that does not apply to a site (a FixNeuron that already has 16 bits, a per-channel activation
scale) is left out of that site's results; the CLI says which were tried.
"""

from __future__ import annotations

__all__ = ["REMEDIES", "with_16_bits", "with_range", "site_values"]

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from zonnx.ir.io import default_opset
from zonnx.verify import ort_session

#: The remedies in the order they are tried and printed, the dearest to deploy first (a float tensor
#: leaves the NPU; 16 bits cost twice the bytes; a new range costs nothing).
REMEDIES = ("float", "16-bit", "range")
_WIDEN = {np.dtype(np.uint8): np.uint16, np.dtype(np.int8): np.int16}
_FACTORS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)
_MS = "com.microsoft"


@dataclasses.dataclass(frozen=True)
class _Pair:
    """The site's nodes in a copy of the model, and its scale and zero point (None for FixNeuron)."""

    nodes: list[onnx.NodeProto]
    scale: np.ndarray | None
    zero_point: np.ndarray | None


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _pair(model: onnx.ModelProto, node_names: Sequence[str]) -> _Pair | None:
    """The site's nodes; for a Q/DQ pair its per-tensor scale and zero point (None when per-channel)."""
    by_name = {n.name: n for n in model.graph.node}
    nodes = [by_name[n] for n in node_names if n in by_name]
    if len(nodes) != len(node_names):
        return None
    if nodes[0].op_type == "FixNeuron":
        return _Pair(nodes, None, None)
    inits = {t.name: t for t in model.graph.initializer}
    q = nodes[0]
    if len(q.input) < 3 or q.input[1] not in inits or q.input[2] not in inits:
        return None
    scale, zp = numpy_helper.to_array(inits[q.input[1]]), numpy_helper.to_array(inits[q.input[2]])
    if scale.size != 1 or zp.dtype not in _WIDEN:
        return None
    return _Pair(nodes, scale, zp)


def _set_grid(
    model: onnx.ModelProto, pair: _Pair, scale: np.ndarray, zero_point: np.ndarray, tag: str
) -> None:
    """Point the pair at private scale and zero-point initializers (shared ones stay for other sites)."""
    names = (f"{pair.nodes[0].name}_{tag}_scale", f"{pair.nodes[0].name}_{tag}_zero_point")
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.asarray(scale, np.float32).reshape(pair.scale.shape), names[0]),
            numpy_helper.from_array(zero_point.reshape(pair.zero_point.shape), names[1]),
        ]
    )
    for node in pair.nodes:
        node.input[1], node.input[2] = names


def with_16_bits(model: onnx.ModelProto, node_names: Sequence[str]) -> onnx.ModelProto | None:
    """The model with the site's grid widened to 16 bits over the same range (None: not applicable)."""
    out = _copy(model)
    pair = _pair(out, node_names)
    if pair is None:
        return None
    if pair.scale is None:  # FixNeuron: 8 more bits below the same top
        attrs = {a.name: helper.get_attribute_value(a) for a in pair.nodes[0].attribute}
        if int(attrs.get("bit_width", 8)) != 8:
            return None
        for a in pair.nodes[0].attribute:
            if a.name == "pos":
                a.i += 8
            elif a.name == "bit_width":  # given explicitly: set in place (a second one is invalid)
                a.i = 16
        if "bit_width" not in attrs:
            pair.nodes[0].attribute.append(helper.make_attribute("bit_width", 16))
        return out
    wide = _WIDEN[pair.zero_point.dtype]
    _set_grid(out, pair, pair.scale / 257.0, (pair.zero_point.astype(np.int64) * 257).astype(wide), "w16")
    if default_opset(out) < 21:
        for node in pair.nodes:
            node.domain = _MS
        if not any(o.domain == _MS for o in out.opset_import):
            out.opset_import.append(helper.make_opsetid(_MS, 1))
    return out


def site_values(model: onnx.ModelProto, tensor: str, feeds: Sequence[Mapping[str, np.ndarray]]) -> np.ndarray:
    """Every value ``tensor`` takes in ``model`` on ``feeds`` (flattened, float64)."""
    if tensor in {i.name for i in model.graph.input}:
        return np.concatenate([np.asarray(f[tensor], np.float64).ravel() for f in feeds])
    probe = _copy(model)
    del probe.graph.output[:]
    probe.graph.output.append(helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None))
    sess = ort_session(probe)
    return np.concatenate([np.asarray(sess.run(None, dict(f))[0], np.float64).ravel() for f in feeds])


def _qdq_error(values: np.ndarray, lo: float, hi: float, qmin: int, qmax: int) -> tuple[float, float, int]:
    """(MSE, scale, zero point) of rounding ``values`` to the grid of [lo, hi] (which holds 0)."""
    scale = max(hi - lo, 1e-12) / (qmax - qmin)
    zp = int(np.clip(round(qmin - lo / scale), qmin, qmax))
    q = np.clip(np.round(values / scale) + zp, qmin, qmax)
    return float(np.mean(((q - zp) * scale - values) ** 2)), scale, zp


def with_range(
    model: onnx.ModelProto, node_names: Sequence[str], values: np.ndarray
) -> onnx.ModelProto | None:
    """The model with the site's range searched again on ``values`` (module docstring; None: n/a)."""
    if values.size == 0 or not np.isfinite(values).all():
        return None
    out = _copy(model)
    pair = _pair(out, node_names)
    if pair is None:
        return None
    if pair.scale is None:
        return _fix_range(out, pair, values)
    info = np.iinfo(pair.zero_point.dtype)
    symmetric = pair.zero_point.dtype == np.int8 and int(pair.zero_point) == 0
    lo, hi = min(float(values.min()), 0.0), max(float(values.max()), 0.0)
    if symmetric:
        lo, hi = -max(-lo, hi), max(-lo, hi)
    best = min(
        (_qdq_error(values, lo * f, hi * f, int(info.min), int(info.max)) for f in _FACTORS),
        key=lambda t: t[0],
    )
    _, scale, zp = best
    if symmetric:
        zp = 0
    _set_grid(out, pair, np.float32(scale), np.asarray(zp, dtype=pair.zero_point.dtype), "range")
    return out


def _fix_range(model: onnx.ModelProto, pair: _Pair, values: np.ndarray) -> onnx.ModelProto:
    """FixNeuron: the position among pos-1 .. pos+3 with the least rounding error on ``values``."""
    node = pair.nodes[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    bits, signed = int(attrs.get("bit_width", 8)), int(attrs.get("signed", 1))
    qmin, qmax = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    pos = int(attrs["pos"])

    def error(p: int) -> float:
        q = np.clip(np.round(values * 2.0**p), qmin, qmax)
        return float(np.mean((q * 2.0**-p - values) ** 2))

    chosen = min(range(pos - 1, pos + 4), key=error)
    for a in node.attribute:
        if a.name == "pos":
            a.i = chosen
    return model
