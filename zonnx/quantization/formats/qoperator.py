"""QDQ -> QOperator: rewrite ``DQ -> float op -> Q`` groups into ONNX Runtime's integer operators.

A *group* is a float op whose quantized inputs are DequantizeLinear outputs and whose output
(through at most one fused Relu/Clip) is read only by QuantizeLinear nodes sharing one set of
parameters. The op becomes its integer counterpart reading the DQ inputs' codes and writing the Q
output's codes; Q/DQ/Constant nodes and initializers left unused are removed afterwards.

- Integer ops (ORT 1.31 CPU kernels): Conv -> QLinearConv, MatMul -> QLinearMatMul; in domain
  com.microsoft (version 1): Gemm -> QGemm and Add, Mul, AveragePool, GlobalAveragePool
  (channels_last=0), Concat, Sigmoid, LeakyRelu, Softmax, Where -> QLinear<op>. Kernel type rule:
  uint8 activations take uint8 or int8 weights, int8 activations int8 weights.
- Bias: QLinearConv adds the int32 B to the accumulator, so B is at scale s_x*s_w; QGemm scales
  (acc + C) by alpha*s_a*s_b, so C is at alpha*s_a*s_b (beta folded in). The codes are reused when
  the bias DQ scale equals that float32 product (as ORT's quantizer writes it), else re-quantized
  as round(beta * DQ(B) / (alpha*s_x*s_w)) in float64.
- Relu/Clip, fused or alone between equal parameters: Q is monotone, so Q(clip(x, lo, hi)) =
  clip(Q(x), Q(lo), Q(hi)) (Relu: lo = 0). A bound with Q(lo) <= qmin or Q(hi) >= qmax is the
  saturation already and is dropped (a Relu whose zero point is qmin costs nothing); a remaining
  bound is a Clip on the codes. With symmetric activations (``float_activations``) a Relu/Clip of
  its own stays float between DQ and Q, as ORT writes it.
- Latent ops (MaxPool, Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Identity, Resize nearest,
  Slice, Gather, Split, Pad): with equal input and output parameters Q(f(DQ(q))) = f(q), because f
  only moves or selects values (max commutes with a monotone map), so f runs on the codes; Pad's
  constant value v becomes the code Q(v).
- Anything else stays DQ -> op -> Q; graph inputs/outputs stay float. Against the QDQ graph the
  kernels differ by rounding only (float32 requantization multipliers, QLinearSoftmax's exp table).
  QLinearSoftmax multiplies by floor(1/y_scale), 254 for float32(1/255): it gets a y_scale a few
  ULP smaller whose reciprocal floors to 255 (the output codes keep the original scale).
"""

from __future__ import annotations

__all__ = ["QOperatorCounts", "qdq_to_qoperator", "INTEGER_OPS", "LATENT_OPS"]

import logging
from collections import Counter

import numpy as np
import onnx_ir as ir

from zonnx.ir.io import default_opset
from zonnx.quantization.formats.common import ValueIndex, add_initializer, ensure_opset
from zonnx.quantization.formats.qoperator_params import (
    INT8_CODES,
    QParams,
    const_value,
    dequantized,
    qdq_params,
    softmax_y_scale,
)

logger = logging.getLogger(__name__)

MS = "com.microsoft"
_MS_OPS = ("Add", "Mul", "AveragePool", "GlobalAveragePool", "Concat", "Sigmoid", "LeakyRelu", "Softmax",
           "Where")  # fmt: skip
#: float op -> (integer op, domain).
INTEGER_OPS: dict[str, tuple[str, str]] = {
    "Conv": ("QLinearConv", ""),
    "MatMul": ("QLinearMatMul", ""),
    "Gemm": ("QGemm", MS),
    **{op: (f"QLinear{op}", MS) for op in _MS_OPS},
}
#: op run on codes when input and output parameters match -> lowest opset whose ORT kernel takes 8 bits.
LATENT_OPS: dict[str, int] = {
    **dict.fromkeys(("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity"), 1),
    **dict.fromkeys(("Slice", "Gather", "Split", "Relu", "Clip"), 1),
    **{"MaxPool": 12, "Resize": 11, "Pad": 11},
}
_ACTS = ("Relu", "Clip")
_PLUMBING = ("QuantizeLinear", "DequantizeLinear", "Constant")
_Bounds = tuple[int | None, int | None]


