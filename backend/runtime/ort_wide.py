"""16-bit convolutions and matmuls on ORT's 8-bit integer kernels, exactly, by byte planes.

A stored 16-bit activation (``q + offset`` in [0, 65535], held as int32) is ``256 hi + lo`` with ``hi``
and ``lo`` in [0, 255]; a 16-bit weight is ``256 w_hi + w_lo`` with ``w_lo`` in [0, 255] (unsigned) and
``w_hi`` in [-128, 127]. Convolution and matmul are bilinear, so

    sum x w = sum_ij 256^(i + j) sum x_i w_j

and each plane product runs in ConvInteger (u8 x u8) / MatMulInteger (u8 x u8, or u8 x s8 for a signed
plane on the ``u8s8`` integer path, ``zonnx.hostcpu``) with exact int32 sums
(``|sum| <= K 255 255 < 2^31`` for ``K < 33025``, checked). The planes are combined in int64, which is
exact (``|sum x w| <= K 65535 32768 < 2^62``), and the program's accumulator is that sum minus
``offset * sum(w)`` plus the bias (folded into the requantization constant by the caller). The input is
padded with the stored pad value before it is split, so padded positions hold the program's pad code in
both planes. 8-bit inputs with 16-bit weights use one input plane. Layout: NCHW (ConvInteger).
"""

from __future__ import annotations

__all__ = ["is_int8", "emit_wide_conv", "emit_wide_matmul"]

import numpy as np
from onnx import TensorProto

from zonnx.backend.compiler.program import Op
from zonnx.hostcpu import IntPath

from .ort_kernels import Builder, KernelError, Storage, int8_weights

_MAX_K = 33024


def is_int8(w: np.ndarray) -> bool:
    """Whether weights fit int8 (the 8-bit kernels take them directly)."""
    return bool(w.size == 0 or (int(w.min()) >= -128 and int(w.max()) <= 127))


def _weight_planes(w: np.ndarray) -> list[tuple[np.ndarray, int, bool]]:
    """[(plane, byte power, signed)]: int8 weights as one signed plane, else unsigned low + signed high."""
    w = w.astype(np.int64)
    if is_int8(w):
        return [(w, 0, True)]
    lo = w & 255
    return [(lo, 0, False), ((w - lo) >> 8, 1, True)]


def _input_planes(b: Builder, x: str, st: Storage, pad_value: int, pads: list[int] | None) -> list[str]:
    """The stored input padded with its stored pad value, as uint8 planes [lo, hi] (or [x] when 8-bit)."""
    zs = pad_value + st.offset
    dtype = np.uint8 if st.dtype == np.uint8 else np.int32
    if pads and any(pads):
        n = len(pads) // 2
        full = [0, 0, *pads[:n], 0, 0, *pads[n:]]
        x = b.op("Pad", [x, b.const(full, np.int64, "pads"), b.const(zs, dtype, "pv")])
    if st.dtype == np.uint8:
        return [x]
    div = b.const(256, np.int32, "b256")
    lo = b.op("Cast", [b.op("Mod", [x, div])], to=TensorProto.UINT8)
    hi = b.op("Cast", [b.op("Div", [x, div])], to=TensorProto.UINT8)  # stored values are >= 0
    return [lo, hi]


def _combine(b: Builder, parts: list[tuple[str, int]]) -> str:
    """``sum 256^power part`` in int64."""
    acc = None
    for name, power in parts:
        v = b.op("Cast", [name], to=TensorProto.INT64)
        if power:
            v = b.op("Mul", [v, b.const(256**power, np.int64, "p256")])
        acc = v if acc is None else b.op("Add", [acc, v])
    return acc


def _check_k(op: Op, k: int) -> None:
    if k >= _MAX_K:
        raise KernelError(f"op {op.name!r}: {k} products per output overflow int32 byte-plane sums.")


def emit_wide_conv(b: Builder, x: str, op: Op, st: Storage) -> tuple[str, float]:
    """(int64 NCHW ``sum x_stored w`` over the padded input, its magnitude bound) for a 16-bit conv."""
    a, w = op.attrs, op.params["w"].astype(np.int64)
    k = int(np.prod(w.shape[1:]))
    _check_k(op, k)
    planes = _input_planes(b, x, st, int(a["pad_value"]), a["pads"])
    parts = []
    for i, plane in enumerate(planes):
        for wj, j, signed in _weight_planes(w):
            wq, wzp = ((wj + 128).astype(np.uint8), 128) if signed else (wj.astype(np.uint8), 0)
            ci = b.op(
                "ConvInteger",
                [
                    plane,
                    b.const(wq, np.uint8, "w"),
                    b.const(0, np.uint8, "xzp"),
                    b.const(wzp, np.uint8, "wzp"),
                ],
                kernel_shape=list(w.shape[2:]),
                strides=a["strides"],
                dilations=a["dilations"],
                group=a["group"],
            )
            parts.append((ci, i + j))
    xmax = 65535.0 if st.dtype != np.uint8 else 255.0
    return _combine(b, parts), k * xmax * float(np.abs(w).max(initial=0))


def emit_wide_matmul(b: Builder, x: str, op: Op, st: Storage, path: IntPath) -> tuple[str, float]:
    """(int64 ``x_stored @ w``, its magnitude bound) for a matmul with 16-bit input or weights."""
    w = op.params["w"].astype(np.int64)
    _check_k(op, w.shape[0])
    planes = _input_planes(b, x, st, 0, None)
    parts = []
    for i, plane in enumerate(planes):
        for wj, j, signed in _weight_planes(w):
            if signed:
                wname, wzp = int8_weights(b, wj, path)
            else:
                wname, wzp = b.const(wj.astype(np.uint8), np.uint8, "w"), b.const(0, np.uint8, "wzp")
            mm = b.op("MatMulInteger", [plane, wname, b.const(0, np.uint8, "xzp"), wzp])
            parts.append((mm, i + j))
    xmax = 65535.0 if st.dtype != np.uint8 else 255.0
    return _combine(b, parts), w.shape[0] * xmax * float(np.abs(w).max(initial=0))
