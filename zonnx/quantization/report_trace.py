"""Trace a quantized graph's values to the float model's tensors, for the per-layer report (``report.py``).

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
  names), or by an op the preparation passes fold into it with the name kept (``_RENAMED``: a constant
  Mul/Add folded into the Conv before it, the Div/Mul ending a decomposed hard-swish), else the float
  node found as for integer ops that also holds the same values where both read a constant (so a factor
  Mul a target inserts after a pool is not taken for a smoothing Mul of the same pool); nothing when
  neither exists.

A traced float tensor is then followed through the float ops the quantized graph folded or dropped after
it (Relu/Clip fused into the op before them, BatchNormalization folded into a Conv, Identity): while its
only reader is such an op and the quantized value has no reader of that op type (looking through Q/DQ),
the match moves to that op's output. So a QLinearConv with a fused Relu is compared with the Relu output,
and a model quantized after BN folding can be compared with the float model before it. A tensor matched
both by a dequantizing node and by codes is reported once, from the dequantizing node.
"""

from __future__ import annotations

__all__ = ["CodeParams", "Match", "Tracer", "dequantize_codes"]

import dataclasses

import numpy as np
import onnx_ir as ir

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
#: Op type in the quantized graph -> float op types whose output it may hold under the same name: the
#: target preparation folds a constant Mul/Add after a Conv into it (``fold-conv-affine``) and writes a
#: decomposed hard-swish or hard-sigmoid as one op ending where the Div/Mul ended (``fuse-hardswish``).
_RENAMED = {
    "Conv": frozenset({"Mul", "Add"}), "HardSwish": frozenset({"Div", "Mul"}), "HardSigmoid": frozenset({"Div", "Mul"}),
}  # fmt: skip
CodeParams = tuple[np.ndarray, np.ndarray, int | None]  # scale, zero point, axis


@dataclasses.dataclass(frozen=True)
class Match:
    """Float tensor ``tensor`` is compared with quantized value ``value`` (codes when ``params`` is set)."""

    tensor: str
    value: str
    via: str
    params: CodeParams | None = None


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else np.asarray(tensor.numpy())


class Tracer:
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
        self.refs: dict[
            ir.Value, tuple[str, CodeParams | None, bool]
        ] = {}  # value -> (tensor, params, codes)
        self.matches: dict[str, Match] = {}
        self.codes: dict[str, Match] = {}
        self.unmatched: list[str] = []

    def run(self) -> list[Match]:
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
                self.matches.setdefault(ref[0], Match(ref[0], out.name, op))
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
                found = found or self._counterpart(node, op, same_constants=True)
                if found is None or k >= len(found.outputs):
                    continue
                name = found.outputs[k].name
            if k == 0 and code_in is None:
                name = self._folded_tail(name, out)
            if code_in is not None:
                self._set_codes(out, name, code_in[1], op)
            else:
                self.refs[out] = (name, None, False)

    def _set_codes(self, out: ir.Value, tensor: str, params: CodeParams | None, via: str) -> None:
        self.refs[out] = (tensor, params, True)
        self.codes.setdefault(tensor, Match(tensor, out.name, f"{via} codes", params))

    def _params(self, node: ir.Node, si: int, zi: int) -> CodeParams | None:
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

    def _counterpart(self, node: ir.Node, fop: str, same_constants: bool = False) -> ir.Node | None:
        """The unused float node of op ``fop`` (Relu ~ Clip) reading every tensor ``node``'s inputs trace to;
        with ``same_constants``, also holding the same values where both read a constant at one position
        (a factor Mul a target inserted after a pool is not the float model's own Mul of that pool)."""
        ins = [self.refs[v][0] for v in node.inputs if v is not None and v in self.refs]
        if not ins:
            return None
        for cand in self.consumers.get(ins[0], ()):
            same = cand.op_type == fop or (cand.op_type in _ACTS and fop in _ACTS)
            if (
                same
                and id(cand) not in self.used
                and set(ins) <= {v.name for v in cand.inputs if v is not None}
                and (not same_constants or _constants_agree(node, cand))
            ):
                self.used.add(id(cand))
                return cand
        return None

    def _same_tensor(self, node: ir.Node, name: str) -> bool:
        """A float tensor of that name exists and comes from the same op (or from a folded op after it, or
        from an op ``_RENAMED`` says the preparation folded into this one)."""
        producer = self.producer.get(name)
        while producer is not None and producer.op_type != node.op_type and producer.op_type in _FOLDED:
            producer = self.producer.get(producer.inputs[0].name) if producer.inputs[0] is not None else None
        if producer is None:
            return False
        return producer.op_type == node.op_type or producer.op_type in _RENAMED.get(node.op_type, ())

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


def _constants_agree(node: ir.Node, cand: ir.Node) -> bool:
    """Where both nodes read a constant at the same input position, the two hold the same values."""
    for mine, theirs in zip(node.inputs, cand.inputs, strict=False):  # optional inputs may be absent
        a, b = _const(mine), _const(theirs)
        if (
            a is not None
            and b is not None
            and (a.shape != b.shape or not np.allclose(a, b, rtol=1e-6, atol=0))
        ):
            return False
    return True


def dequantize_codes(codes: np.ndarray, params: CodeParams) -> np.ndarray:
    """Float64 values of ``codes`` on the grid ``params`` (per-axis scale and zero point broadcast)."""
    scale, zp, axis = params
    if axis is not None:
        shape = [1] * codes.ndim
        shape[axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return (codes.astype(np.float64) - zp) * scale
