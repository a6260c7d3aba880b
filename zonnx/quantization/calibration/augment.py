"""The calibration model: requested tensors reduced to a few small outputs inside the graph itself.

For every *measured* tensor ``t`` the graph gets ``flat = Reshape(Cast(t, float), [-1])`` (the Cast is
removed by ORT when ``t`` is float32 already, the Reshape copies nothing), ``Shape(flat)`` (its size),
``ReduceMin``/``ReduceMax`` and, with moments, ``ReduceSum``/``ReduceSumSquare``. The per-tensor
results are concatenated into one output each (``sizes``, ``mins``, ``maxs``, ``sums``, ``sumsqs``),
so a run returns a handful of arrays whatever the number of tensors. With a histogram, each tensor
gets an output ``Slice(flat, 0, end, 0, step)`` (not concatenated: a Concat would copy them once more);
the steps are one graph input split per tensor, chosen by the collector (1 = every value).

Derived tensors cost nothing in the graph. If a requested tensor is ``Relu(s)`` or a value-preserving
op of ``s`` (Identity, Flatten, Reshape, Squeeze, Unsqueeze, Transpose) and ``s`` is requested too,
its statistics follow from ``s``'s: the same values, or ``max(v, 0)`` of them (extrema exactly; the
histogram is an exact fold because 0 is always a bin edge). Moments of a Relu output do not follow,
so with moments a Relu output is measured.

A tensor that only Softmax nodes read is measured on ``max(t, rowmax(t) - 20)``, the values that can
change the Softmax (``softmax_floor``: the attention-mask trap).

Per-sample layout (``per_sample=True``, for a batch of N samples in one run, ``batching``): ``flat =
Reshape(t, [0, -1])`` is [N, size], the reductions run over axis 1 and are concatenated along axis 1
(``mins`` is [N, tensors]), ``sizes`` holds each tensor's [N, size] pair and the histogram Slice steps
along axis 1; so each sample's statistics stay its own, as in N separate runs.
"""

from __future__ import annotations

__all__ = ["VALUE_PRESERVING", "Derived", "Augmented", "build"]

import dataclasses
import logging
from collections.abc import Iterable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from zonnx.errors import did_you_mean
from zonnx.ir.io import default_opset
from zonnx.quantization.calibration.readers import CalibrationError
from zonnx.quantization.calibration.softmax_floor import floor_nodes, softmax_axes

logger = logging.getLogger(__name__)

#: Ops whose output holds exactly the values of their first input (in some order or shape).
VALUE_PRESERVING = frozenset({"Identity", "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose"})
_INT64_MAX = np.iinfo(np.int64).max


@dataclasses.dataclass(frozen=True)
class Derived:
    """A requested tensor computed from a measured one: ``kind`` is "same" or "relu"."""

    source: str
    kind: str


@dataclasses.dataclass
class Augmented:
    """The calibration model and how to read its outputs.

    ``measured``: tensors reduced in the graph, in output order; ``derived``: the others;
    ``outputs``: the output names ("sizes", "mins", "maxs", optional "sums", "sumsqs");
    ``samples``: per measured tensor, the output holding its histogram values (empty without histogram);
    ``steps_input``: name of the int64 [len(measured)] sampling-steps input, or None without histogram;
    ``weights``: the original model's large initializers, which ``model`` only declares as external
    placeholders (pass them to ORT with ``SessionOptions.add_external_initializers``: the weights are
    then never serialized or copied into a second protobuf).
    """

    model: onnx.ModelProto
    measured: list[str]
    derived: dict[str, Derived]
    outputs: dict[str, str]
    samples: list[str]
    steps_input: str | None
    weights: list[onnx.TensorProto]


def _unique_prefix(model: onnx.ModelProto) -> str:
    g = model.graph
    names = (
        {o for n in g.node for o in n.output} | {i.name for i in g.input} | {i.name for i in g.initializer}
    )
    prefix, k = "zonnx_calib_", 0
    while any(n.startswith(prefix) for n in names):
        k += 1
        prefix = f"zonnx_calib{k}_"
    return prefix


