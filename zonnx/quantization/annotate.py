"""Annotate: op rules mark which tensors of each node to quantize and which must share a scale.

Rules (per op type; a node is quantized only if its type is selected and it is not excluded):

- Conv, ConvTranspose: X activation, W weight (per channel on axis 0, or 1 for ConvTranspose),
  B int32 bias at s_X * s_W, Y activation.
- Gemm: A activation, constant B weight (axis 0 if transB else 1), constant C bias; MatMul: A
  activation, constant B weight (per channel on the last axis), variable B activation (unless
  MatMulConstBOnly).
- Add, Sub, Mul, Div, and the other arithmetic/nonlinear ops: float inputs and outputs activations
  (constant inputs as per-tensor weights). Softmax outputs get the fixed range [0, 1] (as in ORT;
  Sigmoid outputs keep their calibrated range, also as in ORT).
- GlobalAveragePool, Where, and without a target Relu and Clip: quantized only when their data input already is (ORT's rule;
  ForceQuantizeNoInputCheck overrides), with their own output scale.
- Pad (QDQ; in QOperator output it is a latent op): input quantized; output shares its scale for edge/reflect/wrap or zero padding, else its own.
- "Latent" ops that only move or select values (Reshape, Transpose, MaxPool, Resize, Slice, ...):
  quantized only when their input already is (ForceQuantizeNoInputCheck overrides); output shares
  the input's scale (TPU-MLIR's backward calibration: the requantization is then the identity).
  With float8 types MaxPool stays float (ORT's rule).
- Softmax inputs: the range reaches at most ``SOFTMAX_SPAN`` below the maximum (the attention mask).
- A Concat of unit-range scores and other values (a detection head's boxes) stays float (``traps.py``).
- A Relu/Clip whose input is quantized and read by it alone, with asymmetric activations and no
  target (ORT's rule): the node is removed, its input takes its name and the quantization of its
  output, whose saturation does the clipping (``plan.removed``; QDQKeepRemovableActivations keeps it).
- QOperator with symmetric activations (ORT's rule): a Relu/Clip stays float, between a DQ and, if
  a quantized consumer reads its output, a Q.
- With a target: a Relu/Clip that is the single consumer of a Conv/Gemm/MatMul/Add output is fused:
  the intermediate tensor gets no quantization of its own.
- A Conv input produced by a DequantizeLinear of constants is already quantized: it keeps that node's
  parameters (the bias uses them) and gets no new quantizer (ORT's rule).
- Everything else stays float; the plan records why for each node.
- With a target, the boundary into a node left float on purpose (``nodes_to_exclude``, a config's
  ``exclude``, the budget search's float layers): an input it reads from an op the NPU runs but the
  rules above leave unquantized (an activation the target fuses, such as dpu-b4096's HardSwish after its
  convolution), fed by a quantized tensor, gets an activation quantizer. That is the NPU's int8 output
  read by the CPU; without it the producer's whole group would have no quantized output and would run on
  the CPU too (PP-OCRv4 rec for dpu-b4096: one offset Add left float took its convolution + hard-swish
  group along).

That is the "ort" placement. Under the "kernels" placement (``placement.py``) only the inputs that
integer kernels consume are marked, each on its edge into that kernel, and no output is marked.
"""

from __future__ import annotations

__all__ = ["AnnotateConfig", "annotate"]

import dataclasses
from collections.abc import Mapping

import onnx_ir as ir

from zonnx.quantization.dq_consts import dq_params
from zonnx.quantization.op_rules import (
    DATA_INPUTS,
    FUSES_ACTIVATION,
    LATENT_OPS,
    LINEAR_WEIGHT_AXIS,
    NEEDS_QUANTIZED_INPUT,
    QUANTIZABLE_OPS,
    REMOVABLE_ACTIVATIONS,
    SOFTMAX_SPAN,
    UNIT_RANGE_OUTPUTS,
)
from zonnx.quantization.placement import kernel_inputs, placement_reason
from zonnx.quantization.plan import QuantPlan, Role, TensorPlan
from zonnx.quantization.schemes import QuantSpec
from zonnx.quantization.traps import mixed_range_concat


