"""FixNeuron and VitisQDQ writers: power-of-two quantizers as ``com.zonnx`` ops defined as model functions.

- FixNeuron format: one ``FixNeuron(x)`` (quantize then dequantize) on every planned tensor, with
  ``bit_width`` and ``pos`` (scale 2^-pos); weights and biases keep their float initializers and get
  a FixNeuron each, which ORT folds at load time.
- VitisQDQ format: ``VitisQuantizeLinear`` -> ``VitisDequantizeLinear`` pairs instead.
- Rounding (vai_q_onnx runs numpy's half-to-even everywhere; the DPU rounds activations half up):
  activations use ``half_up`` and weights and biases ``half_even`` unless ``round_mode`` names one
  mode for all (extra option ``FixRoundMode``), so the fake-quantized model matches the hardware.
"""

from __future__ import annotations

__all__ = ["write_fixneuron", "ACTIVATION_ROUND_MODE", "WEIGHT_ROUND_MODE"]

from collections import Counter

import numpy as np
import onnx_ir as ir

from zonnx.custom_ops import add_functions, make_node
from zonnx.errors import OptionError
from zonnx.quantization.formats.common import ValueIndex, consumer_nodes, insert_on_value
from zonnx.quantization.plan import QuantPlan, Role, TensorPlan

ACTIVATION_ROUND_MODE = "half_up"
WEIGHT_ROUND_MODE = "half_even"


def _attrs(tp: TensorPlan, round_mode: str | None) -> dict[str, int | str]:
    params = tp.params
    assert params is not None and params.pos is not None
    if params.pos.ndim != 0:
        raise OptionError(
            f"tensor {tp.name!r}: FixNeuron takes one position per tensor; "
            "per-channel power-of-two is not supported (use per_channel=False)."
        )
    mode = round_mode or (ACTIVATION_ROUND_MODE if tp.role is Role.ACTIVATION else WEIGHT_ROUND_MODE)
    # An all-zero tensor gets pos 127 from the scheme; the ops accept [-127, 126] and the codes are the same.
    return {
        "bit_width": params.dtype.bits,
        "pos": int(np.clip(params.pos, -127, 126)),
        "signed": int(params.dtype.signed),
        "narrow": int(params.qmin == -params.qmax),
        "round_mode": mode,
    }


def write_fixneuron(
    model: ir.Model, plan: QuantPlan, *, separate: bool = False, round_mode: str | None = None
) -> Counter[str]:
    """Insert FixNeuron (or Vitis Q/DQ pairs when ``separate``) on every planned tensor; add the functions."""
    graph = model.graph
    index = ValueIndex(graph)
    counts: Counter[str] = Counter()
    for tp in plan.tensors.values():
        if tp.params is None or tp.name not in index:
            continue
        attrs = _attrs(tp, round_mode)

        def build(v: ir.Value, tp: TensorPlan = tp, attrs: dict = attrs) -> tuple[list[ir.Node], ir.Value]:
            if not separate:
                node = make_node(
                    "FixNeuron",
                    [v],
                    [index.unique(f"{tp.name}_fix")],
                    name=index.unique(f"{tp.name}_FixNeuron"),
                    **attrs,
                )
                out = node.outputs[0]
                out.type, out.shape = ir.TensorType(ir.DataType.FLOAT), v.shape
                return [node], out
            q_attrs = dict(attrs)
            dq_attrs = {k: attrs[k] for k in ("bit_width", "pos", "signed", "narrow")}
            q = make_node(
                "VitisQuantizeLinear",
                [v],
                [index.unique(f"{tp.name}_VitisQuantizeLinear_Output")],
                name=index.unique(f"{tp.name}_VitisQuantizeLinear"),
                **q_attrs,
            )
            dq = make_node(
                "VitisDequantizeLinear",
                [q.outputs[0]],
                [index.unique(f"{tp.name}_VitisDequantizeLinear_Output")],
                name=index.unique(f"{tp.name}_VitisDequantizeLinear"),
                **dq_attrs,
            )
            out = dq.outputs[0]
            out.type, out.shape = ir.TensorType(ir.DataType.FLOAT), v.shape
            return [q, dq], out

        value = index[tp.name]
        insert_on_value(graph, value, build, consumer_nodes(value, tp.consumers))
        counts[tp.role.value] += 1
    add_functions(model, ["VitisQuantizeLinear", "VitisDequantizeLinear"] if separate else ["FixNeuron"])
    return counts
