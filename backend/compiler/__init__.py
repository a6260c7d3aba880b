"""The NPU compiler: quantized ONNX subgraph -> integer ``Program`` (zonnx.backend.compiler).

``lower.compile_subgraph(model, node_names, inputs, outputs, target)`` lowers a QDQ or FixNeuron subgraph
by driving the op modules of ``zonnx.backend.ops``; ``Program`` is the serializable op list
(``program``); ``requant`` holds the multiplier/shift and rounding arithmetic; ``values``, ``params`` and
``linear`` are the compile machinery the op modules share. This package exports the machinery only: the
op modules import it, so it must not import the driver (import ``compile_subgraph`` and
``whole_model_subgraph`` from ``zonnx.backend.compiler.lower``).
"""

from .program import FORMAT_VERSION, Op, Program, ProgramFormatError, TensorInfo
from .requant import quantize_multiplier, requantize, rshift_round
from .values import CompileError

__all__ = [
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
