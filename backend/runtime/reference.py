"""The numpy reference executor of an NPU ``Program``: every op's integer formula in int64, independent of ORT.

Each op kind's formula and numpy kernel live in its module under ``zonnx.backend.ops`` (``R(v, M, s) =
rshift_round(v * M, s, round_mode)``, clamps to [lo, hi]); this module runs a program op by op through
``ops.registry``. Convolution and matmul products are exact integers (``ref_math``: float64 BLAS when
no partial sum can reach 2^53, else int64). Public API: ``run_program``, ``execute_op``,
``ReferenceError``.
"""

from __future__ import annotations

__all__ = ["run_program", "execute_op", "ReferenceError"]

import logging
from collections.abc import Mapping

import numpy as np

from zonnx.backend.compiler.program import Op, Program
from zonnx.backend.ops import registry

from .ref_math import ReferenceError

logger = logging.getLogger(__name__)


def execute_op(op: Op, args: list[np.ndarray]) -> np.ndarray:
    """One op on int64 inputs; returns its int64 output."""
    kind = registry.kind(op.kind)
    if kind is None:
        raise ReferenceError(f"op {op.name!r}: unknown op kind {op.kind!r}; the program needs a newer zonnx.")
    return np.asarray(kind.reference(args, op), dtype=np.int64)


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
