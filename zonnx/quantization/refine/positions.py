"""Read and write the position (scale = 2^-pos) or the scale of every quantized tensor, whatever the form.

A *quantizer* is the group of nodes that fake-quantizes one tensor, in one of five forms:

==============  ===============================================================  ====================
form            nodes                                                            parameters
==============  ===============================================================  ====================
``fixneuron``   ``com.zonnx`` FixNeuron(x)                                       attribute ``pos``
``vitis_qdq``   VitisQuantizeLinear(x) -> one or more VitisDequantizeLinear      ``pos`` on each node
``vitis_dq``    VitisDequantizeLinear(stored integer codes)                      ``pos``; codes
``qdq``         QuantizeLinear(x, s, zp) -> one or more DequantizeLinear         scale/zp inputs
``dq``          DequantizeLinear(stored integer codes, s, zp)                    scale/zp; codes
==============  ===============================================================  ====================

A *site* is one tensor with every quantizer on it (nearly always one); an op reads the site of an
input through the quantizer that produced the value, and writes the site whose quantizers read its
output. Rules work on sites only, so they never care about the form. One source of truth: a power-of-two
position is ``pos`` (QDQ scales are exactly ``2^-pos`` with zero point 0); writing a position sets the
``pos`` attributes or the scale initializers to ``2^-pos``; stored codes (``dq``, ``vitis_dq``) are
requantized from the old grid, ``round_half_even(q * s_old / s_new)`` clipped to the code range. A scale
or zero-point initializer shared with another site is never changed in place: the site gets its own.
"""

from __future__ import annotations

__all__ = [
    "Quantizer",
    "Site",
    "QuantGraph",
    "pos_of_scale",
    "POS_RANGE",
    "INT_RANGES",
    "REFINE_MARK",
    "is_refine_node",
]

import dataclasses
import logging
import math
from collections.abc import Collection

import numpy as np
import onnx_ir as ir

from zonnx.custom_ops import ZONNX_DOMAIN
from zonnx.passes.fusion.matching import const_array, label

logger = logging.getLogger(__name__)

#: Positions the zonnx ops accept (2^pos and 2^-pos finite float32 numbers).
POS_RANGE = (-127, 126)
#: Metadata key marking nodes a refinement pass inserted (e.g. the avgpool factor Mul).
REFINE_MARK = "zonnx.refine"
_Q = {
    ("", "QuantizeLinear"): "qdq",
    ("ai.onnx", "QuantizeLinear"): "qdq",
    (ZONNX_DOMAIN, "VitisQuantizeLinear"): "vitis_qdq",
}
_DQ = {"qdq": ("DequantizeLinear", ("", "ai.onnx")), "vitis_qdq": ("VitisDequantizeLinear", (ZONNX_DOMAIN,))}
#: Code range of each integer element type.
INT_RANGES = {
    ir.DataType.INT8: (-128, 127),
    ir.DataType.UINT8: (0, 255),
    ir.DataType.INT16: (-32768, 32767),
    ir.DataType.UINT16: (0, 65535),
    ir.DataType.INT32: (-(2**31), 2**31 - 1),
    ir.DataType.INT4: (-8, 7),
    ir.DataType.UINT4: (0, 15),
}


def is_refine_node(node: ir.Node) -> bool:
    """Whether a refinement pass inserted ``node`` (it is transparent to position lookups)."""
    return REFINE_MARK in node.metadata_props


def pos_of_scale(scale: float) -> int | None:
    """``p`` when ``scale`` is exactly the float32 number 2^-p (p in POS_RANGE), else None."""
    value = float(scale)
    if not math.isfinite(value) or value <= 0:
        return None
    mantissa, exponent = math.frexp(value)
    pos = 1 - exponent
    return pos if mantissa == 0.5 and POS_RANGE[0] <= pos <= POS_RANGE[1] else None


def _is(node: ir.Node, op: str, domains: Collection[str]) -> bool:
    return node.op_type == op and node.domain in domains


