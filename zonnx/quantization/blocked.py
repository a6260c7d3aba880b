"""Block-wise weight quantization (ORT's ``BlockSize``, ONNX opset 21 ``block_size``).

A 2-D weight is cut along ``axis`` (the per-channel axis when per_channel is on, else 0) into blocks of
``block_size`` values (the last one may be shorter); every block of every column (row, for axis 1)
gets its own scale and zero point, from the block's own min/max with the weight's usual rules
(symmetric or not, restricted range). The scale tensor has the weight's rank with
``ceil(n / block_size)`` along ``axis``; Q/DQ nodes carry ``axis`` and ``block_size``.
Only 2-D weights are supported (as in ORT): a Conv's rank-4 weight is refused.
"""

from __future__ import annotations

__all__ = ["BlockSizeError", "blocked_params"]

import dataclasses

import numpy as np

from zonnx.errors import OptionError
from zonnx.quantization.schemes import QuantParams, QuantSpec, params_from_range


class BlockSizeError(OptionError, NotImplementedError):
    """BlockSize asked for a weight it cannot apply to (also NotImplementedError, as ORT raises)."""


def blocked_params(name: str, w: np.ndarray, spec: QuantSpec, block_size: int) -> QuantParams:
    """Per-block parameters of the 2-D weight ``w`` along ``spec.axis`` (0 when None)."""
    if w.ndim != 2:
        raise BlockSizeError(
            f"extra_options['BlockSize']: weight {name!r} has rank {w.ndim}; block-wise quantization takes "
            "2-D weights (MatMul/Gemm) only: remove BlockSize or exclude the node."
        )
    axis = (spec.axis if spec.axis is not None else 0) % 2
    moved = np.moveaxis(np.asarray(w, np.float64), axis, 0)  # [n, m]: blocks along the first axis
    n, m = moved.shape
    blocks = -(-n // block_size)
    padded = np.zeros((blocks * block_size, m))
    padded[:n] = moved
    view = padded.reshape(blocks, block_size, m)
    lo = np.min(view, axis=1, initial=0.0)
    hi = np.max(view, axis=1, initial=0.0)
    if n % block_size:  # the padding zeros do not widen the last block (the range holds 0 anyway)
        last = moved[(blocks - 1) * block_size :]
        lo[-1], hi[-1] = np.minimum(last.min(axis=0), 0.0), np.maximum(last.max(axis=0), 0.0)
    flat = params_from_range(lo.ravel(), hi.ravel(), dataclasses.replace(spec, axis=None), axis=axis)
    shape = (blocks, m) if axis == 0 else (m, blocks)
    scale = flat.scale.reshape(blocks, m)
    zp = flat.zero_point.reshape(blocks, m)
    if axis == 1:
        scale, zp = scale.T, zp.T
    return dataclasses.replace(
        flat,
        scale=scale.reshape(shape).copy(),
        zero_point=zp.reshape(shape).copy(),
        axis=axis,
        block_size=block_size,
    )
