"""The op tables the annotator's rules read (``annotate.py``): which op types are quantized by default,
which only move values, which inputs are data, and the Softmax input span.
"""

from __future__ import annotations

__all__ = [
    "LINEAR_WEIGHT_AXIS",
    "LATENT_OPS",
    "QUANTIZABLE_OPS",
    "REMOVABLE_ACTIVATIONS",
    "NEEDS_QUANTIZED_INPUT",
    "FUSES_ACTIVATION",
    "UNIT_RANGE_OUTPUTS",
    "SOFTMAX_SPAN",
    "DATA_INPUTS",
]

#: Convolutions and the channel axis of their weight.
LINEAR_WEIGHT_AXIS = {"Conv": 0, "ConvTranspose": 1}
LATENT_OPS = {
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "MaxPool",
    "GlobalMaxPool",
    "Resize",
    "Slice",
    "Gather",
    "Split",
    "DepthToSpace",
    "SpaceToDepth",
    "Identity",
    "Expand",
    "Tile",
    "TopK",
    "GatherElements",
}
#: Default op types quantized when the user does not choose: ORT's QLinear and QDQ registries (so results
#: match ORT's for the same call) plus the value-moving ops, which share their input's scale and so add no
#: error. Ops that ORT leaves float by default (Sub, Div, ReduceMean, Pow, Sqrt, Tanh, HardSigmoid, ...) stay
#: float unless op_types_to_quantize names them: quantizing the inside of a decomposed LayerNorm, for
#: example, costs accuracy for nothing.
QUANTIZABLE_OPS = frozenset(
    set(LINEAR_WEIGHT_AXIS)
    | LATENT_OPS
    | {
        "Add",
        "Mul",
        "Gemm",
        "MatMul",
        "Relu",
        "Clip",
        "LeakyRelu",
        "Sigmoid",
        "Softmax",
        "AveragePool",
        "GlobalAveragePool",
        "Concat",
        "ArgMax",
        "Where",
        "InstanceNormalization",
        "LayerNormalization",
        "Pad",
    }
)
#: Activations ORT removes after a quantized input (their saturation clips).
REMOVABLE_ACTIVATIONS = {"Relu", "Clip"}
#: Ops quantized only when their data input already is (or ForceQuantizeNoInputCheck), with their own
#: output scale (ORT's QGlobalAveragePool and QDQWhere rules): op -> index of that data input.
NEEDS_QUANTIZED_INPUT = {"GlobalAveragePool": 0, "Where": 1}
#: Ops a following Relu/Clip fuses into on a target.
FUSES_ACTIVATION = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add"}
#: Outputs with the fixed range [0, 1] (ORT's rule; Sigmoid outputs keep their calibrated range).
UNIT_RANGE_OUTPUTS = {"Softmax"}
#: How far below its maximum a Softmax input's quantization range reaches. Softmax depends only on
#: differences from the row's maximum, and exp(-32) is 1e-14 of the top term, so values further down
#: may be clipped for free. The attention-mask trap is the reason: "(1 - mask) * -10000" added to the
#: scores makes a min/max range of [-10000, s_max], whose 8-bit step (about 40) rounds every real score
#: to the same code; clipped at s_max - 32 the step is 0.125 and masked positions still get ~0 weight.
SOFTMAX_SPAN = 32.0
#: Inputs that are never quantized (shapes, indices, axes) by op type.
DATA_INPUTS = {
    "Reshape": (0,),
    "Expand": (0,),
    "Tile": (0,),
    "Slice": (0,),
    "Gather": (0,),
    "GatherElements": (0,),
    "TopK": (0,),
    "Split": (0,),
    "Pad": (0,),
    "Resize": (0,),
    "Squeeze": (0,),
    "Unsqueeze": (0,),
    "Clip": (0,),
    "ReduceMean": (0,),
    "ReduceSum": (0,),
    "Where": (1, 2),
    "ArgMax": (0,),
}