@dataclasses.dataclass(eq=False)
class Quantizer:
    """The nodes fake-quantizing one tensor; ``source`` is the float tensor (or the stored codes)."""

    form: str
    nodes: tuple[ir.Node, ...]
    source: ir.Value
    outputs: tuple[ir.Value, ...]
    locked: str | None = None  # why it cannot be rewritten (its integer codes have other readers)

    @property
    def stored(self) -> bool:
        return self.form in ("dq", "vitis_dq")

    def _attr_pos(self) -> int | str:
        values = {n.attributes.get_int("pos") for n in self.nodes}
        if None in values:
            return "a node has no pos attribute"
        return values.pop() if len(values) == 1 else f"its nodes disagree on pos ({sorted(values)})"

    def _const(self, index: int) -> np.ndarray | None | str:
        arrays = []
        for n in self.nodes:
            if len(n.inputs) <= index or n.inputs[index] is None:
                arrays.append(None)
                continue
            arr = const_array(n.inputs[index])
            if arr is None:
                return f"input {index} of {label(n)} is not a constant"
            arrays.append(arr)
        first = arrays[0]
        if any(
            (a is None) != (first is None) or (a is not None and not np.array_equal(a, first)) for a in arrays
        ):
            return "its nodes disagree on the scale or zero point"
        return first

    def params(self) -> tuple[float, int, int, int] | str:
        """(scale, zero_point, qmin, qmax) of a per-tensor quantizer, or why it has none."""
        if self.form in ("fixneuron", "vitis_qdq", "vitis_dq"):
            pos = self._attr_pos()
            if isinstance(pos, str):
                return pos
            attrs = self.nodes[0].attributes
            bits, signed, narrow = (
                attrs.get_int("bit_width", 8),
                attrs.get_int("signed", 1),
                attrs.get_int("narrow", 0),
            )
            qmin, qmax = (
                (-(1 << (bits - 1)) + narrow, (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
            )
            return float(2.0**-pos), 0, qmin, qmax
        scale, zp = self._const(1), self._const(2)
        for item in (scale, zp):
            if isinstance(item, str):
                return item
        if scale is None:
            return "it has no scale"
        if scale.size != 1:
            return f"it is per-channel ({scale.size} scales)"
        # The code type: the stored codes' (dq), else the zero point's, else QuantizeLinear's default uint8.
        dtype = ir.DataType.from_numpy(zp.dtype) if zp is not None else ir.DataType.UINT8
        if self.form == "dq":
            dtype = self.source.dtype or dtype
        qmin, qmax = INT_RANGES.get(dtype, (-128, 127))
        return float(scale.reshape(())), int(zp.reshape(())) if zp is not None else 0, qmin, qmax


@dataclasses.dataclass(eq=False)
class Site:
    """One quantized tensor and every quantizer on it."""

    tensor: ir.Value
    quantizers: list[Quantizer]

    @property
    def name(self) -> str:
        return self.tensor.name or "?"

    @property
    def const(self) -> bool:
        """A weight or bias: the quantized tensor is a constant (float initializer or stored codes)."""
        return self.quantizers[0].stored or const_array(self.tensor) is not None

    def params(self) -> tuple[float, int, int, int] | str:
        """(scale, zero_point, qmin, qmax) shared by all quantizers, or why there is none."""
        found: list[tuple[float, int, int, int]] = []
        for q in self.quantizers:
            item = q.params()
            if isinstance(item, str):
                return item
            found.append(item)
        if len(set(found)) != 1:
            return f"its {len(found)} quantizers disagree ({found})"
        return found[0]

    def problem(self, power_of_two: bool) -> str | None:
        """Why this site cannot be read and rewritten (None when it can)."""
        locked = next((q.locked for q in self.quantizers if q.locked), None)
        if locked:
            return f"tensor {self.name!r}: {locked}"
        params = self.params()
        if isinstance(params, str):
            return f"tensor {self.name!r}: {params}"
        if power_of_two and (pos_of_scale(params[0]) is None or params[1] != 0):
            return (
                f"tensor {self.name!r}: scale {params[0]:.6g} (zero point {params[1]}) is not a power of two; "
                "quantize with a power-of-two method for this target"
            )
        return None

    @property
    def pos(self) -> int | None:
        params = self.params()
        return None if isinstance(params, str) or params[1] != 0 else pos_of_scale(params[0])

    def require_pos(self) -> int:
        """The position of a site ``problem(power_of_two=True)`` accepted."""
        pos = self.pos
        if pos is None:
            raise ValueError(f"tensor {self.name!r} has no power-of-two position")
        return pos


class QuantGraph:
    """Index of the quantizers of a model's main graph, with position/scale readers and writers."""

    def __init__(self, model: ir.Model) -> None:
        self.graph = model.graph
        self._by_source: dict[ir.Value, Site] = {}
        self._by_output: dict[ir.Value, Site] = {}
        self._names: set[str] | None = None
        taken: set[ir.Node] = set()
        for node in self.graph:
            if node in taken:
                continue
            quantizer = self._quantizer(node)
            if quantizer is None:
                continue
            taken.update(quantizer.nodes)
            site = self._by_source.setdefault(quantizer.source, Site(quantizer.source, []))
            site.quantizers.append(quantizer)
            for out in quantizer.outputs:
                self._by_output[out] = site

    @staticmethod
    def _quantizer(node: ir.Node) -> Quantizer | None:
        if _is(node, "FixNeuron", (ZONNX_DOMAIN,)):
            return Quantizer("fixneuron", (node,), node.inputs[0], (node.outputs[0],))
        form = _Q.get((node.domain, node.op_type))
        if form is not None:
            op, domains = _DQ[form]
            codes = node.outputs[0]
            dqs = [u.node for u in codes.uses() if _is(u.node, op, domains) and u.idx == 0]
            if not dqs:
                return None
            others = [u.node for u in codes.uses() if u.node not in dqs]
            locked = None
            if others:
                locked = f"its integer codes are also read by {label(others[0])}"
            elif codes.is_graph_output():
                locked = f"its integer codes are the graph output {codes.name!r}"
            return Quantizer(form, (node, *dqs), node.inputs[0], tuple(d.outputs[0] for d in dqs), locked)
        for form, (op, domains) in _DQ.items():
            if _is(node, op, domains):
                source = node.inputs[0]
                producer = source.producer() if source is not None else None
                if producer is not None and _Q.get((producer.domain, producer.op_type)) == form:
                    return None  # the Q of a pair: found from the Q
                stored = "dq" if form == "qdq" else "vitis_dq"
                locked = (
                    None
                    if const_array(source) is not None
                    else f"its codes come from {source.name!r}, not a constant"
                )
                return Quantizer(stored, (node,), source, (node.outputs[0],), locked)
        return None

    # ------------------------------------------------------------------------------------ lookups

    def sites(self) -> list[Site]:
        return list(self._by_source.values())

    def site(self, tensor: ir.Value) -> Site | None:
        """The site of a (float) tensor, by the tensor the quantizers read."""
        return self._by_source.get(tensor)

    def input_site(self, value: ir.Value | None) -> Site | None:
        """The site an op input comes from: ``value`` is the output of one of its quantizers."""
        return None if value is None else self._by_output.get(value)

    def output_site(self, value: ir.Value, through: Collection[str] = ()) -> Site | None:
        """The site quantizing an op output, looking through single-consumer ops in ``through`` (fused
        activations) and nodes a refinement pass inserted."""
        for _ in range(16):
            site = self._by_source.get(value)
            if site is not None:
                return site
            consumers = value.consumers()
            if len(consumers) != 1 or value.is_graph_output():
                return None
            node = consumers[0]
            if len(node.outputs) != 1 or not (node.op_type in through or is_refine_node(node)):
                return None
            value = node.outputs[0]
        return None

    # ------------------------------------------------------------------------------------ writers

    def set_pos(self, site: Site, pos: int) -> bool:
        """Give ``site`` the position ``pos`` (clamped to POS_RANGE); return whether anything changed."""
        pos = int(min(max(pos, POS_RANGE[0]), POS_RANGE[1]))
        if site.pos == pos:
            return False
        for q in site.quantizers:
            if q.form in ("fixneuron", "vitis_qdq", "vitis_dq"):
                old = q.nodes[0].attributes.get_int("pos")
                if q.form == "vitis_dq":
                    self._requantize(q, float(2.0**-old), 0, float(2.0**-pos), 0)
                for node in q.nodes:
                    node.attributes["pos"] = ir.AttrInt64("pos", pos)
            else:
                self._write_scale(site, q, float(2.0**-pos), 0)
        logger.debug("tensor %s: pos -> %d", site.name, pos)
        return True

    def set_scale(self, site: Site, scale: float, zero_point: int) -> bool:
        """Give a QDQ site the scale and zero point (power-of-two forms take ``set_pos``)."""
        params = site.params()
        if isinstance(params, str):
            raise ValueError(f"tensor {site.name}: {params}")
        if np.float32(params[0]) == np.float32(scale) and params[1] == zero_point:
            return False
        pos = pos_of_scale(scale)
        for q in site.quantizers:
            if q.form in ("fixneuron", "vitis_qdq", "vitis_dq"):
                if pos is None or zero_point != 0:
                    raise ValueError(
                        f"tensor {site.name}: {q.form} holds powers of two only, not scale {scale}"
                    )
                return self.set_pos(site, pos)
            self._write_scale(site, q, scale, zero_point)
        return True

    def _write_scale(self, site: Site, q: Quantizer, scale: float, zero_point: int) -> None:
        params = q.params()
        assert not isinstance(params, str)
        old_scale, old_zp = params[0], params[1]
        if q.stored:
            self._requantize(q, old_scale, old_zp, scale, zero_point)
        self._replace_const(
            site, q, 1, np.asarray(scale, np.float32).reshape(np.shape(const_array(q.nodes[0].inputs[1])))
        )
        zp_value = q.nodes[0].inputs[2] if len(q.nodes[0].inputs) > 2 else None
        if zp_value is not None and zero_point != old_zp:
            old = const_array(zp_value)
            self._replace_const(site, q, 2, np.asarray(zero_point, old.dtype).reshape(old.shape))

    def _requantize(self, q: Quantizer, old_scale: float, old_zp: int, scale: float, zero_point: int) -> None:
        """New stored codes for a new scale: round_half_even((q - zp) * s_old / s_new) + zp', clipped."""
        params = q.params()
        assert not isinstance(params, str)
        codes = const_array(q.source)
        real = (codes.astype(np.float64) - old_zp) * old_scale
        new = np.clip(np.rint(real / scale) + zero_point, params[2], params[3]).astype(codes.dtype)
        self._replace_input(q, 0, q.source, new, f"{q.source.name}_requantized")

    def _replace_const(self, site: Site, q: Quantizer, index: int, array: np.ndarray) -> None:
        old = q.nodes[0].inputs[index]
        self._replace_input(q, index, old, array, f"{site.name}_{'scale' if index == 1 else 'zero_point'}")

    def _replace_input(self, q: Quantizer, index: int, old: ir.Value, array: np.ndarray, base: str) -> None:
        """Set a constant input of q's nodes: in place when only q reads it, else as a new initializer."""
        readers = {u.node for u in old.uses()}
        if (
            old.is_initializer()
            and readers <= set(q.nodes)
            and not old.is_graph_input()
            and not old.is_graph_output()
        ):
            old.const_value = ir.tensor(array, name=old.name)
            return
        name = self.unique_name(base)
        new = ir.Value(
            name=name,
            shape=ir.Shape(array.shape),
            type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
            const_value=ir.tensor(array, name=name),
        )
        self.graph.register_initializer(new)
        for node in q.nodes:
            if len(node.inputs) > index and node.inputs[index] is old:
                node.replace_input_with(index, new)
        if q.source is old:
            q.source = new

    def unique_name(self, base: str) -> str:
        """A value name not used in the graph yet, starting from ``base``."""
        if self._names is None:
            self._names = {v.name for v in self.graph.inputs} | set(self.graph.initializers)
            self._names |= {v.name for n in self.graph for v in n.outputs} | {
                n.name for n in self.graph if n.name
            }
        name, i = base, 1
        while name in self._names:
            name, i = f"{base}_{i}", i + 1
        self._names.add(name)
        return name