@dataclasses.dataclass(frozen=True)
class AnnotateConfig:
    """What the op rules need from the user's options (defaults are ORT's)."""

    activation: QuantSpec
    weight: QuantSpec
    per_channel: bool = False
    op_types: frozenset[str] = QUANTIZABLE_OPS
    nodes_to_quantize: frozenset[str] = frozenset()
    nodes_to_exclude: frozenset[str] = frozenset()
    matmul_const_b_only: bool = False
    force_quantize_no_input_check: bool = False
    exclude_output_op_types: frozenset[str] = frozenset()
    keep_removable_activations: bool = False
    #: ORT's rule for a Relu/Clip whose input is quantized (asymmetric activations, no target): the node
    #: is removed and its input takes its name and its quantization (``plan.removed``)
    remove_activations: bool = False
    #: with a target: a Relu/Clip after Conv/Gemm/MatMul/Add leaves the tensor between them float
    fuse_activations: bool = False
    #: QOperator with symmetric activations (ORT's rule): a Relu/Clip runs in float, its output is
    #: quantized only where a quantized consumer reads it
    float_activations: bool = False
    per_channel_axis: Mapping[str, int] = dataclasses.field(default_factory=dict)
    node_activation: Mapping[str, QuantSpec] = dataclasses.field(default_factory=dict)
    node_weight: Mapping[str, QuantSpec] = dataclasses.field(default_factory=dict)
    placement: str = "ort"
    qoperator: bool = False  # QOperator output: Pad is a latent op (ORT's QLinear registry)
    #: with a target: the ONNX op types its NPU runs or fuses (the boundary rule above); empty without
    npu_ops: frozenset[str] = frozenset()


def _is_float(v: ir.Value | None) -> bool:
    return v is not None and v.dtype in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def _is_const(v: ir.Value) -> bool:
    return v.const_value is not None


def _consumers(v: ir.Value) -> list[ir.Node]:
    return [use.node for use in v.uses()]


