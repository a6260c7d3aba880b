"""Lower a quantized ONNX subgraph (QDQ or FixNeuron) to an integer ``Program`` for a target.

The subgraph consumes integer codes (QuantizeLinear outputs, or FixNeuron outputs read as codes
``q = x * 2^pos``) and produces the codes a DequantizeLinear would read. Each float op between
dequantizers and its output quantizer becomes one integer op (``real = S * (q - Z)``):

- Conv / Gemm / MatMul with constant weights, fused bias, Relu/Clip and requantization::

      acc  = sum(q_x * q_w) + b'            padding with Z_x;  b' = b_acc - Z_x * sum(q_w)  (per oc)
      b_acc = round(B / (S_x S_w))          (= the int32 bias codes when S_b == S_x S_w)
      q_y  = clamp(rshift_round(acc * M, shift, requant.round_mode) + Z_y, lo, hi)
      M / 2^shift ~= S_x S_w / S_y          (per channel with per-channel weights)

  ``lo = max(qmin, Z_y)`` for a fused Relu; Clip(a, b) gives ``lo/hi = Q_y(a)/Q_y(b)`` (exact: Q is
  monotone). Power-of-two targets (``requant.mode = "shift"``) have ``M = 1``, ``shift = wpos + ipos - opos``.
- Add: ``q_y = clamp(rshift_round(M_a (q_a - Z_a) + M_b (q_b - Z_b), shift) + Z_y)`` with one common
  shift, ``M_i / 2^shift ~= S_i / S_y`` (exact shifts on power-of-two targets: DPU shift_read/write).
- AveragePool / GlobalAveragePool: ``q_y = clamp(rshift_round(M * sum(q_x - Z_x), shift) + Z_y)``,
  ``M / 2^shift ~= S_x / (S_y n)``; a target with ``[quant.avgpool]`` uses its ``k / 2^n`` for ``1/n``
  (a refinement ``Mul(pool, n k / 2^n)`` before the quantizer is then absorbed).
- MaxPool, Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Identity, Resize (nearest), Relu, Clip act
  on codes (monotone, same grid); a following quantizer with another grid adds a ``rescale``.
- Concat: every input with another grid than the output is rescaled first, then codes are joined.
- Sigmoid, Tanh, HardSigmoid, HardSwish, LeakyRelu, Gelu, Erf, Exp, Softplus, Elu: a lookup table over
  every input code, ``table[q - qmin_x] = Q_y(f(S_x (q - Z_x)))`` in float64 with the output quantizer's
  rounding.

Mul, Sub, Div, Add with a constant, MatMul of two activations (``lower_eltwise``) and Slice, Split,
Gather, Pad (``lower_codes``) are lowered through ``lower_extra``.

Add, pools and rescales round with ``quant.activation_round_mode`` (TPU-MLIR pools and eltwise round
half away); Conv/Gemm/MatMul with ``quant.requant.round_mode``. Public API: ``compile_subgraph``,
``whole_model_subgraph``, ``CompileError``.
"""

from __future__ import annotations

__all__ = ["compile_subgraph", "whole_model_subgraph", "CompileError"]

import logging
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from zonnx.backend.targets import Target, load_target
from zonnx.errors import ZonnxError

from . import lower_extra
from . import params as om
from .program import Op, Program, TensorInfo
from .tiling import attach_tiling

logger = logging.getLogger(__name__)


class CompileError(ZonnxError):
    """A subgraph cannot be lowered to the target's integer operations (the message names the node)."""


_QUANT = {"QuantizeLinear", "FixNeuron", "VitisQuantizeLinear"}
_DEQUANT = {"DequantizeLinear", "VitisDequantizeLinear"}
_CODE_OPS = {
    "MaxPool",
    "GlobalMaxPool",
    "Reshape",
    "Flatten",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Identity",
    "Resize",
}
_PENDING_OPS = {"Conv", "Gemm", "MatMul", "Add", "AveragePool", "GlobalAveragePool", "Concat", *om.LUT_FUNCS}


