"""The compiler's extension point: op kinds lowered outside ``lower.py`` and the list of lowerable ONNX ops.

``lower.py`` asks this module three things: which extra ONNX ops wait for their output quantizer
(``PENDING_OPS``: elementwise Mul/Sub/Div, see ``lower_eltwise``), which extra ops act on codes
(``CODE_OPS``: Slice/Split/Gather/Pad, see ``lower_codes``), and whether it lowers a pending op itself
(``claims``: Add with a constant, MatMul of two activations). ``lowerable_op_types`` is every ONNX op type
the compiler can lower, for the partitioner's ``no_lowering`` rule.
"""

from __future__ import annotations

__all__ = ["PENDING_OPS", "CODE_OPS", "claims", "lower_pending", "code_op", "lowerable_op_types"]

import functools
import logging

from .lower_codes import CODE_OPS, code_op
from .lower_eltwise import PENDING_OPS, claims, lower_pending

logger = logging.getLogger(__name__)


@functools.cache
def lowerable_op_types() -> frozenset[str]:
    """ONNX op types (default domain) that ``compile_subgraph`` lowers, quantizers and Constant included."""
    from . import lower

    return frozenset(
        {"Constant", "Relu", "Clip", "QuantizeLinear", "DequantizeLinear"}
        | lower._CODE_OPS
        | lower._PENDING_OPS
        | PENDING_OPS
        | CODE_OPS
    )
