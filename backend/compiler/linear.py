"""Shared compile step of the weight ops (``conv``, ``matmul``): operands, folded bias and requantization.

For ``acc = sum(q_x * q_w) + b'`` with weights ``w`` (output-channel scales ``S_w``)::

    b_acc = round_half_even(B / (S_x S_w alpha))   (= the int32 bias codes when S_b == S_x S_w)
    b'    = b_acc - Z_x * sum(q_w)                  per output channel
    M / 2^shift ~= S_x S_w alpha / S_y * mul        (``params.multipliers``)

then channels whose output is constant are folded (``channels.fold_constant_channels``). The op modules
(``zonnx.backend.ops.conv`` / ``matmul``) read their attributes and weight layout and call
``linear_params``.
"""

from __future__ import annotations

__all__ = ["linear_operands", "linear_params"]

import logging
from typing import Any

import numpy as np

from zonnx.backend.targets import Target

from .channels import fold_constant_channels
from .params import QParams, multipliers
from .values import Codes, CompileError, Const

logger = logging.getLogger(__name__)


def linear_operands(p: Any) -> tuple[Codes, Const, tuple[np.ndarray, QParams | None] | None]:
    """(activation codes, quantized constant weights, bias or None) of a pending Conv/Gemm/MatMul."""
    node, op = p.node, p.node.op_type
    x, w = p.ins[0], p.ins[1]
    if not isinstance(x, Codes) or not isinstance(w, Const) or w.qp is None:
        raise CompileError(
            f"node {node.name!r}: {op} needs quantized activations and quantized constant weights."
        )
    b = p.ins[2] if len(p.ins) > 2 else None
    if b is None:
        return x, w, None
    if not isinstance(b, Const):
        raise CompileError("the bias of a Conv/Gemm must be a constant.")
    return x, w, (np.asarray(b.value), b.qp)


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


def _storage(w: np.ndarray) -> np.ndarray:
    for dt in (np.int8, np.int16, np.int32):
        if w.size == 0 or (w.min() >= np.iinfo(dt).min and w.max() <= np.iinfo(dt).max):
            return w.astype(dt)
    return w.astype(np.int64)


def linear_params(
    node: Any,
    kind: str,
    w_int: np.ndarray,
    sw: np.ndarray,
    alpha: float,
    beta: float,
    xq: QParams,
    bias: Any,
    sy: float,
    mul: float,
    target: Target,
) -> dict[str, np.ndarray]:
    """{w, bias, multiplier, shift} of a weight op (module docstring); ``w_int`` centred, (O, ...) for
    ``conv`` and (K, N) for ``matmul``; ``sw`` the per-output-channel weight scales."""
    sx, zx = xq.per_tensor(f"node {node.name!r} input")
    n_out = sw.shape[0]
    s_acc = sx * sw * alpha
    b_acc = _bias_acc(bias, s_acc, n_out, beta)
    m, s = multipliers(s_acc / sy * mul, target, node.name)
    w_oc = w_int if kind == "conv" else w_int.T  # output-channel-major
    reach = np.abs(w_oc).reshape(n_out, -1).sum(axis=1) * max(abs(xq.qmin - zx), abs(xq.qmax - zx))
    m, s = np.broadcast_to(m, (n_out,)), np.broadcast_to(s, (n_out,))
    w_oc, b_acc, m, s = fold_constant_channels(w_oc, b_acc, m, s, reach, target.quant.requant.round_mode)
    w_int = w_oc if kind == "conv" else w_oc.T
    wsum = w_oc.reshape(n_out, -1).sum(axis=1)
    return {
        "w": _storage(w_int),
        "bias": (b_acc - zx * wsum).astype(np.int64),
        "multiplier": np.broadcast_to(m, (n_out,)).astype(np.int64),
        "shift": np.broadcast_to(s, (n_out,)).astype(np.int64),
    }
