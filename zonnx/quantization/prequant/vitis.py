"""FixNeuron / VitisQDQ sources rewritten as ONNX QDQ with the same grids, for the QDQ importer.

The com.zonnx ops (``zonnx.custom_ops``) quantize on the power-of-two grid ``scale = 2^-pos``, zero point
0, codes ``[qmin, qmax]`` of ``bit_width`` bits (``signed``); ``FixNeuron(x) = code(x) * 2^-pos`` with
``code(x) = round_mode(clamp(x * 2^pos, qmin, qmax))``. The rules:

- ``FixNeuron`` of a constant ``w``: the constant codes ``code(w)`` (computed with the node's own
  ``round_mode``) read by ``DequantizeLinear(2^-pos, 0)``; the importer turns them into the float weight
  the source computed, ``code(w) * 2^-pos`` exactly, with its grid;
- ``FixNeuron`` of any other tensor: ``QuantizeLinear -> DequantizeLinear`` with the same grid; the
  importer keeps the float tensor and records its grid (rounding at exact halves is the target's choice
  once it is requantized);
- ``VitisQuantizeLinear`` / ``VitisDequantizeLinear``: ``QuantizeLinear`` / ``DequantizeLinear`` with the
  same scale and zero point 0; a VitisQuantizeLinear of a constant becomes its constant codes (a weight).

Storage: 8- and 16-bit grids map to int8/uint8/int16/uint16 codes. An activation grid of another width has
no ONNX code type with its range, so the import is refused in one line (requantize the float model);
a constant of a narrower width keeps its values exactly on the 8-bit type. ``narrow`` only removes the
lowest code, which the values never use, so the grid is the full one.
"""

from __future__ import annotations

__all__ = ["VITIS_OPS", "vitis_to_qdq"]

import logging
from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir

from zonnx.custom_ops import ZONNX_DOMAIN
from zonnx.custom_ops.grid import canonical_round_mode, code_reference
from zonnx.errors import UnsupportedModelError
from zonnx.ir.names import NameSource
from zonnx.passes.fusion.matching import const_array, label, replace_value

logger = logging.getLogger(__name__)

VITIS_OPS = frozenset({"FixNeuron", "VitisQuantizeLinear", "VitisDequantizeLinear"})
_STORAGE = {
    (8, 1): (ir.DataType.INT8, np.int8),
    (8, 0): (ir.DataType.UINT8, np.uint8),
    (16, 1): (ir.DataType.INT16, np.int16),
    (16, 0): (ir.DataType.UINT16, np.uint16),
}


