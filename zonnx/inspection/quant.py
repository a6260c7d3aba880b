"""How a model is quantized: QDQ, QOperator, FixNeuron/custom or mixed, with dtypes and scale granularity.

Rules:

- **QDQ**: QuantizeLinear/DequantizeLinear (default or com.microsoft domain) in pairs (a DQ fed by a Q),
  or DQ nodes on constant weights; Q/DQ nodes alone also count when nothing else explains them.
- **QOperator**: integer ops (``QLinear*``, ``ConvInteger``, ``MatMulInteger``, ``DynamicQuantizeLinear``,
  com.microsoft ``QGemm``/``QAttention``/``MatMulNBits``/...). The Q/DQ nodes at their boundaries
  belong to this format.
- **FixNeuron/custom**: ``FixNeuron``, ``VitisQuantizeLinear`` or ``VitisDequantizeLinear`` in any
  non-standard domain, and ops of a zonnx domain (``com.zonnx``...) whose type mentions Quant or Fix.
- Several of these at once: **mixed**; none: **none**.

Granularity is read from scale shapes (Q/DQ input 1, QLinearConv/QLinearMatMul weight scale input 4):
one element is per-tensor, a 1-D scale is per-channel, a ``block_size`` attribute or a scale of rank
2 or more is per-block. FixNeuron has one power-of-two position: per-tensor.
"""

from __future__ import annotations

__all__ = ["QDQ", "QOPERATOR", "CUSTOM", "Quantization", "detect_quantization"]

import dataclasses
import logging
import math
import re
from collections import Counter
from collections.abc import Mapping

import onnx

from zonnx.inspection.shapes import ValueType, dtype_name, iter_nodes, op_key

logger = logging.getLogger(__name__)

QDQ = "QDQ"
QOPERATOR = "QOperator"
CUSTOM = "FixNeuron/custom"

_STD_DOMAINS = ("", "ai.onnx", "com.microsoft")
_QOPERATOR_OPS = frozenset(
    {
        "ConvInteger",
        "MatMulInteger",
        "DynamicQuantizeLinear",
        "QGemm",
        "QAttention",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
        "DynamicQuantizeLSTM",
        "QEmbedLayerNormalization",
        "MatMulNBits",
    }
)
_CUSTOM_OPS = frozenset({"FixNeuron", "VitisQuantizeLinear", "VitisDequantizeLinear"})
_ZONNX_QUANT = re.compile("quant|fix", re.IGNORECASE)
_T = onnx.TensorProto
#: Element types that hold quantized codes (int32 biases and int64 indices are left out).
_CODE_TYPES = frozenset(
    {
        _T.INT8, _T.UINT8, _T.INT16, _T.UINT16, _T.INT4, _T.UINT4, _T.INT2, _T.UINT2,
        _T.FLOAT8E4M3FN, _T.FLOAT8E4M3FNUZ, _T.FLOAT8E5M2, _T.FLOAT8E5M2FNUZ, _T.FLOAT4E2M1,
    }
)  # fmt: skip
#: Weight-scale input of QOperator ops that have one (QLinearConv w_scale, QLinearMatMul b_scale).
_WEIGHT_SCALE = {"QLinearConv": 4, "QLinearMatMul": 4}


@dataclasses.dataclass
class Quantization:
    """How the model is quantized.

    ``format`` is 'none', 'QDQ', 'QOperator', 'FixNeuron/custom' or 'mixed' (then ``formats`` lists
    the parts); ``dtypes`` are the code types seen (int8, uint8, int16, int4...), split into
    ``weight_dtypes`` (constants) and ``activation_dtypes``; ``per_*`` count scales by granularity;
    ``ops`` is the histogram of the quantization-related ops.
    """

    format: str = "none"
    formats: list[str] = dataclasses.field(default_factory=list)
    dtypes: list[str] = dataclasses.field(default_factory=list)
    weight_dtypes: list[str] = dataclasses.field(default_factory=list)
    activation_dtypes: list[str] = dataclasses.field(default_factory=list)
    quantize_nodes: int = 0
    dequantize_nodes: int = 0
    qdq_pairs: int = 0
    qoperator_nodes: int = 0
    custom_nodes: int = 0
    per_tensor: int = 0
    per_channel: int = 0
    per_block: int = 0
    granularity_unknown: int = 0
    ops: dict[str, int] = dataclasses.field(default_factory=dict)


def _is_qdq(node: onnx.NodeProto, op: str) -> bool:
    return node.op_type == op and node.domain in _STD_DOMAINS


def _is_qoperator(node: onnx.NodeProto) -> bool:
    return node.domain in _STD_DOMAINS and (
        node.op_type.startswith("QLinear") or node.op_type in _QOPERATOR_OPS
    )


