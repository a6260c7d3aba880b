"""Per-layer accuracy of a quantized model: each quantized activation against its float tensor, worst first.

Matching follows the quantized graph, never the names writers give the nodes they insert. Values of the
quantized model are traced to float-model tensors in topological order:

- graph inputs: by name, else by position;
- QuantizeLinear / VitisQuantizeLinear: the output holds the *codes* of the traced input;
- DequantizeLinear / VitisDequantizeLinear / FixNeuron: the output is the dequantized value of the
  traced tensor T, i.e. a match of T; inputs that are constants are weights and are not reported; an
  untraced one whose output has the name of a float graph output matches that output;
- QOperator integer ops (QLinearConv, QGemm, QLinearAdd, ...): the unused float node of the
  corresponding op type reading the traced inputs; the output codes match its output (dequantized
  here with the op's output scale and zero point);
- ops that only move or select values (Reshape, MaxPool, Concat, Clip...) on codes give codes;
- any other op: a float tensor of the same name produced by the same op type (writers keep activation
  names), else the float node found as for integer ops; nothing when neither exists.

A traced float tensor is then followed through the float ops the quantized graph folded or dropped after
it (Relu/Clip fused into the op before them, BatchNormalization folded into a Conv, Identity): while its
only reader is such an op and the quantized value has no reader of that op type (looking through Q/DQ),
the match moves to that op's output. So a QLinearConv with a fused Relu is compared with the Relu output,
and a model quantized after BN folding can be compared with the float model before it. A tensor matched
both by a dequantizing node and by codes is reported once, from the dequantizing node.

Metrics over all samples, streamed as float64 sums (x float, q dequantized, e = x - q):
cosine ``sum(xq) / sqrt(sum(x^2) sum(q^2))`` (1 when both are zero); SQNR
``10 log10(sum(x^2) / sum(e^2))`` dB (inf when e is zero); TPU-MLIR's euclidean similarity
``1 - ||e|| / ||(x + q) / 2||``; max and mean of |e|. Non-finite elements count in ``nonfinite`` and are
compared as 0 (as TPU-MLIR's npz compare does). Both models run with ORT's graph optimizations off, as
written.
"""

from __future__ import annotations

__all__ = ["TensorStats", "LayerReport", "layer_report", "REPORT_VERSION"]

import dataclasses
import itertools
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from zonnx.errors import OptionError, VerificationError, first_line
from zonnx.ir.io import ModelLike, load_proto, to_proto
from zonnx.ir.large import deserialize
from zonnx.quantization.report_render import REPORT_VERSION, LayerReport, MetricSums, TensorStats
from zonnx.verify import exact_integer_form

logger = logging.getLogger(__name__)

_Q_OPS = frozenset({"QuantizeLinear", "VitisQuantizeLinear"})
_DEQUANT_OPS = frozenset({"DequantizeLinear", "VitisDequantizeLinear", "FixNeuron"})
_ACTS = frozenset({"Relu", "Clip"})
#: Float ops a quantized graph may have folded into the op before them (fused activation, BN folding, no-ops).
_FOLDED = _ACTS | {"BatchNormalization", "Identity", "Dropout"}
#: QOperator op -> (float op, index of the output scale input, index of the output zero point input).
_INT_OPS = {
    "QLinearConv": ("Conv", 6, 7), "QLinearMatMul": ("MatMul", 6, 7), "QGemm": ("Gemm", 7, 8),
    "QLinearAdd": ("Add", 6, 7), "QLinearMul": ("Mul", 6, 7), "QLinearConcat": ("Concat", 0, 1),
    "QLinearAveragePool": ("AveragePool", 3, 4), "QLinearGlobalAveragePool": ("GlobalAveragePool", 3, 4),
    "QLinearSigmoid": ("Sigmoid", 3, 4), "QLinearLeakyRelu": ("LeakyRelu", 3, 4),
    "QLinearSoftmax": ("Softmax", 3, 4), "QLinearReduceMean": ("ReduceMean", 3, 4),
}  # fmt: skip
#: Ops whose output holds codes at the parameters of their (first) codes input.
_CODE_OPS = frozenset({
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Gather", "Split", "Relu",
    "Clip", "MaxPool", "GlobalMaxPool", "Resize", "Pad", "Concat", "DepthToSpace", "SpaceToDepth", "Expand", "Tile",
})  # fmt: skip
_Params = tuple[np.ndarray, np.ndarray, int | None]  # scale, zero point, axis


@dataclasses.dataclass(frozen=True)
class _Match:
    """Float tensor ``tensor`` is compared with quantized value ``value`` (codes when ``params`` is set)."""

    tensor: str
    value: str
    via: str
    params: _Params | None = None


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else np.asarray(tensor.numpy())