class _Rewriter:
    def __init__(self, model: ir.Model) -> None:
        self.graph = model.graph
        self.names = NameSource.of(self.graph)

    def fresh(self, hint: str) -> str:
        return self.names.fresh(hint)

    def constant(self, hint: str, array: np.ndarray) -> ir.Value:
        name = self.fresh(hint)
        value = ir.Value(name=name, type=ir.TensorType(ir.DataType(onnx.helper.np_dtype_to_tensor_dtype(array.dtype))),
                         shape=ir.Shape(array.shape), const_value=ir.tensor(array, name=name))  # fmt: skip
        self.graph.register_initializer(value)
        return value

    def grid(self, node: ir.Node, storage: tuple[ir.DataType, type]) -> tuple[ir.Value, ir.Value]:
        pos = node.attributes.get_int("pos")
        base = node.name or node.op_type
        scale = self.constant(f"{base}_scale", np.array(2.0**-pos, np.float32))
        zero = self.constant(f"{base}_zero_point", np.zeros((), storage[1]))
        return scale, zero

    def storage(self, node: ir.Node, constant: bool) -> tuple[ir.DataType, type]:
        bits = node.attributes.get_int("bit_width", 8)
        signed = node.attributes.get_int("signed", 1)
        found = _STORAGE.get((bits, signed))
        if found is None and constant and bits < 8:
            found = _STORAGE[(8, signed)]
        if found is None:
            raise UnsupportedModelError(
                f"{label(node)} ({node.op_type}) quantizes a tensor to {bits}-bit "
                f"{'signed' if signed else 'unsigned'} codes, which no ONNX code type holds; requantize the "
                "float model for the target instead (zonnx quantize FLOAT.onnx ... --target T)."
            )
        return found

    def codes(self, node: ir.Node, w: np.ndarray, storage: tuple[ir.DataType, type]) -> ir.Value:
        """The constant codes of ``w`` on the node's grid, with its own rounding mode."""
        a = node.attributes
        mode = canonical_round_mode(a.get_string("round_mode", "half_even")) or "half_even"
        codes = code_reference(w, bit_width=a.get_int("bit_width", 8), pos=a.get_int("pos"),
                               signed=a.get_int("signed", 1), narrow=a.get_int("narrow", 0), round_mode=mode)  # fmt: skip
        return self.constant(f"{node.inputs[0].name}_codes", np.nan_to_num(codes).astype(storage[1]))

    def fixneuron(self, node: ir.Node) -> None:
        x, y = node.inputs[0], node.outputs[0]
        w = const_array(x)
        storage = self.storage(node, w is not None)
        scale, zero = self.grid(node, storage)
        base = node.name or "FixNeuron"
        if w is not None:
            q = self.codes(node, w, storage)
        else:
            q = ir.Value(name=self.fresh(f"{y.name}_codes"), type=ir.TensorType(storage[0]), shape=x.shape)
            self.graph.insert_before(node, ir.node("QuantizeLinear", [x, scale, zero], outputs=[q],
                                                   name=self.fresh(f"{base}_QuantizeLinear")))  # fmt: skip
        out = ir.Value(name=self.fresh(f"{y.name}_dq"), type=ir.TensorType(ir.DataType.FLOAT), shape=y.shape)
        self.graph.insert_before(node, ir.node("DequantizeLinear", [q, scale, zero], outputs=[out],
                                               name=self.fresh(f"{base}_DequantizeLinear")))  # fmt: skip
        replace_value(y, out)
        self.graph.remove(node, safe=True)

    def quantizer(self, node: ir.Node) -> None:
        x, y = node.inputs[0], node.outputs[0]
        quantize = node.op_type == "VitisQuantizeLinear"
        w = const_array(x)
        storage = self.storage(node, w is not None)
        if quantize and w is not None:  # quantized constant: its codes, read by the DequantizeLinear
            replace_value(y, self.codes(node, w, storage))
            self.graph.remove(node, safe=True)
            return
        scale, zero = self.grid(node, storage)
        out = ir.Value(name=self.fresh(f"{y.name}_onnx"), shape=y.shape,
                       type=ir.TensorType(storage[0] if quantize else ir.DataType.FLOAT))  # fmt: skip
        op = "QuantizeLinear" if quantize else "DequantizeLinear"
        self.graph.insert_before(
            node, ir.node(op, [x, scale, zero], outputs=[out], name=self.fresh(f"{node.name or op}_onnx"))
        )
        replace_value(y, out)
        self.graph.remove(node, safe=True)


def vitis_to_qdq(model: ir.Model) -> Counter[str]:
    """Rewrite every FixNeuron / VitisQuantizeLinear / VitisDequantizeLinear of ``model`` (in place) as
    ONNX QDQ by the module's rules; returns the count per op. UnsupportedModelError for a grid no ONNX
    code type holds."""
    rewriter, counts = _Rewriter(model), Counter()
    for node in list(model.graph):
        if node.domain != ZONNX_DOMAIN or node.op_type not in VITIS_OPS:
            continue
        if node.op_type == "FixNeuron":
            rewriter.fixneuron(node)
        else:
            rewriter.quantizer(node)
        counts[node.op_type] += 1
    used = {(n.domain, n.op_type) for n in model.graph}
    for key in [k for k in model.functions if k[0] == ZONNX_DOMAIN and (k[0], k[1]) not in used]:
        del model.functions[key]
    if not any(n.domain == ZONNX_DOMAIN for n in model.graph):
        model.opset_imports.pop(ZONNX_DOMAIN, None)
    logger.info(
        "FixNeuron/VitisQDQ as ONNX QDQ: %s", ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    )
    return counts