def _is_custom(node: onnx.NodeProto) -> bool:
    if node.domain in _STD_DOMAINS:
        return False
    return node.op_type in _CUSTOM_OPS or (
        "zonnx" in node.domain.lower() and bool(_ZONNX_QUANT.search(node.op_type))
    )


def _attr_int(node: onnx.NodeProto, *names: str) -> int | None:
    for a in node.attribute:
        if a.name in names and a.type == onnx.AttributeProto.INT:
            return a.i
    return None


def _elem(name: str, types: Mapping[str, ValueType]) -> int:
    vt = types.get(name)
    return vt.elem_type if vt is not None and vt.elem_type > 0 else 0


class _Scan:
    """Accumulates one detection; ``seen`` records (dtype, is_weight) pairs."""

    def __init__(self, types: Mapping[str, ValueType], consts: set[str]) -> None:
        self.types, self.consts = types, consts
        self.q = Quantization()
        self.seen: set[tuple[str, bool]] = set()

    def code(self, elem_type: int, is_weight: bool) -> None:
        if elem_type in _CODE_TYPES:
            self.seen.add((dtype_name(elem_type), is_weight))

    def scale(self, node: onnx.NodeProto, index: int) -> None:
        if (_attr_int(node, "block_size") or 0) > 0:
            self.q.per_block += 1
            return
        vt = self.types.get(node.input[index]) if len(node.input) > index else None
        if vt is None or vt.dims is None or not all(isinstance(d, int) for d in vt.dims):
            self.q.granularity_unknown += 1
        elif math.prod(vt.dims) <= 1:  # type: ignore[arg-type]
            self.q.per_tensor += 1
        elif len(vt.dims) == 1:
            self.q.per_channel += 1
        else:
            self.q.per_block += 1


def detect_quantization(
    model: onnx.ModelProto, types: Mapping[str, ValueType], consts: set[str]
) -> Quantization:
    """Classify ``model``'s quantization by the module's rules; ``types`` come from shape inference."""
    scan = _Scan(types, consts)
    q = scan.q
    nodes = [n for n, _ in iter_nodes(model.graph)]
    producer = {o: n for n in nodes for o in n.output if o}
    ops: Counter[str] = Counter()
    qdq_style = 0
    for node in nodes:
        if _is_qdq(node, "QuantizeLinear"):
            q.quantize_nodes += 1
            out = _elem(node.output[0], types) or _attr_int(node, "output_dtype") or 0
            if not out:
                out = _elem(node.input[2], types) if len(node.input) > 2 and node.input[2] else _T.UINT8
            scan.code(out, node.input[0] in consts)
            scan.scale(node, 1)
        elif _is_qdq(node, "DequantizeLinear"):
            q.dequantize_nodes += 1
            src = producer.get(node.input[0])
            if src is not None and _is_qdq(src, "QuantizeLinear"):
                q.qdq_pairs += 1
                qdq_style += 1
            elif node.input[0] in consts:
                qdq_style += 1
            scan.code(_elem(node.input[0], types), node.input[0] in consts)
            scan.scale(node, 1)
        elif _is_qoperator(node):
            q.qoperator_nodes += 1
            for name in node.input:
                if name:
                    scan.code(_elem(name, types), name in consts)
            for name in node.output:
                if name:
                    scan.code(_elem(name, types), False)
            bits = _attr_int(node, "bits")
            if node.op_type == "MatMulNBits" and bits:
                scan.seen.add((f"uint{bits}", True))
            if node.op_type in _WEIGHT_SCALE:
                scan.scale(node, _WEIGHT_SCALE[node.op_type])
        elif _is_custom(node):
            q.custom_nodes += 1
            bits = _attr_int(node, "bit_width", "bitwidth", "bits")
            if bits:
                scan.seen.add((f"int{bits}", node.input[0] in consts))
            elif len(node.input) > 2 and node.input[2]:
                scan.code(_elem(node.input[2], types), node.input[0] in consts)
            if node.op_type == "FixNeuron" or len(node.input) < 2:
                q.per_tensor += 1
            else:
                scan.scale(node, 1)
        else:
            continue
        ops[op_key(node)] += 1
    if qdq_style or (q.quantize_nodes + q.dequantize_nodes and not q.qoperator_nodes and not q.custom_nodes):
        q.formats.append(QDQ)
    if q.qoperator_nodes:
        q.formats.append(QOPERATOR)
    if q.custom_nodes:
        q.formats.append(CUSTOM)
    q.format = "none" if not q.formats else q.formats[0] if len(q.formats) == 1 else "mixed"
    q.dtypes = sorted({d for d, _ in scan.seen})
    q.weight_dtypes = sorted({d for d, w in scan.seen if w})
    q.activation_dtypes = sorted({d for d, w in scan.seen if not w})
    q.ops = dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))
    logger.info("quantization: %s %s", q.format, q.dtypes)
    return q