#: Initializer types handed to ORT as numpy-backed external initializers (others stay in the proto).
_EXTERNAL_TYPES = {
    TensorProto.FLOAT: 4,
    TensorProto.DOUBLE: 8,
    TensorProto.FLOAT16: 2,
    TensorProto.INT8: 1,
    TensorProto.UINT8: 1,
    TensorProto.INT16: 2,
    TensorProto.UINT16: 2,
    TensorProto.INT32: 4,
    TensorProto.UINT32: 4,
    TensorProto.INT64: 8,
    TensorProto.UINT64: 8,
    TensorProto.BOOL: 1,
}


def _skeleton(
    model: onnx.ModelProto, min_bytes: int = 1024
) -> tuple[onnx.ModelProto, list[onnx.TensorProto]]:
    """A copy of ``model`` without graph outputs whose large initializers are external placeholders."""
    aug = onnx.ModelProto(
        ir_version=model.ir_version,
        producer_name=model.producer_name,
        producer_version=model.producer_version,
        domain=model.domain,
        model_version=model.model_version,
    )
    aug.opset_import.extend(model.opset_import)
    aug.functions.extend(model.functions)
    src, g = model.graph, aug.graph
    g.name = src.name
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.sparse_initializer.extend(src.sparse_initializer)
    weights = []
    for init in src.initializer:
        size = int(np.prod(init.dims, dtype=np.int64)) * _EXTERNAL_TYPES.get(init.data_type, 0)
        if init.data_location != TensorProto.EXTERNAL and size >= min_bytes:
            ph = TensorProto(name=init.name, data_type=init.data_type, dims=init.dims)
            ph.data_location = TensorProto.EXTERNAL
            ph.external_data.add(key="location", value="zonnx-calibration-weights")
            g.initializer.append(ph)
            weights.append(init)
        else:
            g.initializer.append(init)
    return aug, weights