class _Annotator:
    def __init__(self, model: ir.Model, cfg: AnnotateConfig) -> None:
        self.model = model
        self.cfg = cfg
        self.plan = QuantPlan()
        self.graph_outputs = {id(v) for v in model.graph.outputs}

    # -- selection ---------------------------------------------------------------------------
    def _selected(self, node: ir.Node) -> str | None:
        """None when the node is to be quantized, else the reason it is not."""
        if node.domain not in ("", "ai.onnx"):
            return f"domain {node.domain!r} is not quantized"
        if node.op_type not in self.cfg.op_types:
            return f"op type {node.op_type} is not in op_types_to_quantize"
        if node.name in self.cfg.nodes_to_exclude:
            return "listed in nodes_to_exclude"
        if self.cfg.nodes_to_quantize and node.name not in self.cfg.nodes_to_quantize:
            return "not listed in nodes_to_quantize"
        if not any(_is_float(v) for v in node.inputs):
            return "has no float input"
        return None

    def _act_spec(self, node: ir.Node) -> QuantSpec:
        return self.cfg.node_activation.get(node.name, self.cfg.activation)

    def _weight_spec(self, node: ir.Node, axis: int | None) -> QuantSpec:
        base = self.cfg.node_weight.get(node.name, self.cfg.weight)
        if self.cfg.per_channel and axis is not None:
            axis = self.cfg.per_channel_axis.get(node.op_type, axis)
            # ORT: per-channel weights are symmetric (QLinear kernels need one zero point for all channels)
            return dataclasses.replace(
                base,
                axis=axis,
                symmetric=True,
                restricted=base.dtype.name in ("int8", "int16") and not base.power_of_two,
            )
        return dataclasses.replace(base, axis=None)

    # -- marking -------------------------------------------------------------------------------
    def _prequantized(self, v: ir.Value | None) -> bool:
        """Plan ``v`` as already quantized when it is the output of a DequantizeLinear with constant
        scale and zero point (ORT leaves such tensors as they are); False when it is not."""
        if v is None:
            return False
        if v.name in self.plan.tensors:
            return self.plan.tensors[v.name].prequantized
        params = dq_params(v)
        if params is None:
            return False
        self.plan.add(TensorPlan(v.name, Role.WEIGHT, QuantSpec(params.dtype), fixed_params=params,
                                 prequantized=True))  # fmt: skip
        return True

    def _act(self, node: ir.Node, v: ir.Value | None) -> None:
        if self._prequantized(v):
            return
        if _is_float(v) and v is not None and not _is_const(v):
            edge = frozenset({node.name}) if self.cfg.placement == "kernels" else None
            self.plan.add(
                TensorPlan(
                    v.name,
                    Role.ACTIVATION,
                    self._act_spec(node),
                    consumers=edge,
                    float16=v.dtype == ir.DataType.FLOAT16,
                )
            )

    def _weight(self, node: ir.Node, v: ir.Value | None, axis: int | None) -> None:
        if _is_float(v) and v is not None and _is_const(v):
            self.plan.add(
                TensorPlan(
                    v.name, Role.WEIGHT, self._weight_spec(node, axis), float16=v.dtype == ir.DataType.FLOAT16
                )
            )

    def _output(self, node: ir.Node) -> None:
        if self.cfg.placement == "kernels" or node.op_type in self.cfg.exclude_output_op_types:
            return
        for out in node.outputs:
            if self._fused_activation(node, out):
                continue
            self._act(node, out)
            if node.op_type in UNIT_RANGE_OUTPUTS and out.name in self.plan.tensors:
                self.plan.tensors[out.name].fixed_range = (0.0, 1.0)

    def _fused_activation(self, node: ir.Node, out: ir.Value) -> bool:
        if (
            self.cfg.keep_removable_activations
            or not self.cfg.fuse_activations
            or node.op_type not in FUSES_ACTIVATION
        ):
            return False
        users = _consumers(out)
        return (
            len(users) == 1
            and id(out) not in self.graph_outputs
            and users[0].op_type in REMOVABLE_ACTIVATIONS
            and self._selected(users[0]) is None
        )

    # -- rules ---------------------------------------------------------------------------------
    def visit(self, node: ir.Node) -> None:
        reason = self._selected(node)
        if reason is not None:
            self.plan.skipped[node.name] = reason
            return
        op = node.op_type
        ins = list(node.inputs)
        if self.cfg.placement == "kernels" and not kernel_inputs(node):
            self.plan.skipped[node.name] = placement_reason(node)
            return
        trap = mixed_range_concat(node)
        if trap is not None:
            self.plan.skipped[node.name] = trap
            return
        if op in LINEAR_WEIGHT_AXIS:
            w = ins[1] if len(ins) > 1 else None
            if w is None or not (_is_const(w) or self._prequantized(w) or self._prequantized(ins[0])):
                self.plan.skipped[node.name] = "weight W is not a constant"
                return
            self._act(node, ins[0])
            if _is_const(w):
                self._weight(node, w, LINEAR_WEIGHT_AXIS[op])
            elif not self._prequantized(w):
                self._act(node, w)
            self._bias(node, ins, 2)
        elif op == "Gemm":
            self._gemm(node, ins)
        elif op == "MatMul":
            if self.cfg.matmul_const_b_only and not _is_const(ins[1]):
                self.plan.skipped[node.name] = "B is not a constant (MatMulConstBOnly)"
                return
            self._act(node, ins[0])
            if _is_const(ins[1]):
                rank = len(ins[1].shape) if ins[1].shape is not None else 2
                self._weight(node, ins[1], rank - 1)
            else:
                self._act(node, ins[1])
        elif op == "Pad" and not self.cfg.qoperator:
            self._pad(node, ins)
            return
        elif op in REMOVABLE_ACTIVATIONS and self.cfg.float_activations:
            self.plan.skipped[node.name] = (
                "symmetric activations: Relu/Clip runs in float (ORT's QOperator rule)"
            )
            return
        elif (
            op in NEEDS_QUANTIZED_INPUT or (op in REMOVABLE_ACTIVATIONS and not self.cfg.fuse_activations)
        ) and not self._input_quantized(node, NEEDS_QUANTIZED_INPUT.get(op, 0)):
            self.plan.skipped[node.name] = "input is not quantized"
            return
        elif op in REMOVABLE_ACTIVATIONS and self._removable(node):
            src = ins[0]
            assert src is not None
            self.plan.tensors.pop(src.name)  # quantized at the activation's output instead
            self.plan.removed[node.name] = (src.name, node.outputs[0].name)
            self._output(node)
            self.plan.quantized_nodes.append(node.name)
            return
        elif op in LATENT_OPS or op == "Pad":
            src = ins[0]
            if op == "MaxPool" and self._act_spec(node).dtype.is_float:
                self.plan.skipped[node.name] = "MaxPool stays float with float8 types (ORT's rule)"
                return
            if src is None or (
                src.name not in self.plan.tensors and not self.cfg.force_quantize_no_input_check
            ):
                self.plan.skipped[node.name] = "input is not quantized (latent op)"
                return
            self._act(node, src)
            for out in node.outputs:
                self._act(node, out)
                if out.name in self.plan.tensors:
                    self.plan.share(src.name, out.name)
            self.plan.quantized_nodes.append(node.name)
            return
        else:
            for i, v in enumerate(ins):
                if i in DATA_INPUTS.get(op, range(len(ins))):
                    if v is not None and _is_const(v):
                        self._weight(node, v, None)
                    elif op in REMOVABLE_ACTIVATIONS and self._input_fused(v):
                        continue
                    else:
                        self._act(node, v)
                        if op == "Softmax" and v is not None and v.name in self.plan.tensors:
                            self.plan.tensors[v.name].softmax_span = SOFTMAX_SPAN
        self._output(node)
        self.plan.quantized_nodes.append(node.name)

    def _pad(self, node: ir.Node, ins: list[ir.Value | None]) -> None:
        """Pad (ORT's rule): input always quantized; the output shares its scale when padding only copies
        input values or zeros (edge/reflect/wrap, constant 0), else gets its own; a constant pad value
        is stored quantized like a weight with the activation type."""
        src = ins[0]
        self._act(node, src)
        value = ins[2] if len(ins) > 2 else None
        if value is not None and _is_const(value) and _is_float(value):
            self.plan.add(
                TensorPlan(value.name, Role.WEIGHT, dataclasses.replace(self._act_spec(node), axis=None))
            )
            pad_value = float(value.const_value.numpy().reshape(-1)[0]) if value.const_value.size else 0.0
        elif value is not None:
            pad_value = None  # computed at run time
        else:
            pad_value = node.attributes.get_float("value", 0.0)
        mode = node.attributes.get_string("mode", "constant")
        same = mode in ("reflect", "edge", "wrap") or (mode == "constant" and pad_value == 0.0)
        self._output(node)
        out = node.outputs[0]
        if same and src is not None and src.name in self.plan.tensors and out.name in self.plan.tensors:
            self.plan.share(src.name, out.name)
        self.plan.quantized_nodes.append(node.name)

    def quantize_npu_boundary(self, node: ir.Node) -> None:
        """The boundary rule (module docstring) for the inputs of ``node``, a node left float."""
        for v in node.inputs:
            producer = v.producer() if v is not None else None
            if (
                producer is None
                or not _is_float(v)
                or v.name in self.plan.tensors
                or producer.name not in self.plan.skipped
                or producer.name in self.cfg.nodes_to_exclude
                or producer.op_type not in self.cfg.npu_ops
                or not producer.inputs
                or producer.inputs[0] is None
                or producer.inputs[0].name not in self.plan.tensors
            ):
                continue
            self._act(producer, v)

    def _input_quantized(self, node: ir.Node, index: int) -> bool:
        v = node.inputs[index] if len(node.inputs) > index else None
        return self.cfg.force_quantize_no_input_check or (v is not None and v.name in self.plan.tensors)

    def _removable(self, node: ir.Node) -> bool:
        """ORT's removable activation: its input is quantized, read only by it, and not a graph input or
        output; its output is quantized (so the quantizer's saturation does the clipping)."""
        src = node.inputs[0] if node.inputs else None
        return (
            self.cfg.remove_activations
            and not self.cfg.keep_removable_activations
            and src is not None
            and src.name in self.plan.tensors
            and self.plan.tensors[src.name].role is Role.ACTIVATION
            and len(_consumers(src)) == 1
            and id(src) not in self.graph_outputs
            and not src.is_graph_input()
            and src.producer() is not None
            and node.op_type not in self.cfg.exclude_output_op_types
            and all(_is_const(v) for v in node.inputs[1:] if v is not None)
        )

    def _input_fused(self, v: ir.Value | None) -> bool:
        producer = v.producer() if v is not None else None
        return (
            producer is not None and self._selected(producer) is None and self._fused_activation(producer, v)
        )

    def _gemm(self, node: ir.Node, ins: list[ir.Value | None]) -> None:
        b = ins[1]
        self._act(node, ins[0])
        if b is not None and _is_const(b):
            trans_b = node.attributes.get_int("transB", 0)
            self._weight(node, b, 0 if trans_b else 1)
            self._bias(node, ins, 2)
        else:
            self._act(node, b)
        if (
            len(ins) > 2
            and ins[2] is not None
            and ins[2].name not in self.plan.tensors
            and not _is_const(ins[2])
        ):
            self._act(node, ins[2])

    def _bias(self, node: ir.Node, ins: list[ir.Value | None], index: int) -> None:
        if len(ins) <= index or ins[index] is None or not _is_const(ins[index]) or ins[1] is None:
            return
        x, w, b = ins[0], ins[1], ins[index]
        if x is None or x.name not in self.plan.tensors or w.name not in self.plan.tensors:
            return
        if self.plan.tensors[w.name].role is not Role.WEIGHT and not self.plan.tensors[x.name].prequantized:
            return
        w_axis = self.plan.tensors[w.name].spec.axis
        self.plan.add(
            TensorPlan(
                b.name,
                Role.BIAS,
                dataclasses.replace(self.cfg.weight, axis=0 if w_axis is not None else None),
                bias_of=(x.name, w.name),
                bias_node=node.name,
            )
        )


def annotate(model: ir.Model, cfg: AnnotateConfig) -> QuantPlan:
    """Run the op rules over the main graph in topological order and return the plan."""
    annotator = _Annotator(model, cfg)
    for node in model.graph:
        annotator.visit(node)
    if cfg.npu_ops and cfg.placement == "ort":
        for node in model.graph:
            if node.name in cfg.nodes_to_exclude:
                annotator.quantize_npu_boundary(node)
    return annotator.plan
