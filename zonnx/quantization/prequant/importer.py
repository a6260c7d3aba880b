"""Import a pre-quantized model: the float model it computes, plus the grid of every quantized tensor.

Every accepted form is first brought to QDQ (``dynamic-to-qdq``, then ``qoperator-to-qdq``), then each
``DequantizeLinear`` is removed by the rule that matches its input:

- constant codes (weights, biases): replaced by the float constant ``(q - z) * s`` (per channel along the
  DequantizeLinear's axis); the weight's grid is kept;
- codes of ``QuantizeLinear(x)``: replaced by ``x``; the grid is kept for ``x``. A grid whose lowest code
  is its zero point (``z = qmin``) represents only values >= 0: the quantizer also performed a ReLU
  (ORT drops ReLU/Clip whose output range a quantizer implies), so unless ``x`` is already non-negative a
  ``Relu`` is inserted and the grid moves to its output;
- codes of ``DynamicQuantizeLinear(x)``: replaced by ``x``; the tensor has no grid (its range changes per
  run) and is listed as dynamic: its range must be calibrated.

Quantizers left without readers are removed. A layer the model holds twice, float and quantized on the
same input, is refused (``duplicates``). The float model then computes what the source computes
up to its rounding, and the grids say where the source put each tensor's range.
"""

from __future__ import annotations

__all__ = ["ImportedModel", "import_prequantized"]

import dataclasses
import logging

import numpy as np
import onnx_ir as ir

from zonnx.errors import UnsupportedModelError
from zonnx.ir.io import default_opset
from zonnx.ir.names import NameSource
from zonnx.passes.fusion.matching import const_array, label, prune, replace_value
from zonnx.quantization.prequant.detect import QDQ_DOMAINS, quantized_form
from zonnx.quantization.prequant.duplicates import refuse_duplicate_layers
from zonnx.quantization.prequant.grids import Grid, grid_from_arrays

logger = logging.getLogger(__name__)

_NONNEG_OPS = frozenset({"Relu", "Sigmoid", "Softmax", "HardSigmoid", "Abs", "Exp", "Sqrt"})
_KEEPS_SIGN = frozenset(
    {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Reshape", "Flatten", "Transpose",
     "Squeeze", "Unsqueeze", "Slice", "Identity", "Resize", "Split", "Gather", "DepthToSpace", "SpaceToDepth",
     "Expand", "Tile"}
)  # fmt: skip


#: Ops that move or select codes without changing them: ``op(Q(x)) = Q(op(x))`` with the same grid.
_MOVES_CODES = frozenset(
    {"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Identity", "MaxPool", "Gather",
     "DepthToSpace", "SpaceToDepth", "Expand", "Tile"}
)  # fmt: skip


@dataclasses.dataclass
class ImportedModel:
    """What the import found: the source form, grids by float tensor name, dynamic tensors, notes."""

    form: str
    activations: dict[str, Grid] = dataclasses.field(default_factory=dict)
    weights: dict[str, Grid] = dataclasses.field(default_factory=dict)
    dynamic: list[str] = dataclasses.field(default_factory=list)
    relus: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    rewrites: dict[str, int] = dataclasses.field(default_factory=dict)

    def drop_grids(self) -> None:
        """Forget every activation grid (requantize from scratch: each range is calibrated)."""
        self.notes.append(f"requantized: {len(self.activations)} imported activation range(s) not used")
        self.activations.clear()


def _code_type(q: ir.Node) -> ir.DataType:
    """QuantizeLinear's code type: its zero point's (ONNX's rule), else its output's, else uint8."""
    zp = q.inputs[2] if len(q.inputs) > 2 else None
    if zp is not None and zp.dtype is not None:
        return zp.dtype
    return q.outputs[0].dtype or ir.DataType.UINT8


def _nonneg(value: ir.Value, depth: int = 0) -> bool:
    """Whether ``value`` is >= 0 by construction (ReLU-like producer, or a sign-keeping op of one)."""
    node = value.producer()
    if node is None or depth > 32:
        return False
    if node.op_type in _NONNEG_OPS:
        return True
    if node.op_type == "Clip":
        lo = const_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        return lo is not None and float(lo.reshape(-1)[0]) >= 0
    if node.op_type in _KEEPS_SIGN and node.inputs and node.inputs[0] is not None:
        return _nonneg(node.inputs[0], depth + 1)
    if node.op_type in ("Concat", "Add", "Max", "Mul") and node.inputs:
        return all(v is not None and _nonneg(v, depth + 1) for v in node.inputs)
    return False