class _Tracer:
    """Trace every value of the quantized graph to a float-model tensor (see the module docstring)."""

    def __init__(self, fmodel: ir.Model, qmodel: ir.Model) -> None:
        self.fgraph, self.qgraph = fmodel.graph, qmodel.graph
        self.producer: dict[str, ir.Node] = {}
        self.consumers: dict[str, list[ir.Node]] = {}
        for node in self.fgraph:
            for v in node.inputs:
                if v is not None:
                    self.consumers.setdefault(v.name, []).append(node)
            self.producer.update((v.name, node) for v in node.outputs)
        self.inputs = [v.name for v in self.fgraph.inputs if v.name not in self.fgraph.initializers]
        self.outputs = {v.name for v in self.fgraph.outputs}
        self.used: set[int] = set()
        self.refs: dict[ir.Value, tuple[str, _Params | None, bool]] = {}  # value -> (tensor, params, codes)
        self.matches: dict[str, _Match] = {}
        self.codes: dict[str, _Match] = {}
        self.unmatched: list[str] = []

    def run(self) -> list[_Match]:
        """Trace the whole quantized graph; one match per float tensor, dequantizing nodes before codes."""
        for i, v in enumerate(v for v in self.qgraph.inputs if v.name not in self.qgraph.initializers):
            name = v.name if v.name in self.inputs else (self.inputs[i] if i < len(self.inputs) else None)
            if name is not None:
                self.refs[v] = (name, None, False)
        for node in self.qgraph:
            self._visit(node)
        for tensor, match in self.codes.items():
            if tensor in self.matches:
                continue
            if match.params is None:
                self.unmatched.append(
                    f"value {match.value!r} ({match.via}): its scale or zero point is not "
                    "a constant, so its codes cannot be dequantized"
                )
            else:
                self.matches[tensor] = match
        return list(self.matches.values())

    def _visit(self, node: ir.Node) -> None:
        op, src = node.op_type, (node.inputs[0] if node.inputs else None)
        ref = self.refs.get(src) if src is not None else None
        if op in _Q_OPS or op in _DEQUANT_OPS:
            if ref is None and op in _DEQUANT_OPS and node.outputs[0].name in self.outputs:
                ref = (node.outputs[0].name, None, False)  # graph outputs keep their names
            if ref is None:
                if op in _DEQUANT_OPS and src is not None and _const(src) is None:
                    self.unmatched.append(
                        f"node {node.name!r} ({op}): its input {src.name!r} does not trace "
                        "back to a float-model tensor"
                    )
                return
            out = node.outputs[0]
            if op in _Q_OPS:
                self._set_codes(out, ref[0], self._params(node, 1, 2), op)
            else:
                self.refs[out] = (ref[0], None, False)
                self.matches.setdefault(ref[0], _Match(ref[0], out.name, op))
            return
        if op in _INT_OPS:
            fop, si, zi = _INT_OPS[op]
            found = self._counterpart(node, fop)
            if found is None:
                self.unmatched.append(
                    f"node {node.name!r} ({op}): no {fop} node of the float model reads "
                    "the tensors its inputs trace to"
                )
                return
            out = node.outputs[0]
            self._set_codes(
                out, self._folded_tail(found.outputs[0].name, out), self._params(node, si, zi), op
            )
            return
        if op == "Constant":
            return
        code_in = next((self.refs[v] for v in node.inputs if v in self.refs and self.refs[v][2]), None)
        if code_in is not None and op not in _CODE_OPS:
            return  # integer arithmetic on codes: its result is neither codes nor a float tensor
        found: ir.Node | None = None
        for k, out in enumerate(node.outputs):
            if self._same_tensor(node, out.name):
                name = out.name
                self.used.add(id(self.producer[name]))
            else:
                found = found or self._counterpart(node, op)
                if found is None or k >= len(found.outputs):
                    continue
                name = found.outputs[k].name
            if k == 0 and code_in is None:
                name = self._folded_tail(name, out)
            if code_in is not None:
                self._set_codes(out, name, code_in[1], op)
            else:
                self.refs[out] = (name, None, False)

    def _set_codes(self, out: ir.Value, tensor: str, params: _Params | None, via: str) -> None:
        self.refs[out] = (tensor, params, True)
        self.codes.setdefault(tensor, _Match(tensor, out.name, f"{via} codes", params))

    def _params(self, node: ir.Node, si: int, zi: int) -> _Params | None:
        """Scale, zero point and axis of the codes ``node`` writes (None when not constant)."""
        if node.op_type.startswith("Vitis"):
            return np.asarray(2.0 ** -node.attributes.get_int("pos", 0)), np.asarray(0.0), None
        inputs = list(node.inputs) + [None] * 9
        scale, zp = _const(inputs[si]), _const(inputs[zi])
        if scale is None or node.attributes.get_int("block_size", 0):
            return None
        zp = np.zeros((), np.int64) if zp is None else zp
        axis = node.attributes.get_int("axis", 1) if scale.size > 1 else None
        return scale.astype(np.float64), zp.astype(np.float64), axis

    def _counterpart(self, node: ir.Node, fop: str) -> ir.Node | None:
        """The unused float node of op ``fop`` (Relu ~ Clip) reading every tensor ``node``'s inputs trace to."""
        ins = [self.refs[v][0] for v in node.inputs if v is not None and v in self.refs]
        if not ins:
            return None
        for cand in self.consumers.get(ins[0], ()):
            same = cand.op_type == fop or (cand.op_type in _ACTS and fop in _ACTS)
            if (
                same
                and id(cand) not in self.used
                and set(ins) <= {v.name for v in cand.inputs if v is not None}
            ):
                self.used.add(id(cand))
                return cand
        return None

    def _same_tensor(self, node: ir.Node, name: str) -> bool:
        """A float tensor of that name exists and comes from the same op (or from a folded op after it)."""
        producer = self.producer.get(name)
        while producer is not None and producer.op_type != node.op_type and producer.op_type in _FOLDED:
            producer = self.producer.get(producer.inputs[0].name) if producer.inputs[0] is not None else None
        return producer is not None and producer.op_type == node.op_type

    def _folded_tail(self, tensor: str, out: ir.Value) -> str:
        """Follow the float chain of Relu/Clip/BatchNormalization/Identity after ``tensor`` while the
        quantized graph has no such op after ``out`` (it was folded into the op or dropped)."""
        kept, stack = set(), [out]
        while stack:
            for use in stack.pop().uses():
                if use.node.op_type in _Q_OPS or use.node.op_type in _DEQUANT_OPS:
                    stack.extend(use.node.outputs)
                else:
                    kept.add("Clip" if use.node.op_type in _ACTS else use.node.op_type)
        while len(cons := self.consumers.get(tensor, [])) == 1 and id(cons[0]) not in self.used:
            op, first = cons[0].op_type, cons[0].inputs[0]
            if (
                op not in _FOLDED
                or ("Clip" if op in _ACTS else op) in kept
                or first is None
                or first.name != tensor
            ):
                break
            self.used.add(id(cons[0]))
            tensor = cons[0].outputs[0].name
        return tensor