def _derivations(model: onnx.ModelProto, names: Sequence[str], moments: bool) -> dict[str, Derived]:
    """Requested tensors whose stats follow from another requested tensor (resolved to a measured root)."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    wanted = set(names)
    direct: dict[str, Derived] = {}
    for t in names:
        node = producer.get(t)
        if (
            node is None
            or not node.input
            or node.input[0] not in wanted
            or node.domain not in ("", "ai.onnx")
        ):
            continue
        if node.op_type in VALUE_PRESERVING:
            direct[t] = Derived(node.input[0], "same")
        elif node.op_type == "Relu" and not moments:
            direct[t] = Derived(node.input[0], "relu")
    resolved: dict[str, Derived] = {}
    for t in direct:
        kind, src, seen = "same", t, set()
        while src in direct and src not in seen:
            seen.add(src)
            d = direct[src]
            kind = "relu" if "relu" in (kind, d.kind) else "same"
            src = d.source
        if src not in direct:  # a cycle cannot happen in a valid graph; stay safe anyway
            resolved[t] = Derived(src, kind)
    return resolved


def _reducer(per_sample: bool, opset: int, g: onnx.GraphProto, p: str):  # noqa: ANN202
    """A maker of ``op(flat) -> out`` nodes: over every value, or over axis 1 (per sample), keepdims."""
    if not per_sample:
        return lambda op, flat, out: helper.make_node(op, [flat], [out], keepdims=1)
    g.initializer.append(numpy_helper.from_array(np.array([1], dtype=np.int64), p + "axis1"))

    def make(op: str, flat: str, out: str) -> onnx.NodeProto:
        if opset >= 18 or (op == "ReduceSum" and opset >= 13):  # axes became an input
            return helper.make_node(op, [flat, p + "axis1"], [out], keepdims=1)
        return helper.make_node(op, [flat], [out], axes=[1], keepdims=1)

    return make


def build(
    model: onnx.ModelProto,
    tensor_names: Sequence[str],
    need: Iterable[str] = ("extrema",),
    sample: bool = True,
    per_sample: bool = False,
) -> Augmented:
    """Return the calibration model for ``tensor_names`` with the statistics in ``need``.

    ``need`` is a subset of {"extrema", "moments", "histogram"}; ``sample`` False (or an opset
    below 10) outputs every value for the histogram and ignores the steps. ``per_sample`` gives the
    per-sample layout of the module docstring (the leading dim of every measured tensor is the batch).
    """
    need = set(need)
    g0 = model.graph
    have = (
        {o for n in g0.node for o in n.output if o}
        | {i.name for i in g0.input}
        | {i.name for i in g0.initializer}
    )
    for t in tensor_names:
        if t not in have:
            raise CalibrationError(
                f"tensor {t!r} to calibrate is not in the model's main graph.{did_you_mean(t, have)}"
            )
    names = list(dict.fromkeys(tensor_names))
    if not names:
        raise CalibrationError("no tensor to calibrate: tensor_names is empty.")
    derived = _derivations(model, names, "moments" in need)
    measured = [t for t in names if t not in derived]
    opset = default_opset(model)
    sample = sample and opset >= 10

    aug, weights = _skeleton(model)
    g = aug.graph
    p = _unique_prefix(model)
    flat_shape = [0, -1] if per_sample else [-1]
    g.initializer.append(numpy_helper.from_array(np.array(flat_shape, dtype=np.int64), p + "flat"))
    axis = 1 if per_sample else 0  # the axis reduced, sliced and concatenated along
    reduce = _reducer(per_sample, opset, g, p)
    slice_axis = "one" if per_sample else "zero"
    hist = "histogram" in need
    steps_input = None
    if hist and sample:
        g.initializer.extend(
            numpy_helper.from_array(np.array(v, dtype=np.int64), p + name)
            for name, v in [("zero", [0]), ("end", [_INT64_MAX]), *([("one", [1])] if per_sample else [])]
        )
        steps_input = p + "steps"
        g.input.append(helper.make_tensor_value_info(steps_input, TensorProto.INT64, [len(measured)]))
        step_names = [f"{p}{k}_step" for k in range(len(measured))]
        if opset >= 13:
            g.initializer.append(numpy_helper.from_array(np.ones(len(measured), dtype=np.int64), p + "ones"))
            g.node.append(helper.make_node("Split", [steps_input, p + "ones"], step_names, axis=0))
        else:
            g.node.append(
                helper.make_node("Split", [steps_input], step_names, axis=0, split=[1] * len(measured))
            )
    cols: dict[str, list[str]] = {k: [] for k in ("sizes", "mins", "maxs", "sums", "sumsqs")}
    samples: list[str] = []
    nodes = []
    floors = softmax_axes(g0, measured, opset)
    for k, t in enumerate(measured):
        q = f"{p}{k}_"
        flat = q + "flat"
        values = q + "f"
        nodes.append(helper.make_node("Cast", [t], [values], to=TensorProto.FLOAT))
        if t in floors:  # only the values that can change the Softmax (softmax_floor)
            more, inits = floor_nodes(values, floors[t], q + "floored", q, opset)
            nodes += more
            g.initializer.extend(inits)
            values = q + "floored"
        nodes += [
            helper.make_node("Reshape", [values, p + "flat"], [flat]),
            helper.make_node("Shape", [flat], [q + "n"]),
            reduce("ReduceMin", flat, q + "lo"),
            reduce("ReduceMax", flat, q + "hi"),
        ]
        cols["sizes"].append(q + "n")
        cols["mins"].append(q + "lo")
        cols["maxs"].append(q + "hi")
        if "moments" in need:
            nodes += [
                reduce("ReduceSum", flat, q + "sum"),
                reduce("ReduceSumSquare", flat, q + "sumsq"),
            ]
            cols["sums"].append(q + "sum")
            cols["sumsqs"].append(q + "sumsq")
        if hist and sample:
            nodes.append(
                helper.make_node(
                    "Slice", [flat, p + "zero", p + "end", p + slice_axis, f"{q}step"], [q + "s"]
                )
            )
            samples.append(q + "s")
        elif hist:
            samples.append(flat)
    outputs: dict[str, str] = {}
    for key, parts in cols.items():
        if not parts:
            continue
        out = p + key
        nodes.append(helper.make_node("Concat", parts, [out], axis=0 if key == "sizes" else axis))
        elem = TensorProto.INT64 if key == "sizes" else TensorProto.FLOAT
        g.output.append(helper.make_tensor_value_info(out, elem, None))
        outputs[key] = out
    g.output.extend(helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in samples)
    g.node.extend(nodes)
    logger.debug("calibration graph: %d measured, %d derived tensors", len(measured), len(derived))
    return Augmented(aug, measured, derived, outputs, samples, steps_input, weights)