def _to_qdq(model: ir.Model, imported: ImportedModel) -> None:
    """Integer ops to QDQ: dynamic forms first, then QOperator; anything left is refused."""
    from zonnx.converters.qoperator_to_qdq import QOperatorToQDQPass
    from zonnx.passes.common.dynamic_to_qdq import DynamicToQDQPass

    if default_opset(model) < 13:
        from zonnx.passes.common.opset_upgrade import OpsetUpgradePass

        OpsetUpgradePass(13)(model)
    misses: list[str] = []
    for p in (DynamicToQDQPass(), QOperatorToQDQPass()):
        result = p(model)
        imported.rewrites.update(result.changes.counts)
        misses += result.changes.misses
    left = [n for n in model.graph if n.op_type.startswith("QLinear") or n.op_type in ("QGemm", "MatMulInteger", "ConvInteger", "DynamicQuantizeLSTM")]  # fmt: skip
    if left:
        why = next((m for m in misses if left[0].name and left[0].name in m), misses[0] if misses else "")
        raise UnsupportedModelError(
            f"{len(left)} integer op(s) of this pre-quantized model cannot be imported, the first "
            f"{label(left[0])} ({left[0].op_type}){': ' + why if why else ''}; requantize the float model instead."
        )


def _dequantized(codes: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, axis: int) -> np.ndarray:
    shape = [1] * codes.ndim
    if scale.size > 1:
        shape[axis] = scale.size
    s = scale.astype(np.float32).reshape(shape if scale.size > 1 else ())
    z = (
        np.zeros((), np.float32)
        if zp is None
        else zp.astype(np.float32).reshape(shape if zp.size > 1 else ())
    )
    return ((codes.astype(np.float32) - z) * s).astype(np.float32)