class QOperatorCounts(Counter[str]):
    """Counts of what was created (``QLinearConv``, ``MaxPool on codes``, ``dropped Relu``, ...);
    ``misses`` holds one "node (Op): reason" line per group left as DQ -> op -> Q."""

    def __init__(self) -> None:
        super().__init__()
        self.misses: list[str] = []


class _Converter:
    """One conversion run over a model's main graph."""

    def __init__(self, model: ir.Model, float_activations: bool = False) -> None:
        self.model, self.graph = model, model.graph
        self.float_activations = float_activations
        self.opset = default_opset(model)
        self.index = ValueIndex(self.graph)
        self.counts = QOperatorCounts()
        self.created: set[ir.Value] = set()

    def init(self, base: str, array: np.ndarray, dtype: ir.DataType | None = None) -> ir.Value:
        return add_initializer(self.graph, self.index, base, array, dtype)

    def zp(self, qp: QParams, shape: tuple[int, ...] | None = None) -> ir.Value:
        """The zero-point value (a new initializer when the Q/DQ had none or a reshape is needed)."""
        if qp.zp_v is not None and shape is None:
            return qp.zp_v
        arr = qp.zp.astype(INT8_CODES[qp.dtype][2]).reshape(shape if shape is not None else qp.scale.shape)
        return self.init(f"{qp.scale_v.name}_zp", arr, qp.dtype)

    def codes_value(self, like: ir.Value, dtype: ir.DataType, suffix: str = "_quantized") -> ir.Value:
        name = self.index.unique(like.name + suffix)
        value = ir.Value(name=name, type=ir.TensorType(dtype), shape=like.shape)
        self.created.add(value)
        return value

    def miss(self, node: ir.Node, reason: str) -> None:
        self.counts.misses.append(f"{node.name or node.outputs[0].name} ({node.op_type}): {reason}")

    @staticmethod
    def output_q(value: ir.Value) -> tuple[list[ir.Node], QParams] | str:
        """The Q nodes reading ``value`` (all of its uses) and their shared parameters."""
        uses = value.uses()
        qs = [u.node for u in uses if u.node.op_type == "QuantizeLinear" and u.idx == 0]
        if value.is_graph_output() or not qs or len(qs) != len(uses):
            return f"output {value.name} is not read only by QuantizeLinear"
        params = [qdq_params(q) for q in qs]
        if any(p is None or not p.same(params[0]) for p in params) or not params[0].per_tensor:
            return f"output {value.name}: its QuantizeLinear parameters differ or are per-channel"
        if params[0].dtype not in INT8_CODES:
            return f"output {value.name} is {params[0].dtype.name}; the integer ops take 8-bit codes"
        return qs, params[0]

    @staticmethod
    def acts(node: ir.Node, which: tuple[int, ...]) -> list[tuple[ir.Node, QParams]] | str:
        """DQ producers of the given inputs, each per-tensor 8-bit, else a reason."""
        found = []
        for i in which:
            f = dequantized(node.inputs[i]) if i < len(node.inputs) else None
            if f is None:
                return f"input {i} is not a DequantizeLinear output with constant parameters"
            if not f[1].per_tensor or f[1].dtype not in INT8_CODES:
                return f"input {i} ({node.inputs[i].name}) is not per-tensor 8-bit"
            found.append(f)
        return found

    def clip_bounds(self, act: ir.Node, qp: QParams) -> _Bounds | str:
        """Code bounds (Q(lo), Q(hi)) of a Relu/Clip at ``qp``; None where saturation already clips."""
        lo, hi = 0.0, None
        if act.op_type == "Clip" and self.opset < 11:
            lo, hi = act.attributes.get_float("min", None), act.attributes.get_float("max", None)
        elif act.op_type == "Clip":
            given = [*act.inputs[1:3], None, None][:2]
            arrays = [const_value(v) for v in given]
            if any(v is not None and a is None for v, a in zip(given, arrays, strict=True)):
                return f"{act.name}: Clip bounds are not constant"
            lo, hi = (None if a is None else float(a) for a in arrays)
        qmin, qmax, _ = INT8_CODES[qp.dtype]
        qlo = None if lo is None or qp.quantize(lo) <= qmin else qp.quantize(lo)
        qhi = None if hi is None or qp.quantize(hi) >= qmax else qp.quantize(hi)
        if (qlo is not None or qhi is not None) and self.opset < 12:
            return f"{act.name}: a Clip on int8/uint8 codes needs opset 12 (model has {self.opset})"
        return qlo, qhi

    def apply_clip(self, codes: ir.Value, act: ir.Node, bounds: _Bounds, qp: QParams) -> ir.Value:
        """clip(codes, *bounds) as a Clip node after the codes' producer; ``codes`` when both are None."""
        if bounds == (None, None):
            self.counts[f"dropped {act.op_type}"] += 1
            return codes
        name, np_type = act.name or act.outputs[0].name, INT8_CODES[qp.dtype][2]
        limits = [
            None if b is None else self.init(f"{name}_{k}", np.asarray(b, np_type), qp.dtype)
            for k, b in zip(("min", "max"), bounds, strict=True)
        ]
        out = self.codes_value(act.outputs[0], qp.dtype, "_codes")
        clip = ir.node("Clip", [codes, *limits], outputs=[out], name=self.index.unique(f"{name}_quant"))
        if codes.producer() is not None:
            self.graph.insert_after(codes.producer(), clip)
        else:
            self.graph.insert_before(next(iter(self.graph)), clip)
        self.counts["Clip on codes"] += 1
        return out

    def finish(self, qs: list[ir.Node], codes: ir.Value) -> None:
        """Make every reader of the Q outputs read ``codes`` (named like the first Q output); the Qs go."""
        keep = qs[0].outputs[0].name
        for q in qs:
            out = q.outputs[0]
            if out.is_graph_output():
                self.graph.outputs[:] = [codes if o is out else o for o in self.graph.outputs]
            out.replace_all_uses_with(codes)
            self.graph.remove(q, safe=True)
            out.name = None
        if codes in self.created:
            codes.name = keep

    def convert(self, node: ir.Node) -> None:
        """Rewrite the group around ``node`` or record why not."""
        values, act = list(node.outputs), None
        uses = values[0].uses()
        if (
            len(values) == 1
            and node.op_type not in _ACTS
            and len(uses) == 1
            and not values[0].is_graph_output()
        ):
            user = next(iter(uses)).node
            if user.op_type in _ACTS and user.domain in ("", "ai.onnx") and user.inputs[0] is values[0]:
                act, values = user, list(user.outputs)
        found = [self.output_q(v) for v in values]
        reason = next((f for f in found if isinstance(f, str)), None)
        if reason is not None:
            if node.op_type in INTEGER_OPS or node.op_type in LATENT_OPS:
                self.miss(node, reason)
            return
        out = found[0][1]
        bounds = self.clip_bounds(act, out) if act is not None else (None, None)
        if isinstance(bounds, str):
            return self.miss(node, bounds)
        if node.op_type in LATENT_OPS:
            result = self.latent(node, [f[1] for f in found])
        elif node.op_type in INTEGER_OPS:
            result = self.integer(node, out)
        else:
            result = "ORT has no integer kernel for this op"
        if isinstance(result, str):
            return self.miss(node, result)
        if act is not None:
            result = [self.apply_clip(result[0], act, bounds, out)]
        for (qs, _), codes in zip(found, result, strict=True):
            self.finish(qs, codes)
        for done in (act, node):
            if done is not None and not any(v.uses() for v in done.outputs):
                self.graph.remove(done, safe=True)

    def latent(self, node: ir.Node, outs: list[QParams]) -> list[ir.Value] | str:
        """``node`` re-created on the codes (the rule in the module docstring)."""
        op = node.op_type
        if self.opset < LATENT_OPS[op]:
            return f"ORT runs {op} on int8/uint8 from opset {LATENT_OPS[op]} (model has {self.opset})"
        found = self.acts(node, (0,))
        if isinstance(found, str):
            return found
        (dq, qp), out = found[0], outs[0]
        if not all(qp.same(o) for o in outs):
            return "input and output quantization parameters differ"
        if any(dequantized(v) is not None for v in node.inputs[1:]):
            return "only input 0 may be quantized"
        if op in _ACTS and self.float_activations:
            return "symmetric activations: a Relu/Clip of its own runs in float between DQ and Q (ORT's rule)"
        if op in _ACTS:
            bounds = self.clip_bounds(node, out)
            return bounds if isinstance(bounds, str) else [self.apply_clip(dq.inputs[0], node, bounds, out)]
        if op == "Resize" and node.attributes.get_string("mode", "nearest") != "nearest":
            return "only nearest Resize selects values; other modes interpolate"
        extra = list(node.inputs[1:])
        if op == "Pad" and node.attributes.get_string("mode", "constant") == "constant":
            given = extra[1] if len(extra) > 1 else None
            v = const_value(given) if given is not None else np.zeros(())
            if v is None:
                return "Pad constant value is not constant"
            code = np.asarray(out.quantize(float(v)), INT8_CODES[out.dtype][2])
            extra = [extra[0], self.init(f"{node.name or 'Pad'}_pad_code", code, out.dtype), *extra[2:]]
        codes = [self.codes_value(v, out.dtype) for v in node.outputs]
        new = ir.node(op, [dq.inputs[0], *extra], dict(node.attributes), outputs=codes, name=node.name)
        self.graph.insert_after(node, new)
        self.counts[f"{op} on codes"] += 1
        return codes

    def integer(self, node: ir.Node, out: QParams) -> list[ir.Value] | str:
        """The integer op for ``node`` (INTEGER_OPS) with its inputs in the kernel's order."""
        op, attrs = node.op_type, dict(node.attributes)
        if op == "AveragePool" and "dilations" in attrs:
            return "QLinearAveragePool has no dilations attribute"
        y = [out.scale_v, self.zp(out)]
        if op == "Softmax":
            y_scale = softmax_y_scale(out.scale.ravel()[0])
            top = int(out.zp.ravel()[0]) + int(np.floor(np.float32(1) / y_scale))
            if top > INT8_CODES[out.dtype][1]:
                return f"QLinearSoftmax would write zero point + floor(1/y_scale) = {top}, past the maximum"
            if y_scale != out.scale.ravel()[0]:
                y[0] = self.init(f"{out.scale_v.name}_softmax", y_scale)
            attrs.setdefault("axis", 1 if self.opset < 13 else -1)
            attrs["opset"] = self.opset
        if op == "LeakyRelu":
            attrs.setdefault("alpha", 0.01)
        if op == "GlobalAveragePool":
            attrs["channels_last"] = 0
        which = (
            (0, 1)
            if op in ("Add", "Mul")
            else (1, 2)
            if op == "Where"
            else tuple(range(len(node.inputs)))
            if op == "Concat"
            else (0,)
        )
        found = self.acts(node, which)
        if isinstance(found, str):
            return found
        if any(qp.dtype != out.dtype for _, qp in found):
            return "input and output types differ; ORT's kernels need one 8-bit type"
        w, bias = [], []
        if op in ("Conv", "MatMul", "Gemm"):
            weights = self.weights(node, found[0][1])
            if isinstance(weights, str):
                return weights
            w, bias = weights
            attrs.pop("beta", None)
        xs = [v for dq, qp in found for v in (dq.inputs[0], qp.scale_v, self.zp(qp))]
        inputs = {"Conv": xs + w + y + bias, "Concat": y + xs, "Where": [node.inputs[0], *xs, *y]}.get(
            op, xs + w + bias + y
        )
        qop, domain = INTEGER_OPS[op]
        codes = self.codes_value(node.outputs[0], out.dtype)
        name = self.index.unique(f"{node.name or codes.name}_quant")
        self.graph.insert_after(node, ir.node(qop, inputs, attrs, domain=domain, outputs=[codes], name=name))
        if domain == MS:
            ensure_opset(self.model, MS, 1)
        self.counts[qop] += 1
        return [codes]

    def weights(self, node: ir.Node, x: QParams) -> tuple[list, list] | str:
        """Weight (codes, scale, zero point) and bias list of QLinearConv, QLinearMatMul or QGemm."""
        op = node.op_type
        found = dequantized(node.inputs[1])
        if found is None:
            return "input 1 is not a DequantizeLinear output with constant parameters"
        wdq, w = found
        if w.dtype not in INT8_CODES or (x.dtype == ir.DataType.INT8 and w.dtype != ir.DataType.INT8):
            return f"{x.dtype.name} activations with {w.dtype.name} weights have no ORT kernel"
        scale, zp = w.scale_v, self.zp(w)
        if not w.per_tensor:
            if op == "Conv" and (w.axis != 0 or len(np.unique(w.zp)) > 1):
                return "QLinearConv needs per-channel weights on axis 0 with one zero point"
            if op == "Gemm" and w.axis % 2 != (0 if node.attributes.get_int("transB", 0) else 1):
                return f"per-channel weight axis {w.axis} is not QGemm's column axis"
            if op == "MatMul":
                if wdq.inputs[0].shape is None or len(wdq.inputs[0].shape) != 2 or w.axis % 2 != 1:
                    return "QLinearMatMul takes per-column scales of a 2-D B only"
                scale = self.init(f"{w.scale_v.name}_row", w.scale.reshape(1, -1))
                zp = self.zp(w, (1, w.scale.size))
        bias: list[ir.Value | None] = [None] if op == "Gemm" else []
        if op in ("Conv", "Gemm") and len(node.inputs) > 2 and node.inputs[2] is not None:
            b = self.bias(node, x, w)
            if isinstance(b, str):
                return b
            bias = [b]
        return [wdq.inputs[0], scale, zp], bias

    def bias(self, node: ir.Node, x: QParams, w: QParams) -> ir.Value | str:
        """Int32 bias at alpha * s_x * s_w (see the module docstring)."""
        alpha = node.attributes.get_float("alpha", 1.0) if node.op_type == "Gemm" else 1.0
        beta = node.attributes.get_float("beta", 1.0) if node.op_type == "Gemm" else 1.0
        want = (x.scale.ravel()[0] * w.scale.ravel() * np.float32(alpha)).astype(np.float32)
        found = dequantized(node.inputs[2])
        if found is not None:
            bdq, b = found
            codes = const_value(bdq.inputs[0])
            if codes is None or b.dtype != ir.DataType.INT32 or np.any(b.zp != 0):
                return "bias is not constant int32 codes with zero point 0"
            if beta == 1.0 and np.array_equal(np.broadcast_to(b.scale.ravel(), want.shape), want):
                return bdq.inputs[0]
            floats = codes.astype(np.float64) * b.scale.astype(np.float64).reshape(-1)
        else:
            floats = const_value(node.inputs[2])
            if floats is None:
                return "bias is neither quantized nor constant"
        q = np.clip(np.rint(beta * floats.astype(np.float64) / want.astype(np.float64)), -(2**31), 2**31 - 1)
        self.counts["re-quantized bias"] += 1
        return self.init(f"{node.inputs[2].name}_int32", q.astype(np.int32), ir.DataType.INT32)

    def cleanup(self) -> None:
        """Remove Q/DQ/Constant nodes and initializers nothing reads any more (to a fixed point)."""

        def unused(n: ir.Node) -> bool:
            return n.op_type in _PLUMBING and not any(v.uses() or v.is_graph_output() for v in n.outputs)

        while dead := [n for n in self.graph if unused(n)]:
            self.graph.remove(dead, safe=True)
        inputs = set(self.graph.inputs)
        for name, v in list(self.graph.initializers.items()):
            if not v.uses() and not v.is_graph_output() and v not in inputs:
                self.graph.initializers.pop(name)


def qdq_to_qoperator(model: ir.Model, *, float_activations: bool = False) -> QOperatorCounts:
    """Rewrite every convertible QDQ group of ``model`` in place into ONNX Runtime integer operators.

    ``float_activations``: a Relu/Clip that is not fused into the op before it stays ``DQ -> op -> Q``
    even between equal parameters (ORT's QOperator rule when activations are symmetric).

    Returns the created op types counted (a Counter, so ``counts.update(...)`` merges it) with
    ``misses``: why each remaining group stays DQ -> op -> Q. The rules are in the module docstring.
    """
    conv = _Converter(model, float_activations)
    for node in list(model.graph):
        if node.graph is None or node.op_type in _PLUMBING or node.domain not in ("", "ai.onnx"):
            continue
        if any(
            dequantized(v) is not None for v in node.inputs
        ):  # else a float op that reads no quantized tensor
            conv.convert(node)
    conv.cleanup()
    logger.info("QOperator: %s; %d groups left as DQ -> op -> Q", dict(conv.counts), len(conv.counts.misses))
    return conv.counts
