"""Integer parameters of each NPU op: tensor grids, multipliers and shifts, folded weights and biases, LUTs.

The formulas are stated in ``zonnx.backend.compiler.lower``; every real-valued quantity is computed in
float64 from the model's float32 scales (exact for power-of-two scales), every integer in int64.
"""

from __future__ import annotations

__all__ = [
    "QParams",
    "quantize_float",
    "multipliers",
    "lower_linear",
    "lower_avgpool",
    "code_op_attrs",
    "LUT_FUNCS",
    "lut_table",
]

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from zonnx.backend.targets import Target
from zonnx.custom_ops import grid
from zonnx.errors import ZonnxError

from .channels import fold_constant_channels
from .program import TensorInfo
from .requant import pof2_exponent, quantize_multiplier

logger = logging.getLogger(__name__)


def _err(msg: str) -> ZonnxError:
    from .lower import CompileError

    return CompileError(msg)


@dataclasses.dataclass
class QParams:
    """A tensor's grid: ``real = scale * (q - zp)`` (per-channel along ``axis``), codes in [qmin, qmax]."""

    scale: np.ndarray  # float64, shape () or (C,)
    zp: np.ndarray  # int64, same shape
    axis: int | None
    qmin: int
    qmax: int
    dtype: str
    round_mode: str  # rounding of the quantizer that writes this grid
    pos: int | None = None  # scale == 2^-pos (power-of-two grids)

    @classmethod
    def from_qdq(cls, scale: np.ndarray, zp: np.ndarray, axis: int) -> QParams:
        s = np.asarray(scale, dtype=np.float64)
        z = np.asarray(zp)
        info = np.iinfo(z.dtype)
        exps = {pof2_exponent(v) for v in s.reshape(-1)}
        pos = -next(iter(exps)) if len(exps) == 1 and None not in exps and s.ndim == 0 else None
        return cls(
            s,
            z.astype(np.int64),
            axis if s.ndim else None,
            int(info.min),
            int(info.max),
            str(z.dtype),
            "half_even",
            pos,
        )

    @classmethod
    def from_pos(cls, pos: int, bits: int, signed: int, narrow: int, round_mode: str) -> QParams:
        qmin, qmax = grid.qrange(bits, signed, narrow)
        dtype = np.dtype(grid.STORAGE_TYPES[grid.default_storage(bits, signed)]).name
        mode = grid.canonical_round_mode(round_mode) or "half_even"
        return cls(np.array(2.0**-pos), np.zeros((), np.int64), None, qmin, qmax, dtype, mode, pos)

    def same(self, other: QParams) -> bool:
        return (
            self.scale.shape == other.scale.shape
            and bool(np.all(self.scale == other.scale))
            and bool(np.all(self.zp == other.zp))
            and (self.qmin, self.qmax) == (other.qmin, other.qmax)
        )

    def per_tensor(self, what: str) -> tuple[float, int]:
        if self.scale.size != 1:
            raise _err(f"{what}: needs a per-tensor quantized activation.")
        return float(self.scale.reshape(-1)[0]), int(self.zp.reshape(-1)[0])

    def info(self, name: str, shape: list | None) -> TensorInfo:
        return TensorInfo(
            name,
            self.dtype,
            self.qmin,
            self.qmax,
            [float(v) for v in self.scale.reshape(-1)],
            [int(v) for v in self.zp.reshape(-1)],
            self.axis,
            shape,
        )


def _bcast(a: np.ndarray, ndim: int, axis: int | None) -> np.ndarray:
    if a.ndim == 0 or axis is None:
        return a.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return a.reshape(shape)


def quantize_float(x: np.ndarray, qp: QParams) -> np.ndarray:
    """Codes of float values as the model's quantizer computes them (FixNeuron grid or QuantizeLinear)."""
    x = np.asarray(x, dtype=np.float64)
    if qp.pos is not None and qp.zp.ndim == 0 and int(qp.zp) == 0:
        bits = int(np.log2(qp.qmax - qp.qmin + 1))
        codes = grid.code_reference(
            x,
            bit_width=bits,
            pos=qp.pos,
            signed=int(qp.qmin < 0),
            narrow=int(qp.qmin == -qp.qmax),
            round_mode=qp.round_mode,
        )
        return codes.astype(np.int64)
    s = _bcast(qp.scale, x.ndim, qp.axis).astype(np.float32)
    v = (x.astype(np.float32) / s).astype(np.float64)
    q = grid.round_reference(v, qp.round_mode) + _bcast(qp.zp, x.ndim, qp.axis)
    return np.clip(q, qp.qmin, qp.qmax).astype(np.int64)