class _Importer:
    def __init__(self, model: ir.Model, imported: ImportedModel) -> None:
        self.model, self.graph, self.out = model, model.graph, imported
        self.relu_of: dict[int, ir.Value] = {}
        self.names = NameSource.of(self.graph)

    def fresh(self, hint: str) -> str:
        return self.names.fresh(hint)

    def constant(self, dq: ir.Node, codes: np.ndarray) -> str | None:
        """DQ of constant codes -> float constant; the weight's grid is recorded."""
        code, s_v, z_v = dq.inputs[0], dq.inputs[1], dq.inputs[2] if len(dq.inputs) > 2 else None
        scale, zp = const_array(s_v), const_array(z_v) if z_v is not None else None
        if scale is None or (z_v is not None and zp is None):
            return f"{label(dq)}: scale or zero point of constant codes is not constant"
        axis = dq.attributes.get_int("axis", 1)
        axis = axis + codes.ndim if axis < 0 else axis
        real = _dequantized(codes, scale, zp, axis)
        out = dq.outputs[0]
        name = self.fresh(f"{code.name}_float" if code.name else "weight_float")
        value = ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(real.shape),
                         const_value=ir.tensor(real, name=name))  # fmt: skip
        self.graph.register_initializer(value)
        replace_value(out, value)
        if code.dtype != ir.DataType.INT32:
            grid = grid_from_arrays(scale, zp, int(code.dtype), axis)
            if grid is not None:
                self.out.weights[value.name] = grid
        return None

    def relu(self, anchor: ir.Node, x: ir.Value, key: int) -> ir.Value:
        if key not in self.relu_of:
            y = ir.Value(name=self.fresh(f"{x.name}_relu"), type=x.type, shape=x.shape)
            self.graph.insert_before(
                anchor, ir.node("Relu", [x], outputs=[y], name=self.fresh(f"{x.name}_Relu"))
            )
            self.relu_of[key] = y
            self.out.relus.append(y.name)
        return self.relu_of[key]

    def activation(self, dq: ir.Node, q: ir.Node) -> str | None:
        """DQ(Q(x)) -> x (or Relu(x) when the grid holds only values >= 0); x's grid is recorded."""
        x = q.inputs[0]
        scale = const_array(q.inputs[1])
        zp = const_array(q.inputs[2]) if len(q.inputs) > 2 and q.inputs[2] is not None else None
        grid = None
        if scale is not None and (zp is not None or len(q.inputs) < 3 or q.inputs[2] is None):
            grid = grid_from_arrays(scale, zp, int(_code_type(q)), q.attributes.get_int("axis", 1))
        if grid is None:
            self.out.notes.append(
                f"{label(q)}: grid not constant or not an integer type; its range is calibrated"
            )
        elif grid.per_channel:
            self.out.notes.append(f"{label(q)}: per-channel activation grid; its range is calibrated")
            grid = None
        target = x
        if grid is not None and grid.real_range()[0] == 0.0 and not _nonneg(x):
            target = self.relu(dq, x, id(q))
        replace_value(dq.outputs[0], target)
        if grid is not None:
            old = self.out.activations.get(target.name)
            if old is not None and old.real_range() != grid.real_range():
                lo = min(old.real_range()[0], grid.real_range()[0])
                self.out.notes.append(f"tensor {target.name!r}: two source grids; the wider is kept")
                grid = old if old.real_range()[0] == lo else grid
            self.out.activations[target.name] = grid
        return None

    def run(self) -> None:
        for node in list(self.graph):
            if node.graph is None or node.op_type != "DequantizeLinear" or node.domain not in QDQ_DOMAINS:
                continue
            code = node.inputs[0]
            codes = const_array(code)
            producer = code.producer()
            if codes is not None:
                why = self.constant(node, codes)
            elif producer is not None and producer.op_type == "QuantizeLinear":
                why = self.activation(node, producer)
            elif producer is not None and self._code_chain(producer) is not None:
                why = self.moved_codes(node, producer)
            elif (
                producer is not None
                and producer.op_type == "Gather"
                and const_array(producer.inputs[0]) is not None
            ):
                why = self.gathered_constant(node, producer)
            elif producer is not None and producer.op_type == "DynamicQuantizeLinear":
                x = producer.inputs[0]
                replace_value(node.outputs[0], x)
                if x.name not in self.out.dynamic:
                    self.out.dynamic.append(x.name)
                why = None
            else:
                why = (
                    f"{label(node)}: dequantizes codes from {code.name!r} (a graph input or another op); kept"
                )
            if why is not None:
                self.out.notes.append(why)
                continue
            inputs = list(node.inputs)
            self.graph.remove(node, safe=True)
            self._drop_unused(inputs)

    def gathered_constant(self, dq: ir.Node, gather: ir.Node) -> str | None:
        """DQ(Gather(C, i)) with constant codes C (ORT's quantized embedding tables) -> Gather(float C, i):
        rows are selected from the dequantized table, whose grid the Gather output keeps."""
        table, s_v = gather.inputs[0], dq.inputs[1]
        z_v = dq.inputs[2] if len(dq.inputs) > 2 else None
        codes, scale = const_array(table), const_array(s_v)
        zp = const_array(z_v) if z_v is not None else None
        if scale is None or scale.size != 1 or (z_v is not None and zp is None):
            return f"{label(dq)}: a gathered table whose grid is not one constant scale; kept"
        real = _dequantized(codes, scale, zp, 0)
        name = self.fresh(f"{table.name}_float" if table.name else "table_float")
        value = ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(real.shape),
                         const_value=ir.tensor(real, name=name))  # fmt: skip
        self.graph.register_initializer(value)
        y = ir.Value(name=self.fresh(f"{gather.outputs[0].name}_float"))
        twin = ir.Node(gather.domain, gather.op_type, [value, *gather.inputs[1:]], list(gather.attributes.values()),
                       outputs=[y], name=self.fresh(f"{gather.name or 'Gather'}_float"))  # fmt: skip
        self.graph.insert_before(dq, twin)
        replace_value(dq.outputs[0], y)
        grid = grid_from_arrays(scale, zp, int(table.dtype), None)
        if grid is not None:  # the gathered rows are codes of the table's grid
            self.out.activations.setdefault(y.name, grid)
        return None

    def _code_chain(self, node: ir.Node) -> ir.Node | None:
        """The QuantizeLinear at the start of a chain of code-moving ops ending at ``node``, else None."""
        for _ in range(16):
            if node.op_type == "QuantizeLinear":
                return node
            if node.op_type not in _MOVES_CODES or not node.inputs or node.inputs[0] is None:
                return None
            if node.op_type == "Pad" and len(node.inputs) > 2 and node.inputs[2] is not None:
                return None  # a constant pad code would need its float value
            node = node.inputs[0].producer()
            if node is None:
                return None
        return None

    def float_twin(self, anchor: ir.Node, node: ir.Node) -> ir.Value:
        """The float value ``node``'s codes stand for: the same op applied to the float input."""
        if node.op_type == "QuantizeLinear":
            return node.inputs[0]
        x = self.float_twin(anchor, node.inputs[0].producer())
        out = ir.Value(name=self.fresh(f"{node.outputs[0].name}_float"))
        twin = ir.Node(node.domain, node.op_type, [x, *node.inputs[1:]], list(node.attributes.values()),
                       outputs=[out], name=self.fresh(f"{node.name or node.op_type}_float"))  # fmt: skip
        self.graph.insert_before(anchor, twin)
        return out

    def moved_codes(self, dq: ir.Node, producer: ir.Node) -> str | None:
        """DQ(op(...Q(x))) for ops that only move or select codes: op applied to x, with Q's grid."""
        q = self._code_chain(producer)
        assert q is not None
        scale = const_array(q.inputs[1])
        zp = const_array(q.inputs[2]) if len(q.inputs) > 2 and q.inputs[2] is not None else None
        if scale is None or scale.size != 1:
            return f"{label(dq)}: codes moved from a quantizer whose grid is not one constant scale; kept"
        y = self.float_twin(dq, producer)
        replace_value(dq.outputs[0], y)
        grid = grid_from_arrays(scale, zp, int(_code_type(q)), None)
        if grid is not None:  # the quantized tensor and what the moved codes stand for share the grid
            self.out.activations.setdefault(y.name, grid)
            self.out.activations.setdefault(q.inputs[0].name, grid)
        return None

    def _keep_grid(self, value: ir.Value, quantizer: ir.Node) -> None:
        """Record the grid of a quantizer that stays (graph-input DQ, graph-output Q) for ``value``."""
        scale = const_array(quantizer.inputs[1])
        z_v = quantizer.inputs[2] if len(quantizer.inputs) > 2 else None
        zp = const_array(z_v) if z_v is not None else None
        codes = quantizer.inputs[0] if quantizer.op_type == "DequantizeLinear" else quantizer.outputs[0]
        code_type = z_v.dtype if z_v is not None and z_v.dtype is not None else codes.dtype
        if scale is None or scale.size != 1 or (z_v is not None and zp is None) or code_type is None:
            return
        grid = grid_from_arrays(scale, zp, int(code_type), None)
        if grid is not None and value.name not in self.out.activations:
            self.out.activations[value.name] = grid

    def finish(self) -> None:
        """Quantizers writing graph outputs stay; their float input keeps the grid."""
        for node in self.graph:
            if node.op_type == "QuantizeLinear" and node.outputs[0].is_graph_output():
                self._keep_grid(node.inputs[0], node)

    def _drop_unused(self, values: list[ir.Value | None]) -> None:
        prune(values)
        for v in values:
            p = v.producer() if v is not None else None
            if (p is None or p.graph is None or p.op_type not in ("QuantizeLinear", "DynamicQuantizeLinear")
                    or any(o.uses() or o.is_graph_output() for o in p.outputs)):  # fmt: skip
                continue
            inputs = list(p.inputs)
            self.graph.remove(p, safe=True)
            prune(inputs)


def import_prequantized(model: ir.Model) -> ImportedModel | None:
    """Rewrite a pre-quantized ``model`` in place into float weights + grids; None for a float model."""
    form = quantized_form(model)
    if form is None:
        return None
    imported = ImportedModel(form)
    source_names = {n.name for n in model.graph if n.name}
    if form == "fixneuron":  # power-of-two com.zonnx quantizers: the same grids as ONNX QDQ
        from zonnx.quantization.prequant.vitis import vitis_to_qdq

        imported.rewrites.update(vitis_to_qdq(model))
    if form in ("dynamic", "qoperator"):
        _to_qdq(model, imported)
    importer = _Importer(model, imported)
    importer.run()
    importer.finish()
    refuse_duplicate_layers(model, imported.weights, imported.relus, source_names)  # float + quantized copies
    from zonnx.passes.catalog import make_pass

    make_pass("dead-code")(model)  # code-moving ops whose codes nobody reads any more
    logger.info(
        "imported a %s model: %d activation grid(s), %d weight grid(s), %d dynamic tensor(s), %d ReLU(s) made explicit",
        form, len(imported.activations), len(imported.weights), len(imported.dynamic), len(imported.relus),
    )  # fmt: skip
    return imported
