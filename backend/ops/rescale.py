"""``rescale``: codes moved to another grid (a quantizer after a code op, a Concat input, a copy).

Integer formula (``R`` is ``rshift_round`` with ``quant.activation_round_mode``)::

    q_y = clamp(R((q_x - Z_x) M, s) + Z_y, qmin_y, qmax_y),   M / 2^s ~= S_x / S_y

ORT lowering: the one term ``M x_stored`` with constant ``-M (Z_x + off)``, requantized once.
"""

from __future__ import annotations

__all__ = ["SPEC", "emit_rescale", "reference", "lower_ort"]

import logging
from typing import Any

import numpy as np

from zonnx.backend.compiler.params import QParams, multipliers
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.requant import requantize_op
from zonnx.backend.runtime.ort_kernels import Storage, Term
from zonnx.backend.runtime.ort_values import Val

from .spec import Kind, OpSpec

logger = logging.getLogger(__name__)


def emit_rescale(
    low: Any,
    src: str,
    qin: QParams,
    dst: str,
    qout: QParams,
    sources: list[str],
    bounds: tuple[int, int] | None = None,
) -> None:
    """Emit the ``rescale`` of tensor ``src`` (grid ``qin``) to ``dst`` (grid ``qout``); ``bounds``: an
    output clamp narrower than ``qout``'s range (a Relu/Clip folded in, ``values.Clamped``)."""
    m, s = multipliers(np.asarray(qin.scale / qout.scale), low.target, sources[-1], eltwise=True)
    lo, hi = bounds if bounds is not None else (qout.qmin, qout.qmax)
    low.emit(
        "rescale",
        sources[-1],
        [src],
        [dst],
        {
            "zp_in": int(qin.zp),
            "zp_out": int(qout.zp),
            "lo": lo,
            "hi": hi,
            "round_mode": low.target.quant.activation_round_mode,
        },
        {"multiplier": m, "shift": s},
        sources,
    )


def reference(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``clamp(R((q_x - zp_in) M, s) + zp_out)``."""
    return requantize_op(args[0] - op.attrs["zp_in"], op)


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """One requantization term (module docstring)."""
    (x,), m = args, int(op.params["multiplier"][0])
    const = -m * (x.st.offset + op.attrs["zp_in"])
    return low.req(op, [Term(x.name, np.array(m), low.xmax(x))], const, ost, ())


SPEC = OpSpec(
    module=__name__,
    kinds=(Kind("rescale", reference, lower_ort, "input", native=("RequantU8", "RequantI32")),),
)
