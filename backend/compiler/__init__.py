"""The NPU compiler: quantized ONNX subgraph -> integer ``Program`` (zonnx.backend.compiler).

``compile_subgraph(model, node_names, inputs, outputs, target)`` lowers a QDQ or FixNeuron subgraph
(formulas in ``lower``); ``Program`` is the serializable op list (``program``); ``requant`` holds the
multiplier/shift and rounding arithmetic.
"""

from .lower import CompileError, compile_subgraph, whole_model_subgraph
from .program import FORMAT_VERSION, Op, Program, ProgramFormatError, TensorInfo
from .requant import quantize_multiplier, requantize, rshift_round

__all__ = [
    "compile_subgraph",
    "whole_model_subgraph",
    "CompileError",
    "Program",
    "Op",
    "TensorInfo",
    "ProgramFormatError",
    "FORMAT_VERSION",
    "quantize_multiplier",
    "requantize",
    "rshift_round",
]
