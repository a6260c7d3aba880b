"""The numpy reference executor of an NPU ``Program``: every op's integer formula in int64, independent of ORT.

Op kinds and their formulas (``R(v, M, s) = rshift_round(v * M, s, round_mode)``, clamps to [lo, hi]):

- ``conv``: ``acc = conv(pad(q_x, pad_value), w) + bias``; ``q_y = clamp(R(acc, M[oc], s[oc]) + zp_out)``
- ``matmul``: ``acc = q_x @ w + bias`` (w is K x N); requantized per column like conv
- ``add``: ``q_y = clamp(rshift_round(M_a (q_a - zp_a) + M_b (q_b - zp_b), s) + zp_out)`` (broadcasting)
- ``rescale``: ``q_y = clamp(R(q_x - zp_in, M, s) + zp_out)``
- ``avgpool``: ``q_y = clamp(R(sum_window(q_x - zp_in), M, s) + zp_out)`` (pads contribute 0)
- ``maxpool`` (pads read ``pad_value``), ``clamp``, ``concat`` (then clamp), ``reshape``, ``flatten``,
  ``transpose``, ``squeeze``, ``unsqueeze``, ``copy``, ``resize_nearest`` (ONNX index rules): on codes
- ``lut``: ``q_y = table[q_x - qmin_in]``
- ``mul``, ``lincomb``, ``matmul2``, ``slice``, ``gather``, ``pad``: see ``reference_extra``

Convolution and matmul products are taken in float64 BLAS when ``K * max|x| * max|w| + max|bias| < 2^53``
(every partial sum is then an exactly representable integer, so the result is the exact integer sum),
else in int64. Public API: ``run_program``, ``execute_op``.
"""

from __future__ import annotations

__all__ = ["run_program", "execute_op", "ReferenceError"]

import logging
import math
from collections.abc import Callable, Mapping

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from zonnx.backend.compiler.program import Op, Program
from zonnx.backend.compiler.requant import requantize, requantize_op, rshift_round
from zonnx.errors import ZonnxError

from . import reference_extra

logger = logging.getLogger(__name__)
_EXACT = float(1 << 53)


class ReferenceError(ZonnxError):
    """Bad inputs for a program (missing, not integer, wrong range) or an op the executor does not know."""