def _dequantize(codes: np.ndarray, params: _Params) -> np.ndarray:
    scale, zp, axis = params
    if axis is not None:
        shape = [1] * codes.ndim
        shape[axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return (codes.astype(np.float64) - zp) * scale


def _session(
    proto: onnx.ModelProto, extra: Iterable[str], providers: Sequence[str], what: str
) -> ort.InferenceSession:
    """A session (optimizations off: the graph runs as written) with ``extra`` values as added outputs."""
    proto = exact_integer_form(proto)  # QOperator ops: exact on every host (zonnx.hostcpu)
    keep = len(proto.graph.output)
    have = {o.name for o in proto.graph.output}
    proto.graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(extra) if n not in have)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    # no spin-waiting between ops: on a loaded host ORT's spinning threads took the CPU that the Python
    # work between runs needs; same threads and work split, so the same values
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = int(os.environ.get("ZONNX_THREADS", "0"))
    from zonnx.ir.large import ort_session

    try:
        return ort_session(proto, opts, providers, weights_as_values=True)  # weights not serialized
    except Exception as e:  # ORT's exception classes share no public base
        raise VerificationError(f"{what}: onnxruntime cannot load it ({first_line(e)}).") from None
    finally:
        del proto.graph.output[keep:]


def _run(
    sess: ort.InferenceSession, sample: Mapping[str, np.ndarray], order: list[str], what: str, index: int
) -> dict[str, np.ndarray]:
    """Run one sample (inputs by name, else by the float model's input order); outputs and inputs by name."""
    feeds = {}
    for i, inp in enumerate(sess.get_inputs()):
        key = inp.name if inp.name in sample else (order[i] if i < len(order) else None)
        if key not in sample:
            raise OptionError(
                f"sample {index}: no value for input {inp.name!r} of the {what}; "
                f"the sample has {sorted(sample)}."
            )
        feeds[inp.name] = np.asarray(sample[key])
    names = [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, feeds)
    except Exception as e:
        raise VerificationError(f"sample {index}: the {what} failed to run ({first_line(e)}).") from None
    return {**feeds, **dict(zip(names, values, strict=True))}


