"""Custom quantized ops as ONNX model-local functions, each with a numpy reference kernel (zonnx.custom_ops).

The ops of domain ``com.zonnx`` (version 1) that the FixNeuron and VitisQDQ writers emit:

- ``FixNeuron(x: float32) -> float32``: ``y = round_mode(clamp(x * 2^pos, qmin, qmax)) * 2^-pos``;
- ``VitisQuantizeLinear(x: float32) -> int``: the integer code ``q`` of the same expression;
- ``VitisDequantizeLinear(q: int) -> float32``: ``y = q * 2^-pos`` (no clamping, like ONNX's).

Attributes: ``pos`` (required, [-127, 126] so that 2^pos, 2^(pos+1) and 2^-pos are finite float32 numbers;
scale 2^-pos; vai_q_onnx's pos 127 for all-zero tensors must be written as 126), ``bit_width`` (8, [2, 24]:
every code is an exact float32 integer), ``signed`` (1),
``narrow`` (0; 1 gives the symmetric signed range), ``round_mode`` ("half_even"; also half_up, half_away,
floor, trunc and the aliases toward_zero, std_round, ...; not on VitisDequantizeLinear, which does not
round) and, on VitisQuantizeLinear, ``output_dtype`` (ONNX type number, derived from bit_width and signed).
``grid.py`` states the exact numeric rules, including signed zero (a code that rounds to zero keeps the
sign of x, so FixNeuron(-0.0) is -0.0) and NaN (FixNeuron keeps NaN; the integer code of NaN is 0 in the
reference and whatever ORT's Cast gives in the function: 0 for 8/16-bit storage on x86).

Design choices, each measured in onnxruntime 1.31.1 and onnx 1.23.2:

- Each op is a FunctionProto stored in the model, so any stock ORT inlines and runs it natively (Python
  custom ops cost ~50 ns per element). Numeric attributes reach the body through ``ref_attr_name``
  (``Constant(value_int=@pos)``, Cast, Pow) with defaults in ``attribute_proto``; one body serves nodes
  with different attribute values, and ORT folds the constants after inlining.
- The rounding mode selects the body through the node's ``overload`` (IR version 10): a body cannot
  branch on a string attribute before opset 19 (string Equal), and an If on it would only be folded at
  ORT's optimization levels. Nodes also carry ``round_mode`` itself; ``add_functions`` checks the two agree.
- The storage type of VitisQuantizeLinear is the ``output_dtype`` attribute read by the body's
  ``Cast(to=@output_dtype)``: ORT, onnx's checker and shape inference, and ReferenceEvaluator all resolve it,
  so one body serves int8, uint8, int16, uint16 and int32 outputs.
- Bodies are built at the model's default opset (>= 13): ORT runs inlined ops at the model's opset, and
  onnx's checker requires the function's imports to agree with the model's.
- ``make_node`` writes every attribute explicitly (onnx's ReferenceEvaluator ignores function defaults).

Public API: ``ZONNX_DOMAIN``, ``REGISTRY`` (op name -> ``OpDefinition``), ``make_node``,
``add_functions``, ``reference_run`` (one op in numpy), ``run_reference`` (a whole model with the numpy
kernels), ``run_functions`` (a whole model executing the function bodies in onnx's ReferenceEvaluator).
"""

from __future__ import annotations

__all__ = [
    "ZONNX_DOMAIN",
    "ZONNX_VERSION",
    "MIN_OPSET",
    "REGISTRY",
    "OpRegistry",
    "OpDefinition",
    "AttrSpec",
    "ROUND_MODES",
    "make_node",
    "add_functions",
    "reference_run",
    "run_reference",
    "run_functions",
    "evaluator_model",
]

from .evaluate import evaluator_model, run_functions, run_reference
from .grid import ROUND_MODES
from .install import MIN_OPSET, add_functions
from .registry import REGISTRY, ZONNX_DOMAIN, ZONNX_VERSION, OpRegistry, make_node, reference_run
from .schema import AttrSpec, OpDefinition
