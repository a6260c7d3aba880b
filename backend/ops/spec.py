"""The parts an NPU op module registers (``zonnx.backend.ops.registry`` collects them).

An op module describes its program op kinds (``Kind``: numpy reference, ORT lowering, layout rule,
native kernels), how ONNX nodes become them (``Rule``: a *pending* rule lowers a float op once its
output quantizer is known; a *code* rule lowers a node acting on integer codes at once), and what the
partitioner checks before it proposes a node for the compiler (``OpSpec.const_inputs``,
``OpSpec.checks``).
"""

from __future__ import annotations

__all__ = ["Kind", "Rule", "OpSpec", "LAYOUTS"]

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

#: Named layout rules: "program" runs in the program's layout (NCHW); "input" keeps the first input's.
LAYOUTS = ("program", "input")


@dataclasses.dataclass(frozen=True)
class Kind:
    """One program op kind.

    ``reference(args, op)``: the int64 result of the op on int64 inputs (numpy, the definition).
    ``ort(lowerer, op, args, out_storage, out_info)``: emits exact ORT nodes, returns the stored output.
    ``layout``: "program", "input", or ``fn(lowerer, op, args, out_storage) -> bool`` (run channels-last).
    ``native``: the ``zonnx.native`` custom ops its ORT lowering may emit.
    """

    name: str
    reference: Callable[[list[Any], Any], Any]
    ort: Callable[[Any, Any, list[Any], Any, Any], str]
    layout: str | Callable[[Any, Any, list[Any], Any], bool] = "program"
    native: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Rule:
    """How nodes of ``onnx_ops`` are lowered.

    ``form`` "pending": ``lower(lowering, pending, out, out_grid, sources, base)`` once the output
    quantizer is known (``base`` holds ``zp_out``, ``lo``, ``hi``); ``claims(pending)`` picks this rule
    among several for one op type (None: every node). ``form`` "code": ``lower(lowering, node, codes,
    inputs)`` at once.
    """

    onnx_ops: frozenset[str]
    form: str
    lower: Callable[..., None]
    claims: Callable[[Any], bool] | None = None


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """Everything one op module registers.

    ``const_inputs``: op type -> input indices the compiler needs as constants (partition rule
    ``no_lowering``). ``checks``: op type -> ``fn(node) -> reason or None`` for further limits of the
    lowering (``node`` an ``onnx_ir.Node``).
    """

    module: str
    kinds: tuple[Kind, ...] = ()
    rules: tuple[Rule, ...] = ()
    const_inputs: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    checks: Mapping[str, Callable[[Any], str | None]] = dataclasses.field(default_factory=dict)