def _samples(feeds_list: Any, max_samples: int) -> Iterable[Mapping[str, np.ndarray]]:
    if max_samples < 1:
        raise OptionError(f"max_samples={max_samples}: compare at least 1 sample.")
    if hasattr(feeds_list, "get_next"):  # a CalibrationDataReader
        return itertools.islice(iter(feeds_list.get_next, None), max_samples)
    return itertools.islice(feeds_list, max_samples)


def _load(model: ModelLike) -> tuple[onnx.ModelProto, str | None]:
    if isinstance(model, str | os.PathLike):
        return load_proto(model), str(model)
    return to_proto(model), None


def layer_report(
    float_model: ModelLike,
    quant_model: ModelLike,
    feeds_list: Any,
    *,
    max_samples: int = 4,
    providers: Sequence[str] = ("CPUExecutionProvider",),
) -> LayerReport:
    """Compare every quantized activation of ``quant_model`` with its float tensor on a few samples.

    ``feeds_list`` is an iterable of input dicts (shapes may differ between samples) or a
    CalibrationDataReader; the first ``max_samples`` are used. Each model runs once per sample in one
    session, with the matched tensors as extra outputs. See the module docstring for the rules.
    """
    fproto, fpath = _load(float_model)
    qproto, qpath = _load(quant_model)
    fmodel, qmodel = deserialize(fproto), deserialize(qproto)  # reads files a mapped model names
    tracer = _Tracer(fmodel, qmodel)
    matches = tracer.run()
    fouts, qouts = [o.name for o in fmodel.graph.outputs], [o.name for o in qmodel.graph.outputs]
    pairs = [(f, f if f in qouts else qouts[i]) for i, f in enumerate(fouts) if f in qouts or i < len(qouts)]
    fsess = _session(
        fproto, [m.tensor for m in matches if m.tensor not in tracer.inputs], providers, "float model"
    )
    qsess = _session(qproto, [m.value for m in matches], providers, "quantized model")

    def entry(tensor: str, value: str, via: str) -> TensorStats:
        node = tracer.producer.get(tensor)
        if node is None:
            return TensorStats(tensor, value, "", "input", via)
        return TensorStats(tensor, value, node.name or "", node.op_type, via)

    items = [(m, entry(m.tensor, m.value, m.via), MetricSums()) for m in matches]
    n_layers = len(items)
    items += [(_Match(f, q, "output"), entry(f, q, "output"), MetricSums()) for f, q in pairs]
    skipped: dict[int, str] = {}  # item index -> reason

    def fold(fvals: dict[str, np.ndarray], qvals: dict[str, np.ndarray]) -> None:
        for i, (match, stats, sums) in enumerate(items):
            if i in skipped:
                continue
            x, q = fvals[match.tensor], qvals[match.value]
            q = _dequantize(q, match.params) if match.params is not None else q
            reason = (
                "is not float"
                if x.dtype.kind != "f" or q.dtype.kind != "f"
                else f"shapes differ ({list(x.shape)} vs {list(q.shape)})"
                if x.shape != q.shape
                else ""
            )
            if reason:
                skipped[i] = f"tensor {match.tensor!r} vs {match.value!r}: {reason}"
                continue
            stats.shape = list(x.shape)
            sums.update(x, q)

    samples = 0
    # a sample's metrics are folded in a worker thread while the next sample runs (ORT and numpy release
    # the GIL); one fold at a time, in sample order, so the sums are those of a serial loop
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="zonnx-report") as pool:
        pending = None
        for index, sample in enumerate(_samples(feeds_list, max_samples)):
            fvals = _run(fsess, sample, tracer.inputs, "float model", index)
            qvals = _run(qsess, sample, tracer.inputs, "quantized model", index)
            samples += 1
            if pending is not None:
                pending.result()
            pending = pool.submit(fold, fvals, qvals)
            del fvals, qvals
        if pending is not None:
            pending.result()
    if samples == 0:
        raise OptionError("feeds_list gave no samples; pass at least one input dict.")
    kept = [sums.fill(stats) for i, (_, stats, sums) in enumerate(items) if i not in skipped]
    ranked = sorted(
        kept[: n_layers - sum(i < n_layers for i in skipped)], key=lambda s: (s.sqnr_db, s.cosine, s.tensor)
    )
    final = kept[len(ranked) :]
    logger.info(
        "layer report: %d tensors on %d samples; worst %s",
        len(ranked),
        samples,
        ranked[0].tensor if ranked else "-",
    )
    return LayerReport(
        samples, ranked, final, tracer.unmatched, [skipped[i] for i in sorted(skipped)], fpath, qpath
    )
