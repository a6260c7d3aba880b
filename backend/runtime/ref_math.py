"""Exact integer helpers of the numpy reference kernels: products, padding and window views.

Products are taken in float64 BLAS when ``K * max|a| * max|b| < 2^53`` (every partial sum is then an
exactly representable integer, so the result is the exact integer sum), else in int64.
"""

from __future__ import annotations

__all__ = ["ReferenceError", "EXACT_F64", "matmul_exact", "pad_nchw", "windows", "ceil_pads"]

import logging
import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from zonnx.errors import ZonnxError

logger = logging.getLogger(__name__)
#: Integers below this magnitude are exact in float64.
EXACT_F64 = float(1 << 53)


class ReferenceError(ZonnxError):
    """Bad inputs for a program (missing, not integer, wrong range) or an op the executor does not know."""


def matmul_exact(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact integer ``a @ b`` (int64), through float64 BLAS when no partial sum can exceed 2^53."""
    k = a.shape[-1]
    bound = k * float(np.max(np.abs(a), initial=0)) * float(np.max(np.abs(b), initial=0))
    if bound < EXACT_F64:
        return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.int64)
    return np.matmul(a.astype(np.int64), b.astype(np.int64))


def pad_nchw(x: np.ndarray, pads: list[int], value: int) -> np.ndarray:
    """``x`` padded on its trailing spatial axes (ONNX pads: begins then ends) with ``value``."""
    n = len(pads) // 2
    width = [(0, 0)] * (x.ndim - n) + [(pads[i], pads[i + n]) for i in range(n)]
    return np.pad(x, width, constant_values=value)


def windows(xp: np.ndarray, kernel: list[int], strides: list[int], dilations: list[int]) -> np.ndarray:
    """(N, C, oh, ow, kh, kw) views of a padded NCHW tensor."""
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    win = sliding_window_view(xp, eff, axis=(2, 3))
    return win[:, :, :: strides[0], :: strides[1], :: dilations[0], :: dilations[1]]


def ceil_pads(shape: tuple, kernel: list, strides: list, pads: list, dilations: list, ceil: int) -> list[int]:
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
