"""Lower a quantized ONNX subgraph (QDQ or FixNeuron) to an integer ``Program`` for a target.

The subgraph consumes integer codes (QuantizeLinear outputs, or FixNeuron outputs read as codes
``q = x * 2^pos``) and produces the codes a DequantizeLinear would read. Each float op between
dequantizers and its output quantizer becomes one integer op (``real = S * (q - Z)``); the formula and
compile rule of every op kind live in its module under ``zonnx.backend.ops`` (``ops.registry``):

- ops that act on codes (monotone, same grid: MaxPool, Relu/Clip, Reshape, Slice, Pad, Resize nearest,
  ...) are lowered at once by their *code* rule; a following quantizer with another grid adds a
  ``rescale`` (``ops.rescale``), one with the same grid a ``copy``; a Relu/Clip that only quantizers
  read is folded into each quantizer's output clamp instead (``values.Clamped``: exact, where a clamp on
  the input grid rounds the bounds);
- requantizing ops (Conv, Gemm, MatMul, Add, Mul, pools, Concat, lookup tables, ...) wait as *pending*
  values for their output quantizer, collecting fused Relu/Clip clamps (``lo = max(qmin, Z_y)`` for a
  Relu; Clip(a, b) gives ``lo/hi = Q_y(a)/Q_y(b)``) and a constant factor (a refinement
  ``Mul(pool, n k / 2^n)``), then their *pending* rule emits the op.

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

from zonnx.backend.ops import registry
from zonnx.backend.ops.clamp import CLAMP_OPS, activation
from zonnx.backend.ops.rescale import emit_rescale
from zonnx.backend.targets import Target, load_target

from . import params as om
from .program import Op, Program, TensorInfo
from .tiling import attach_tiling
from .values import Clamped, Codes, CompileError, Const, Pending

logger = logging.getLogger(__name__)

_QUANT = {"QuantizeLinear", "FixNeuron", "VitisQuantizeLinear"}
_DEQUANT = {"DequantizeLinear", "VitisDequantizeLinear"}


class _Lowering:
    """The lowering state op modules' compile rules use: ``target``, ``shapes``, ``val`` (ONNX value ->
    Codes / Const / Pending), ``codes``, ``add_tensor``, ``emit`` and ``emit_rescale``."""

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
        inside = {n.name for n in nodes}
        for node in nodes:
            op = node.op_type
            if op == "Constant":
                continue
            ins = [self.value(i, node) for i in node.input]
            if op in CLAMP_OPS and isinstance(ins[0], Codes) and self.only_quantized(node, ins[0], inside):
                self.val[node.output[0]] = Clamped(ins[0], activation(node, ins), node.name)
            elif op in _DEQUANT:
                self.dequant(node, ins[0])
            elif op in _QUANT:
                self.quant(node, ins[0])
            elif op in CLAMP_OPS and isinstance(ins[0], Pending):
                ins[0].acts.append(activation(node, ins))
                ins[0].sources.append(node.name)
                self.val[node.output[0]] = ins[0]
            elif (
                op == "Mul"
                and isinstance(ins[0], Pending)
                and isinstance(ins[1], Const)
                and ins[1].qp is None
            ):
                ins[0].mul *= float(np.asarray(ins[1].value).reshape(-1)[0])  # avgpool refinement factor
                ins[0].sources.append(node.name)
                self.val[node.output[0]] = ins[0]
            elif op in registry.CODE_RULES:
                registry.CODE_RULES[op](self, node, self.codes(ins[0], node), ins)
            elif op in registry.PENDING_OPS:
                for v in ins:
                    if isinstance(v, Pending):
                        raise CompileError(
                            f"node {node.name!r} ({op}) reads {v.node.name!r}'s output, which is not quantized; "
                            "quantize every tensor between NPU ops (or leave the node on the CPU)."
                        )
                self.val[node.output[0]] = Pending(node, ins)
            else:
                raise CompileError(f"node {node.name!r}: op type {op} is not supported by the NPU compiler.")

    def only_quantized(self, node: onnx.NodeProto, x: Codes, inside: set[str]) -> bool:
        """Whether a Relu/Clip on per-tensor codes ``x`` is read only by per-tensor quantizers of the
        subgraph, which then fold it (``values.Clamped``)."""
        readers = self.consumers.get(node.output[0], [])
        return (
            x.qp.axis is None
            and bool(readers)
            and all(
                r.op_type in _QUANT and r.name in inside and self.grid_of(r).axis is None for r in readers
            )
        )

    def value(self, name: str, node: onnx.NodeProto) -> Any:
        if not name:
            return None
        if name in self.val:
            return self.val[name]
        if name in self.consts:
            return Const(self.consts[name])
        raise CompileError(
            f"node {node.name!r}: input {name!r} is produced outside the subgraph and is not a subgraph input."
        )

    def codes(self, v: Any, node: onnx.NodeProto) -> Codes:
        """``v`` when it is integer codes, else a CompileError naming ``node``."""
        if isinstance(v, Codes):
            return v
        raise CompileError(f"node {node.name!r} ({node.op_type}): its input is not a quantized tensor.")

    def dequant(self, node: onnx.NodeProto, v: Any) -> None:
        qp = self.grid_of(node)
        if isinstance(v, Const):
            self.val[node.output[0]] = Const(np.asarray(v.value).astype(np.int64), qp)
        elif isinstance(v, Codes):
            self.val[node.output[0]] = Codes(v.tensor, qp)
        else:
            raise CompileError(f"node {node.name!r}: dequantizes a value that is not integer codes.")

    def quant(self, node: onnx.NodeProto, v: Any) -> None:
        qp, out = self.grid_of(node), node.output[0]
        if isinstance(v, Const):
            codes = om.quantize_float(np.asarray(v.value, dtype=np.float64), qp)
            self.val[out] = Const(codes, qp)  # a quantized constant (FixNeuron on a weight: its codes)
            return
        self.add_tensor(out, qp)
        if isinstance(v, Codes):
            if v.qp.same(qp):
                self.emit("copy", node.name, [v.tensor], [out], {}, {}, [node.name])
            else:
                self.emit_rescale(v.tensor, v.qp, out, qp, [node.name])
        elif isinstance(v, Pending):
            self.lower_pending(v, out, qp, node.name)
        elif isinstance(v, Clamped):  # the clamp on the output grid (exact: values.Clamped)
            lo, hi = om.clamp_bounds([v.act], qp)
            if v.x.qp.same(qp):
                self.emit(
                    "clamp", node.name, [v.x.tensor], [out], {"lo": lo, "hi": hi}, {}, [*v.sources, node.name]
                )
            else:
                self.emit_rescale(v.x.tensor, v.x.qp, out, qp, [*v.sources, node.name], (lo, hi))
        else:
            raise CompileError(f"node {node.name!r}: quantizes a value the compiler cannot follow.")
        self.val[out] = Codes(out, qp)

    def emit_rescale(
        self,
        src: str,
        qin: om.QParams,
        dst: str,
        qout: om.QParams,
        sources: list[str],
        bounds: tuple[int, int] | None = None,
    ) -> None:
        """Emit a ``rescale`` of ``src`` to grid ``qout`` (``ops.rescale``)."""
        emit_rescale(self, src, qin, dst, qout, sources, bounds)

    def lower_pending(self, p: Pending, out: str, qp: om.QParams, qname: str) -> None:
        """Emit pending node ``p`` by its op module's rule, now that its output quantizer is known."""
        node, op = p.node, p.node.op_type
        sources = [*p.sources, qname]
        lo, hi = om.clamp_bounds(p.acts, qp)
        base = {"zp_out": int(qp.zp), "lo": lo, "hi": hi}
        rule = registry.pending_rule(p)
        if rule is None:  # pragma: no cover - PENDING_OPS and the rules agree
            raise CompileError(f"node {node.name!r}: {op} cannot be lowered.")
        rule.lower(self, p, out, qp, sources, base)


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
        low.val[name] = Codes(name, qp)
        low.add_tensor(name, qp)
        in_infos.append(low.tensors[name])
    low.run([by_name[n] for n in node_names])
    out_infos = []
    for name in outputs:
        v = low.val.get(name)
        if not isinstance(v, Codes):
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