def _matmul_exact(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact integer ``a @ b`` (int64), through float64 BLAS when no partial sum can exceed 2^53."""
    k = a.shape[-1]
    bound = k * float(np.max(np.abs(a), initial=0)) * float(np.max(np.abs(b), initial=0))
    if bound < _EXACT:
        return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.int64)
    return np.matmul(a.astype(np.int64), b.astype(np.int64))


def _pad_nchw(x: np.ndarray, pads: list[int], value: int) -> np.ndarray:
    n = len(pads) // 2
    width = [(0, 0)] * (x.ndim - n) + [(pads[i], pads[i + n]) for i in range(n)]
    return np.pad(x, width, constant_values=value)


def _windows(xp: np.ndarray, kernel: list[int], strides: list[int], dilations: list[int]) -> np.ndarray:
    """(N, C, oh, ow, kh, kw) views of a padded NCHW tensor."""
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    win = sliding_window_view(xp, eff, axis=(2, 3))
    return win[:, :, :: strides[0], :: strides[1], :: dilations[0], :: dilations[1]]


def _ceil_pads(
    shape: tuple, kernel: list, strides: list, pads: list, dilations: list, ceil: int
) -> list[int]:
    """Pads with extra end padding so ceil_mode windows exist (they read only pad values past the input)."""
    if not ceil:
        return pads
    out = list(pads)
    for i, (k, s, d) in enumerate(zip(kernel, strides, dilations, strict=True)):
        size = shape[2 + i] + pads[i] + pads[i + 2]
        eff = (k - 1) * d + 1
        n_out = math.ceil((size - eff) / s) + 1
        if (n_out - 1) * s >= shape[2 + i] + pads[i]:
            n_out -= 1
        out[i + 2] += max(0, (n_out - 1) * s + eff - size)
    return out


def _conv(x: np.ndarray, op: Op) -> np.ndarray:
    a, w = op.attrs, op.params["w"].astype(np.int64)
    if x.ndim != 4:
        raise ReferenceError(
            f"op {op.name!r}: the reference runs 2-D convolutions only (input rank {x.ndim})."
        )
    xp = _pad_nchw(x, a["pads"], a["pad_value"])
    win = _windows(xp, list(w.shape[2:]), a["strides"], a["dilations"])
    n, _, oh, ow = win.shape[:4]
    o, cg, kh, kw = w.shape
    g = a["group"]
    if g == 1:
        cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, cg * kh * kw)
        acc = _matmul_exact(cols, w.reshape(o, -1).T).reshape(n, oh, ow, o).transpose(0, 3, 1, 2)
    else:
        wg = w.reshape(g, o // g, cg, kh, kw).astype(np.float64)
        xg = win.reshape(n, g, cg, oh, ow, kh, kw).astype(np.float64)
        if cg * kh * kw * float(np.abs(xg).max(initial=0)) * float(np.abs(wg).max(initial=0)) >= _EXACT:
            raise ReferenceError(f"op {op.name!r}: grouped convolution sums may exceed 2^53.")
        acc = np.einsum("ngcxyij,gocij->ngoxy", xg, wg, optimize=True).reshape(n, o, oh, ow).astype(np.int64)
    acc = acc + op.params["bias"].reshape(1, -1, 1, 1)
    m, s = op.params["multiplier"].reshape(-1, 1, 1), op.params["shift"].reshape(-1, 1, 1)
    return requantize(acc, m, s, a["round_mode"], zero_point=a["zp_out"], lo=a["lo"], hi=a["hi"])


def _matmul(x: np.ndarray, op: Op) -> np.ndarray:
    a = op.attrs
    acc = _matmul_exact(x, op.params["w"]) + op.params["bias"]
    return requantize(
        acc,
        op.params["multiplier"],
        op.params["shift"],
        a["round_mode"],
        zero_point=a["zp_out"],
        lo=a["lo"],
        hi=a["hi"],
    )


def _add(qa: np.ndarray, qb: np.ndarray, op: Op) -> np.ndarray:
    a, m = op.attrs, op.params["multiplier"]
    acc = int(m[0]) * (qa - a["zp_a"]) + int(m[1]) * (qb - a["zp_b"])
    return np.clip(
        rshift_round(acc, int(op.params["shift"][0]), a["round_mode"]) + a["zp_out"], a["lo"], a["hi"]
    )


def _rescale(x: np.ndarray, op: Op) -> np.ndarray:
    return requantize_op(x - op.attrs["zp_in"], op)


def _pool(x: np.ndarray, op: Op, pad_value: int) -> np.ndarray:
    """Window views (N, C, oh, ow, kh*kw) of a pool op, or the whole spatial extent when global."""
    a = op.attrs
    if a.get("global"):
        return x.reshape(*x.shape[:2], 1, 1, -1)
    k = a["kernel"]
    dil = a.get("dilations", [1] * len(k))
    pads = _ceil_pads(x.shape, k, a["strides"], a["pads"], dil, a.get("ceil_mode", 0))
    win = _windows(_pad_nchw(x, pads, pad_value), k, a["strides"], dil)
    return win.reshape(*win.shape[:4], -1)


def _avgpool(x: np.ndarray, op: Op) -> np.ndarray:
    return requantize_op(_pool(x - op.attrs["zp_in"], op, 0).sum(axis=-1), op)


def _reshape(x: np.ndarray, op: Op) -> np.ndarray:
    shape = list(op.attrs["shape"])
    if not op.attrs.get("allowzero"):
        shape = [x.shape[i] if v == 0 else v for i, v in enumerate(shape)]
    return x.reshape(shape)


def _resize_nearest(x: np.ndarray, op: Op) -> np.ndarray:
    a = op.attrs
    out = x
    for ax in range(x.ndim):
        n_in = x.shape[ax]
        if a["sizes"] is not None:
            n_out = a["sizes"][ax]
            scale = n_out / n_in
        else:
            scale = a["scales"][ax]
            n_out = int(math.floor(n_in * scale))
        if n_out == n_in and scale == 1.0:
            continue
        i = np.arange(n_out, dtype=np.float64)
        ctm = a["ctm"]
        if ctm == "asymmetric":
            c = i / scale
        elif ctm == "align_corners":
            c = i * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros_like(i)
        elif ctm == "tf_half_pixel_for_nn":
            c = (i + 0.5) / scale
        elif ctm == "pytorch_half_pixel" and n_out == 1:
            c = np.zeros_like(i)
        else:  # half_pixel, pytorch_half_pixel
            c = (i + 0.5) / scale - 0.5
        mode = a["nearest_mode"]
        idx = {
            "round_prefer_floor": lambda v: np.ceil(v - 0.5),
            "round_prefer_ceil": lambda v: np.floor(v + 0.5),
            "floor": np.floor,
            "ceil": np.ceil,
        }[mode](c)
        out = np.take(out, np.clip(idx, 0, n_in - 1).astype(np.int64), axis=ax)
    return out


def _squeeze(x: np.ndarray, op: Op) -> np.ndarray:
    axes = op.attrs["axes"]
    return np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(axes))


def _unsqueeze(x: np.ndarray, op: Op) -> np.ndarray:
    axes = sorted(v % (x.ndim + len(op.attrs["axes"])) for v in op.attrs["axes"])
    for ax in axes:
        x = np.expand_dims(x, ax)
    return x


_UNARY: dict[str, Callable[[np.ndarray, Op], np.ndarray]] = {
    "conv": _conv,
    "matmul": _matmul,
    "rescale": _rescale,
    "avgpool": _avgpool,
    "maxpool": lambda x, op: _pool(x, op, op.attrs.get("pad_value", np.iinfo(np.int64).min)).max(axis=-1),
    "clamp": lambda x, op: np.clip(x, op.attrs["lo"], op.attrs["hi"]),
    "copy": lambda x, op: x.copy(),
    "reshape": _reshape,
    "flatten": lambda x, op: x.reshape(math.prod(x.shape[: op.attrs["axis"]]), -1),
    "transpose": lambda x, op: np.transpose(x, op.attrs["perm"]),
    "squeeze": _squeeze,
    "unsqueeze": _unsqueeze,
    "resize_nearest": _resize_nearest,
    "lut": lambda x, op: op.params["table"].astype(np.int64)[x - op.attrs["qmin_in"]],
}


def execute_op(op: Op, args: list[np.ndarray]) -> np.ndarray:
    """One op on int64 inputs; returns its int64 output."""
    if op.kind in reference_extra.KINDS:
        return reference_extra.execute(op, args)
    if op.kind == "add":
        return _add(args[0], args[1], op)
    if op.kind == "concat":
        return np.clip(np.concatenate(args, axis=op.attrs["axis"]), op.attrs["lo"], op.attrs["hi"])
    fn = _UNARY.get(op.kind)
    if fn is None:
        raise ReferenceError(f"op {op.name!r}: unknown op kind {op.kind!r}; the program needs a newer zonnx.")
    return np.asarray(fn(args[0], op), dtype=np.int64)


def run_program(
    program: Program, inputs: Mapping[str, np.ndarray], *, debug: bool = False
) -> dict[str, np.ndarray]:
    """Run ``program`` on integer inputs; int64 outputs by name (every tensor when ``debug``)."""
    env: dict[str, np.ndarray] = {}
    for info in program.inputs:
        if info.name not in inputs:
            raise ReferenceError(
                f"input {info.name!r} is missing; the program needs {[t.name for t in program.inputs]}."
            )
        arr = np.asarray(inputs[info.name])
        if not np.issubdtype(arr.dtype, np.integer):
            raise ReferenceError(
                f"input {info.name!r} must hold integer codes ({info.dtype}), got {arr.dtype}."
            )
        if arr.size and (arr.min() < info.qmin or arr.max() > info.qmax):
            raise ReferenceError(f"input {info.name!r}: codes outside [{info.qmin}, {info.qmax}].")
        env[info.name] = arr.astype(np.int64)
    for op in program.ops:
        env[op.outputs[0]] = execute_op(op, [env[i] for i in op.inputs])
    if debug:
        return env
    return {t.name: env[t.name] for t in program.outputs}