class _Codes:
    """A float value equal to dequantize(program tensor ``tensor``)."""

    def __init__(self, tensor: str, qp: om.QParams) -> None:
        self.tensor, self.qp = tensor, qp


class _Const:
    """A constant: integer ``codes`` with grid ``qp`` (quantized), or a float ``value`` (qp None)."""

    def __init__(self, value: np.ndarray, qp: om.QParams | None = None) -> None:
        self.value, self.qp = value, qp


class _Pending:
    """A float op result waiting for its output quantizer, with fused activations."""

    def __init__(self, node: onnx.NodeProto, ins: list[Any]) -> None:
        self.node, self.ins = node, ins
        self.acts: list[tuple[str, float, float]] = []
        self.mul = 1.0
        self.sources = [node.name]


class _Lowering:
    def __init__(self, model: onnx.ModelProto, target: Target) -> None:
        self.model, self.target = model, target
        g = model.graph
        self.consts: dict[str, np.ndarray] = {i.name: numpy_helper.to_array(i) for i in g.initializer}
        for n in g.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                self.consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        self.producer = {o: n for n in g.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.shapes = {
            v.name: [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in v.type.tensor_type.shape.dim
            ]
            for v in [*g.input, *g.output, *g.value_info]
            if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")
        }
        self.val: dict[str, Any] = {}
        self.ops: list[Op] = []
        self.tensors: dict[str, TensorInfo] = {}

    # -- grids -----------------------------------------------------------------------------------
    def _const(self, name: str, node: onnx.NodeProto) -> np.ndarray:
        if name not in self.consts:
            raise CompileError(f"node {node.name!r}: input {name!r} must be a constant (initializer).")
        return self.consts[name]

    def grid_of(self, node: onnx.NodeProto) -> om.QParams:
        """The grid a quantizer / dequantizer node defines."""
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            scale = self._const(node.input[1], node)
            zp = (
                self._const(node.input[2], node)
                if len(node.input) > 2 and node.input[2]
                else np.zeros((), np.uint8)
            )
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            return om.QParams.from_qdq(scale, zp, axis)
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        mode = attrs.get("round_mode", b"half_even")
        return om.QParams.from_pos(
            int(attrs["pos"]),
            int(attrs.get("bit_width", 8)),
            int(attrs.get("signed", 1)),
            int(attrs.get("narrow", 0)),
            mode.decode() if isinstance(mode, bytes) else str(mode),
        )

    def input_grid(self, name: str) -> om.QParams:
        prod = self.producer.get(name)
        if prod is not None and prod.op_type in _QUANT:
            return self.grid_of(prod)
        for c in self.consumers.get(name, []):
            if c.op_type in _DEQUANT:
                return self.grid_of(c)
        raise CompileError(
            f"subgraph input {name!r} is not the output of a quantizer nor read by a DequantizeLinear."
        )

    def add_tensor(self, name: str, qp: om.QParams) -> None:
        self.tensors[name] = qp.info(name, self.shapes.get(name))

    def emit(
        self,
        kind: str,
        name: str,
        ins: list[str],
        outs: list[str],
        attrs: dict,
        params: dict,
        sources: list[str],
    ) -> None:
        self.ops.append(Op(kind, name, ins, outs, attrs, params, sources))

    # -- node dispatch ---------------------------------------------------------------------------
    def run(self, nodes: list[onnx.NodeProto]) -> None:
        for node in nodes:
            op = node.op_type
            if op == "Constant":
                continue
            ins = [self.value(i, node) for i in node.input]
            if op in _DEQUANT:
                self.dequant(node, ins[0])
            elif op in _QUANT:
                self.quant(node, ins[0])
            elif op in ("Relu", "Clip") and isinstance(ins[0], _Pending):
                ins[0].acts.append(self.act_of(node, ins))
                ins[0].sources.append(node.name)
                self.val[node.output[0]] = ins[0]
            elif (
                op == "Mul"
                and isinstance(ins[0], _Pending)
                and isinstance(ins[1], _Const)
                and ins[1].qp is None
            ):
                ins[0].mul *= float(np.asarray(ins[1].value).reshape(-1)[0])  # avgpool refinement factor
                ins[0].sources.append(node.name)
                self.val[node.output[0]] = ins[0]
            elif op in ("Relu", "Clip"):
                self.code_clamp(node, self.codes(ins[0], node), ins)
            elif op in _CODE_OPS:
                self.code_op(node, self.codes(ins[0], node), ins)
            elif op in _PENDING_OPS or op in lower_extra.PENDING_OPS:
                for v in ins:
                    if isinstance(v, _Pending):
                        raise CompileError(
                            f"node {node.name!r} ({op}) reads {v.node.name!r}'s output, which is not quantized; "
                            "quantize every tensor between NPU ops (or leave the node on the CPU)."
                        )
                self.val[node.output[0]] = _Pending(node, ins)
            elif op in lower_extra.CODE_OPS:
                lower_extra.code_op(self, node, self.codes(ins[0], node), ins)
            else:
                raise CompileError(f"node {node.name!r}: op type {op} is not supported by the NPU compiler.")

    def value(self, name: str, node: onnx.NodeProto) -> Any:
        if not name:
            return None
        if name in self.val:
            return self.val[name]
        if name in self.consts:
            return _Const(self.consts[name])
        raise CompileError(
            f"node {node.name!r}: input {name!r} is produced outside the subgraph and is not a subgraph input."
        )

    def codes(self, v: Any, node: onnx.NodeProto) -> _Codes:
        if isinstance(v, _Codes):
            return v
        raise CompileError(f"node {node.name!r} ({node.op_type}): its input is not a quantized tensor.")

    def dequant(self, node: onnx.NodeProto, v: Any) -> None:
        qp = self.grid_of(node)
        if isinstance(v, _Const):
            self.val[node.output[0]] = _Const(np.asarray(v.value).astype(np.int64), qp)
        elif isinstance(v, _Codes):
            self.val[node.output[0]] = _Codes(v.tensor, qp)
        else:
            raise CompileError(f"node {node.name!r}: dequantizes a value that is not integer codes.")

    def quant(self, node: onnx.NodeProto, v: Any) -> None:
        qp, out = self.grid_of(node), node.output[0]
        if isinstance(v, _Const):
            codes = om.quantize_float(np.asarray(v.value, dtype=np.float64), qp)
            self.val[out] = _Const(codes, qp)  # a quantized constant (FixNeuron on a weight: its codes)
            return
        self.add_tensor(out, qp)
        if isinstance(v, _Codes):
            if v.qp.same(qp):
                self.emit("copy", node.name, [v.tensor], [out], {}, {}, [node.name])
            else:
                self.emit_rescale(v.tensor, v.qp, out, qp, [node.name])
        elif isinstance(v, _Pending):
            self.lower_pending(v, out, qp, node.name)
        else:
            raise CompileError(f"node {node.name!r}: quantizes a value the compiler cannot follow.")
        self.val[out] = _Codes(out, qp)

    def act_of(self, node: onnx.NodeProto, ins: list[Any]) -> tuple[str, float, float]:
        if node.op_type == "Relu":
            return ("clip", 0.0, np.inf)
        lo = float(np.asarray(ins[1].value)) if len(ins) > 1 and ins[1] is not None else -np.inf
        hi = float(np.asarray(ins[2].value)) if len(ins) > 2 and ins[2] is not None else np.inf
        for a in node.attribute:  # Clip-6 attributes
            lo = a.f if a.name == "min" else lo
            hi = a.f if a.name == "max" else hi
        return ("clip", lo, hi)

    def clamp_bounds(self, acts: list[tuple[str, float, float]], qp: om.QParams) -> tuple[int, int]:
        lo, hi = qp.qmin, qp.qmax
        for _, a, b in acts:
            if np.isfinite(a):
                lo = max(lo, int(om.quantize_float(np.array(a), qp)))
            if np.isfinite(b):
                hi = min(hi, int(om.quantize_float(np.array(b), qp)))
        return lo, hi

    def code_clamp(self, node: onnx.NodeProto, x: _Codes, ins: list[Any]) -> None:
        lo, hi = self.clamp_bounds([self.act_of(node, ins)], x.qp)
        out = node.output[0]
        self.add_tensor(out, x.qp)
        self.emit("clamp", node.name, [x.tensor], [out], {"lo": lo, "hi": hi}, {}, [node.name])
        self.val[out] = _Codes(out, x.qp)

    def code_op(self, node: onnx.NodeProto, x: _Codes, ins: list[Any]) -> None:
        kind, attrs = om.code_op_attrs(
            node, [None if v is None or isinstance(v, _Codes) else np.asarray(v.value) for v in ins]
        )
        if kind in ("maxpool",):
            attrs["pad_value"] = x.qp.qmin
        if x.qp.axis is not None and kind != "maxpool":
            raise CompileError(
                f"node {node.name!r}: per-channel activations cannot go through {node.op_type}."
            )
        out = node.output[0]
        self.add_tensor(out, x.qp)
        self.emit(kind, node.name, [x.tensor], [out], attrs, {}, [node.name])
        self.val[out] = _Codes(out, x.qp)

    def emit_rescale(self, src: str, qin: om.QParams, dst: str, qout: om.QParams, sources: list[str]) -> None:
        m, s = om.multipliers(np.asarray(qin.scale / qout.scale), self.target, sources[-1], eltwise=True)
        self.emit(
            "rescale",
            sources[-1],
            [src],
            [dst],
            {
                "zp_in": int(qin.zp),
                "zp_out": int(qout.zp),
                "lo": qout.qmin,
                "hi": qout.qmax,
                "round_mode": self.target.quant.activation_round_mode,
            },
            {"multiplier": m, "shift": s},
            sources,
        )

    # -- pending ops -----------------------------------------------------------------------------
    def lower_pending(self, p: _Pending, out: str, qp: om.QParams, qname: str) -> None:
        node, op = p.node, p.node.op_type
        sources = [*p.sources, qname]
        lo, hi = self.clamp_bounds(p.acts, qp)
        base = {"zp_out": int(qp.zp), "lo": lo, "hi": hi}
        if lower_extra.claims(p):
            return lower_extra.lower_pending(self, p, out, qp, sources, base)
        if op in ("Conv", "Gemm", "MatMul"):
            x, w = p.ins[0], p.ins[1]
            if not isinstance(x, _Codes) or not isinstance(w, _Const) or w.qp is None:
                raise CompileError(
                    f"node {node.name!r}: {op} needs quantized activations and quantized constant weights."
                )
            kind, attrs, params = om.lower_linear(
                node, x.qp, w.value, w.qp, _bias(p.ins), qp, p.mul, self.target
            )
            attrs.update(base, round_mode=self.target.quant.requant.round_mode)
            self.emit(kind, node.name, [x.tensor], [out], attrs, params, sources)
        elif op == "Add":
            a, b = (self.codes(v, node) for v in p.ins)
            ratios = np.array([float(a.qp.scale), float(b.qp.scale)]) / float(qp.scale) * p.mul
            m, s = om.multipliers(ratios, self.target, node.name, eltwise=True, common_shift=True)
            attrs = dict(
                base, zp_a=int(a.qp.zp), zp_b=int(b.qp.zp), round_mode=self.target.quant.activation_round_mode
            )
            self.emit(
                "add", node.name, [a.tensor, b.tensor], [out], attrs, {"multiplier": m, "shift": s}, sources
            )
        elif op in ("AveragePool", "GlobalAveragePool"):
            x = self.codes(p.ins[0], node)
            attrs, params = om.lower_avgpool(
                node, x.qp, qp, p.mul, self.shapes.get(node.input[0]), self.target
            )
            attrs.update(base, round_mode=self.target.quant.activation_round_mode)
            self.emit("avgpool", node.name, [x.tensor], [out], attrs, params, sources)
        elif op == "Concat":
            names = []
            for i, v in enumerate(p.ins):
                x = self.codes(v, node)
                if x.qp.same(qp):
                    names.append(x.tensor)
                else:
                    tmp = f"{out}__concat_in{i}"
                    self.add_tensor(tmp, qp)
                    self.emit_rescale(x.tensor, x.qp, tmp, qp, [node.name])
                    names.append(tmp)
            axis = next(a.i for a in node.attribute if a.name == "axis")
            self.emit("concat", node.name, names, [out], {"axis": int(axis), "lo": lo, "hi": hi}, {}, sources)
        elif op in om.LUT_FUNCS:
            x = self.codes(p.ins[0], node)
            table = om.lut_table(node, x.qp, qp, p.acts, p.mul)
            self.emit("lut", node.name, [x.tensor], [out], {"qmin_in": x.qp.qmin}, {"table": table}, sources)
        else:  # pragma: no cover - _PENDING_OPS and this dispatch agree
            raise CompileError(f"node {node.name!r}: {op} cannot be lowered.")


def _bias(ins: list[Any]) -> tuple[np.ndarray, om.QParams | None] | None:
    b = ins[2] if len(ins) > 2 else None
    if b is None:
        return None
    if not isinstance(b, _Const):
        raise CompileError("the bias of a Conv/Gemm must be a constant.")
    return np.asarray(b.value), b.qp


def whole_model_subgraph(model: onnx.ModelProto) -> tuple[list[str], list[str], list[str]]:
    """(node_names, inputs, outputs) of everything between the input quantizers and the output dequantizers.

    Inputs are the outputs of quantizers that read a graph input; outputs are the codes read by
    DequantizeLinear nodes that write a graph output (or, FixNeuron models, the graph outputs).
    """
    g = model.graph
    graph_in = {i.name for i in g.input}
    graph_out = {o.name for o in g.output}
    skip, inputs, outputs = set(), [], []
    for n in g.node:
        if n.op_type in _QUANT and n.input[0] in graph_in:
            skip.add(n.name)
            inputs.append(n.output[0])
        elif n.op_type in _DEQUANT and n.output[0] in graph_out:
            skip.add(n.name)
            outputs.append(n.input[0])
        elif n.op_type in _QUANT and n.output[0] in graph_out:
            outputs.append(n.output[0])
    names = [n.name for n in g.node if n.name not in skip]
    return names, inputs, outputs


def compile_subgraph(
    model: Any, node_names: list[str], inputs: list[str], outputs: list[str], target: str | Target
) -> Program:
    """Lower the nodes ``node_names`` (topological order) of a quantized model to a ``Program``.

    ``model`` is an ``onnx.ModelProto`` or an ``onnx_ir.Model``; ``inputs``/``outputs`` name the integer
    tensors at the boundary (see the module docstring). Raises CompileError naming the node it cannot lower.
    """
    if not isinstance(model, onnx.ModelProto):
        from zonnx.ir.io import to_proto

        model = to_proto(model)
    target = load_target(target)
    low = _Lowering(model, target)
    by_name = {n.name: n for n in model.graph.node}
    missing = [n for n in node_names if n not in by_name]
    if missing:
        raise CompileError(f"nodes {missing[:5]} are not in the model; give node names of this model.")
    in_infos = []
    for name in inputs:
        qp = low.input_grid(name)
        low.val[name] = _Codes(name, qp)
        low.add_tensor(name, qp)
        in_infos.append(low.tensors[name])
    low.run([by_name[n] for n in node_names])
    out_infos = []
    for name in outputs:
        v = low.val.get(name)
        if not isinstance(v, _Codes):
            raise CompileError(
                f"subgraph output {name!r} is not an integer tensor of the subgraph (quantize it)."
            )
        if v.tensor != name:
            low.add_tensor(name, v.qp)
            low.emit("copy", f"{name}_copy", [v.tensor], [name], {}, {}, [])
        out_infos.append(low.tensors[name])
    logger.info("compiled %d nodes into %d NPU ops for %s", len(node_names), len(low.ops), target.name)
    program = Program(in_infos, out_infos, low.ops, low.tensors, target.name, {"nodes": len(node_names)})
    return attach_tiling(program, target)  # the on-chip tiling plan travels in program.meta["tiling"]
