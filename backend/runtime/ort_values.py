"""Program tensors as the ORT lowering holds them, and small node helpers the op lowerings share.

A program tensor lives in ORT as ``stored = q + offset`` (``ort_kernels`` storage); ``Val`` names that
tensor and says whether a rank-4 tensor is held channels-last. A constant in NCHW broadcast shape is laid
out for an NHWC activation by ``for_layout``.
"""

from __future__ import annotations

__all__ = [
    "MS_DOMAIN",
    "Val",
    "centred_max",
    "for_layout",
    "require_program_layout",
    "clip_stored",
    "is_rank4",
]

import dataclasses
import logging

import numpy as np

from zonnx.backend.compiler.program import Op, TensorInfo

from .ort_kernels import Builder, KernelError, Storage

logger = logging.getLogger(__name__)

MS_DOMAIN = "com.microsoft"  # NhwcMaxPool: an ORT CPU contrib kernel (uint8/int8)


@dataclasses.dataclass
class Val:
    """A program tensor inside ORT: ``name`` holds ``q + st.offset``."""

    name: str  # ORT tensor holding q + st.offset
    st: Storage
    info: TensorInfo
    nhwc: bool = False  # a rank-4 tensor held channels-last (the program's layout is NCHW)
    other: str | None = None  # the same tensor in the other layout, once made


def centred_max(info: TensorInfo, zp: int) -> int:
    """max |q - zp| over the tensor's code range."""
    return max(abs(info.qmin - zp), abs(info.qmax - zp))


def for_layout(c: np.ndarray, nhwc: bool) -> np.ndarray:
    """A constant in NCHW broadcast shape, laid out for an NHWC activation when ``nhwc``."""
    c = np.asarray(c)
    if not nhwc or c.size == 1:
        return c
    if c.ndim > 4:
        raise KernelError(f"a rank-{c.ndim} constant cannot broadcast against an NHWC tensor.")
    return c.reshape((1,) * (4 - c.ndim) + c.shape).transpose(0, 2, 3, 1)


def require_program_layout(args: list[Val], op: Op) -> None:
    """Refuse inputs held channels-last (ops whose attributes index the program's NCHW axes)."""
    if any(v.nhwc for v in args):
        raise KernelError(f"op {op.name!r} ({op.kind}) needs its input in the program's layout (NCHW).")


def clip_stored(b: Builder, name: str, lo: int, hi: int, st: Storage) -> str:
    """``Clip`` of stored codes to the code range ``[lo, hi]``."""
    return b.op(
        "Clip",
        [
            name,
            b.const(lo + st.offset, st.dtype, "lo"),
            b.const(hi + st.offset, st.dtype, "hi"),
        ],
    )


def is_rank4(x: Val) -> bool:
    """Rank 4 or unknown rank."""
    return x.info.shape is None or len(x.info.shape) == 4
