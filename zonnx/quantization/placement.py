"""Quantizer placement: which edges of the graph carry a quantizer, chosen by a named policy.

Two policies (``extra_options["QuantPlacement"]``; ``zonnx quantize`` without a target uses "kernels"):

- ``"ort"``: ONNX Runtime's rule, the drop-in default of ``quantize_static``: every float input and
  output of every node whose op type is quantizable (see ``annotate``) gets a quantizer, so nearly
  every tensor of the graph is rounded to 8 bits.
- ``"kernels"``: only what an integer kernel consumes. The activation inputs of Conv, ConvTranspose,
  MatMul, Gemm and average pooling get a quantizer *on the edge into that node* (other readers of the
  same tensor keep the float value), with their weights and int32 bias. A residual Add (two
  non-constant inputs) is quantized too when everything its output reaches, through Relu/Clip, is
  such a kernel or another residual Add: that is the CNN shortcut whose integer form keeps the
  convolutions integer end to end. Everything else stays float: Softmax, LayerNorm and its
  decomposed pieces, GELU, Sigmoid/HardSwish, the attention mask Add, the attention-scale Div, bias
  Adds, and outputs nothing integer reads. Rounding a tensor that no integer kernel reads costs
  accuracy and buys nothing on a CPU (NNCF places its quantizers the same way).

Targets (``Target`` given) keep the "ort" placement: an NPU needs every tensor of the subgraphs it
runs in integer form, and the target's refinement rules decide the rest.
"""

from __future__ import annotations

__all__ = ["PLACEMENTS", "KERNEL_OPS", "kernel_inputs", "is_residual_add", "placement_reason"]

import onnx_ir as ir

PLACEMENTS = ("ort", "kernels")
#: op type -> indices of the activation inputs an integer kernel of that op consumes.
KERNEL_OPS: dict[str, tuple[int, ...]] = {
    "Conv": (0,),
    "ConvTranspose": (0,),
    "Gemm": (0, 1),
    "MatMul": (0, 1),
    "AveragePool": (0,),
    "GlobalAveragePool": (0,),
}
#: Ops a quantized value may pass through between a residual Add and the kernel that reads it.
_PASS_THROUGH = frozenset({"Relu", "Clip"})


def _is_const(v: ir.Value | None) -> bool:
    return v is not None and v.const_value is not None


def kernel_inputs(node: ir.Node) -> tuple[int, ...]:
    """Indices of the non-constant inputs of ``node`` that its integer kernel consumes ("kernels")."""
    if node.op_type == "Add" and is_residual_add(node):
        return (0, 1)
    indices = KERNEL_OPS.get(node.op_type, ())
    return tuple(i for i in indices if i < len(node.inputs) and not _is_const(node.inputs[i]))


def _reaches_only_kernels(value: ir.Value, seen: set[int]) -> bool:
    if value.is_graph_output():
        return False
    users = [use.node for use in value.uses()]
    if not users:
        return False
    for user in users:
        if user.op_type in _PASS_THROUGH:
            if not all(_reaches_only_kernels(out, seen) for out in user.outputs):
                return False
        elif user.op_type == "Add" and _two_activations(user):
            if id(user) in seen:
                continue
            seen.add(id(user))
            if not _reaches_only_kernels(user.outputs[0], seen):
                return False
        elif user.op_type not in KERNEL_OPS:
            return False
    return True


def _two_activations(node: ir.Node) -> bool:
    ins = list(node.inputs)
    return len(ins) == 2 and all(v is not None and not _is_const(v) for v in ins)


def is_residual_add(node: ir.Node) -> bool:
    """An Add of two activations whose output (through Relu/Clip) feeds only integer kernels."""
    return (
        node.op_type == "Add"
        and _two_activations(node)
        and _reaches_only_kernels(node.outputs[0], {id(node)})
    )


def placement_reason(node: ir.Node) -> str:
    """Why the "kernels" placement leaves ``node`` float (reported per node in the plan)."""
    if node.op_type == "Add" and _two_activations(node):
        return "kernels placement: the Add's output reaches a float op, so it stays float"
    return f"kernels placement: no integer kernel consumes {node.op_type}'s inputs, so it stays float"