def multipliers(
    ratios: np.ndarray, target: Target, where: str, *, eltwise: bool = False, common_shift: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Integer (M, shift) per ratio with ``M / 2^shift ~= ratio`` as the target requantizes.

    ``common_shift``: one shift for all ratios (Add). Power-of-two targets need exact powers of two.
    """
    r = np.atleast_1d(np.asarray(ratios, dtype=np.float64))
    rq = target.quant.requant
    if rq.mode == "shift":
        exps = [pof2_exponent(v) for v in r]
        if None in exps:
            raise _err(
                f"node {where!r}: target {target.name} requantizes with shifts only and needs power-of-two "
                f"scales, but a scale ratio is {r[[e is None for e in exps]][0]!r}; quantize with power-of-two scales (FixNeuron)."
            )
        ks = np.array(exps, dtype=np.int64)
        if common_shift:
            s = max(0, int(-ks.min()))
            return (np.left_shift(1, ks + s)).astype(np.int64), np.array([s], np.int64)
        return np.left_shift(1, np.maximum(ks, 0)).astype(np.int64), np.maximum(-ks, 0).astype(np.int64)
    rng = tuple(rq.shift) if rq.shift is not None else None
    if common_shift:
        _, s = quantize_multiplier(float(r.max()), rq.multiplier_bits, rng)
        m = np.array([round(v * 2.0**s) for v in r], dtype=np.int64)
        return m, np.array([s], np.int64)
    pairs = [quantize_multiplier(float(v), rq.multiplier_bits, rng) for v in r]
    if not eltwise and not rq.per_channel and len(set(pairs)) > 1:
        raise _err(
            f"node {where!r}: target {target.name} has no per-channel multipliers; quantize weights per tensor."
        )
    return np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64)


def _bias_acc(
    bias: tuple[np.ndarray, QParams | None] | None, s_acc: np.ndarray, n: int, beta: float
) -> np.ndarray:
    """The bias on the accumulator grid: ``round_half_even(B / S_acc)`` (exact codes when S_b == S_acc)."""
    if bias is None:
        return np.zeros(n, np.int64)
    value, qp = bias
    if qp is None:
        real = np.broadcast_to(np.asarray(value, np.float64).reshape(-1), (n,)) * beta
        return np.rint(real / s_acc).astype(np.int64)
    codes = np.broadcast_to(np.asarray(value, np.int64).reshape(-1) - qp.zp.reshape(-1), (n,))
    ratio = np.broadcast_to(qp.scale.reshape(-1), (n,)) * beta / s_acc
    if np.all(ratio == 1.0):
        return codes.astype(np.int64)
    return np.rint(codes * ratio).astype(np.int64)


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _storage(w: np.ndarray) -> np.ndarray:
    for dt in (np.int8, np.int16, np.int32):
        if w.size == 0 or (w.min() >= np.iinfo(dt).min and w.max() <= np.iinfo(dt).max):
            return w.astype(dt)
    return w.astype(np.int64)


def lower_linear(
    node: onnx.NodeProto,
    xq: QParams,
    w: np.ndarray,
    wq: QParams,
    bias: Any,
    yq: QParams,
    mul: float,
    target: Target,
) -> tuple[str, dict, dict[str, np.ndarray]]:
    """Conv -> ("conv", attrs, {w, bias, multiplier, shift}); Gemm/MatMul -> ("matmul", ...), w as (K, N)."""
    sx, zx = xq.per_tensor(f"node {node.name!r} input")
    sy, _ = yq.per_tensor(f"node {node.name!r} output")
    a = _attrs(node)
    w = np.asarray(w, np.int64)
    if node.op_type == "Conv":
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            raise _err(
                f"node {node.name!r}: auto_pad is not supported; run the optimizer to make pads explicit."
            )
        if wq.axis not in (None, 0):
            raise _err(f"node {node.name!r}: weights must be quantized per output channel (axis 0).")
        n_out, spatial = w.shape[0], w.ndim - 2
        w_int = w - _bcast(wq.zp, w.ndim, wq.axis)
        sw = np.broadcast_to(wq.scale.reshape(-1), (n_out,))
        attrs = {
            "strides": list(a.get("strides", [1] * spatial)),
            "pads": list(a.get("pads", [0] * 2 * spatial)),
            "dilations": list(a.get("dilations", [1] * spatial)),
            "group": int(a.get("group", 1)),
            "pad_value": zx,
        }
        kind, alpha, beta = "conv", 1.0, 1.0
    else:
        alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
        if a.get("transA", 0):
            raise _err(f"node {node.name!r}: Gemm with transA=1 is not supported.")
        axis = wq.axis
        if node.op_type == "Gemm" and a.get("transB", 0):
            w, axis = w.T, (None if axis is None else 1 - axis)
        if w.ndim != 2 or axis not in (None, 1, -1):
            raise _err(f"node {node.name!r}: weights must be a 2-D constant quantized per output column.")
        n_out = w.shape[1]
        w_int = w - _bcast(wq.zp, 2, None if axis is None else 1)
        sw = np.broadcast_to(wq.scale.reshape(-1), (n_out,))
        attrs, kind = {}, "matmul"
    s_acc = sx * sw * alpha
    b_acc = _bias_acc(bias, s_acc, n_out, beta)
    m, s = multipliers(s_acc / sy * mul, target, node.name)
    w_oc = w_int if kind == "conv" else w_int.T  # output-channel-major
    reach = np.abs(w_oc).reshape(n_out, -1).sum(axis=1) * max(abs(xq.qmin - zx), abs(xq.qmax - zx))
    m, s = np.broadcast_to(m, (n_out,)), np.broadcast_to(s, (n_out,))
    w_oc, b_acc, m, s = fold_constant_channels(w_oc, b_acc, m, s, reach, target.quant.requant.round_mode)
    w_int = w_oc if kind == "conv" else w_oc.T
    wsum = w_oc.reshape(n_out, -1).sum(axis=1)
    params = {
        "w": _storage(w_int),
        "bias": (b_acc - zx * wsum).astype(np.int64),
        "multiplier": np.broadcast_to(m, (n_out,)).astype(np.int64),
        "shift": np.broadcast_to(s, (n_out,)).astype(np.int64),
    }
    return kind, attrs, params


def lower_avgpool(
    node: onnx.NodeProto, xq: QParams, yq: QParams, mul: float, shape: list | None, target: Target
) -> tuple[dict, dict[str, np.ndarray]]:
    """avgpool attrs (kernel, strides, pads or global) and {multiplier, shift} for ``S_x / (S_y n)``."""
    sx, zx = xq.per_tensor(f"node {node.name!r} input")
    sy, _ = yq.per_tensor(f"node {node.name!r} output")
    a = _attrs(node)
    if node.op_type == "GlobalAveragePool":
        if not shape or any(not isinstance(d, int) or d <= 0 for d in shape[2:]):
            raise _err(
                f"node {node.name!r}: GlobalAveragePool needs a known input shape; run shape inference."
            )
        kernel = [int(d) for d in shape[2:]]
        attrs: dict[str, Any] = {"global": 1, "kernel": kernel}
    else:
        kernel = list(a["kernel_shape"])
        pads = list(a.get("pads", [0] * 2 * len(kernel)))
        if any(pads) and not a.get("count_include_pad", 0):
            raise _err(f"node {node.name!r}: AveragePool with pads needs count_include_pad=1 on the NPU.")
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            raise _err(f"node {node.name!r}: auto_pad is not supported; make pads explicit.")
        attrs = {
            "global": 0,
            "kernel": kernel,
            "strides": list(a.get("strides", [1] * len(kernel))),
            "pads": pads,
            "ceil_mode": int(a.get("ceil_mode", 0)),
        }
    attrs["zp_in"] = zx
    area = math.prod(kernel)
    factor = target.quant.avgpool.factor(*kernel) if target.quant.avgpool and len(kernel) == 2 else None
    if factor is not None and xq.pos is not None and yq.pos is not None:
        k, n = factor
        if not math.isclose(mul, 1.0) and not math.isclose(mul, area * k / 2.0**n, rel_tol=1e-6):
            raise _err(f"node {node.name!r}: a Mul by {mul} after the pool cannot be folded.")
        s = n + xq.pos - yq.pos
        m = k << max(0, -s)
        return attrs, {"multiplier": np.array([m], np.int64), "shift": np.array([max(s, 0)], np.int64)}
    m, s = multipliers(np.array([sx / (sy * area) * mul]), target, node.name, eltwise=True)
    return attrs, {"multiplier": m, "shift": s}


def code_op_attrs(node: onnx.NodeProto, consts: list[np.ndarray | None]) -> tuple[str, dict[str, Any]]:
    """(kind, attrs) of an op that moves or selects codes without changing their grid."""
    op, a = node.op_type, _attrs(node)
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise _err(f"node {node.name!r}: auto_pad is not supported; make pads explicit.")
    if op == "MaxPool":
        k = list(a["kernel_shape"])
        return "maxpool", {
            "global": 0,
            "kernel": k,
            "strides": list(a.get("strides", [1] * len(k))),
            "pads": list(a.get("pads", [0] * 2 * len(k))),
            "dilations": list(a.get("dilations", [1] * len(k))),
            "ceil_mode": int(a.get("ceil_mode", 0)),
        }
    if op == "GlobalMaxPool":
        return "maxpool", {"global": 1}
    if op == "Identity":
        return "copy", {}
    if op == "Reshape":
        if len(consts) < 2 or consts[1] is None:
            raise _err(f"node {node.name!r}: Reshape needs a constant shape.")
        return "reshape", {"shape": [int(v) for v in consts[1]], "allowzero": int(a.get("allowzero", 0))}
    if op == "Flatten":
        return "flatten", {"axis": int(a.get("axis", 1))}
    if op == "Transpose":
        return "transpose", {"perm": [int(v) for v in a["perm"]] if "perm" in a else None}
    if op in ("Squeeze", "Unsqueeze"):
        axes = a.get("axes")
        if axes is None and len(consts) > 1 and consts[1] is not None:
            axes = consts[1]
        return op.lower(), {"axes": None if axes is None else [int(v) for v in np.asarray(axes).reshape(-1)]}
    if op == "Resize":
        mode = a.get("mode", b"nearest")
        if (mode.decode() if isinstance(mode, bytes) else mode) != "nearest":
            raise _err(f"node {node.name!r}: only nearest Resize runs on codes (mode {mode!r}).")
        scales = consts[2] if len(consts) > 2 else (consts[1] if len(consts) == 2 else None)
        sizes = consts[3] if len(consts) > 3 else None
        dec = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in a.items()}
        return "resize_nearest", {
            "scales": None if scales is None or np.size(scales) == 0 else [float(v) for v in scales],
            "sizes": None if sizes is None or np.size(sizes) == 0 else [int(v) for v in sizes],
            "ctm": dec.get("coordinate_transformation_mode", "half_pixel"),
            "nearest_mode": dec.get("nearest_mode", "round_prefer_floor"),
        }
    raise _err(f"node {node.name!r}: {op} is not a code op.")


def _gelu(x: np.ndarray, a: dict) -> np.ndarray:
    if a.get("approximate", b"none") in (b"tanh", "tanh"):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + _erf(x / np.sqrt(2.0)))


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


#: One-variable ops computed by a lookup table: f(x float64, attrs) -> float64.
LUT_FUNCS: dict[str, Callable[[np.ndarray, dict], np.ndarray]] = {
    "Sigmoid": lambda x, a: 1.0 / (1.0 + np.exp(-x)),
    "Tanh": lambda x, a: np.tanh(x),
    "HardSigmoid": lambda x, a: np.clip(a.get("alpha", 0.2) * x + a.get("beta", 0.5), 0, 1),
    "HardSwish": lambda x, a: x * np.clip(x / 6.0 + 0.5, 0, 1),
    "LeakyRelu": lambda x, a: np.where(x >= 0, x, a.get("alpha", 0.01) * x),
    "Elu": lambda x, a: np.where(x >= 0, x, a.get("alpha", 1.0) * np.expm1(x)),
    "Softplus": lambda x, a: np.logaddexp(0.0, x),
    "Exp": lambda x, a: np.exp(x),
    "Erf": lambda x, a: _erf(x),
    "Gelu": _gelu,
}


def lut_table(node: onnx.NodeProto, xq: QParams, yq: QParams, acts: list, mul: float) -> np.ndarray:
    """``table[q - qmin_x] = Q_y(clip(f(S_x (q - Z_x)) * mul))`` for every input code q."""
    sx, zx = xq.per_tensor(f"node {node.name!r} input")
    if xq.qmax - xq.qmin > 1 << 16:
        raise _err(f"node {node.name!r}: a lookup table needs inputs of at most 16 bits.")
    q = np.arange(xq.qmin, xq.qmax + 1, dtype=np.int64)
    x = np.float32(sx) * (q - zx).astype(np.float32)  # the float32 DequantizeLinear value
    with np.errstate(over="ignore"):
        y = LUT_FUNCS[node.op_type](x.astype(np.float64), _attrs(node)) * mul
    for _, lo, hi in acts:
        y = np.clip(y, lo, hi)
    return quantize_float(y.astype(np.float32), yq).astype(np.dtype(yq.dtype))
