"""What every refinement pass shares: the target rule it enforces, sweeps to a fixed point, site alignment."""

from __future__ import annotations

__all__ = [
    "RefinePass",
    "DEFAULT_TARGET",
    "FUSED_ACTIVATIONS",
    "fused_activations",
    "is_float",
    "align_sites",
    "usable_sites",
]

import abc
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import onnx_ir as ir

from zonnx.backend.targets import Target, load_target
from zonnx.passes.base import Changes, ZonnxPass
from zonnx.passes.fusion.matching import label
from zonnx.quantization.refine.positions import QuantGraph, Site, pos_of_scale

logger = logging.getLogger(__name__)

#: Target a refinement pass uses when none is given (vai_q_onnx's default flow).
DEFAULT_TARGET = "dpu-b4096"
#: Activations fused into the op before them when the target's op table does not say which: an op's
#: output position is read after them.
FUSED_ACTIVATIONS = frozenset({"Relu", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish", "PRelu"})
#: Activation names of the op tables that are not ONNX op types.
_ONNX_ACTIVATION = {"Relu6": "Clip"}
_FLOAT_TYPES = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}


def fused_activations(target: Target, op_type: str) -> frozenset[str]:
    """ONNX activations the target fuses into ``op_type`` (from its op table rows), else the default set."""
    rows = target.ops_for(op_type)
    if not rows:
        return FUSED_ACTIVATIONS
    names = {a for row in rows.values() for a in row.activations}
    for row in rows.values():
        if row.lower_to is not None and row.lower_to in target.ops:
            names |= set(target.ops[row.lower_to].activations)
    return frozenset(_ONNX_ACTIVATION.get(a, a) for a in names)


def is_float(value: ir.Value | None) -> bool:
    """Whether a value may hold float data (unknown types count as float)."""
    return value is not None and (value.dtype is None or value.dtype in _FLOAT_TYPES)


class RefinePass(ZonnxPass):
    """Base of the passes that make a quantized model meet one rule of a target.

    Options: ``target`` (a Target, a bundled target name or a .toml path; default "dpu-b4096"),
    ``max_sweeps`` (8): the rule is applied over the graph until a sweep changes nothing, since moving a
    shared tensor can break the rule at another node. Positions are read and written through
    ``QuantGraph``, so QDQ, FixNeuron and Vitis Q/DQ models are handled alike. A pass whose rule the
    target does not have changes nothing and says so in one miss.
    """

    exact = False
    #: Attribute of ``target.quant`` holding this pass's rule table.
    rule_key: ClassVar[str] = ""
    #: The rule's name in messages (default: ``rule_key``).
    rule_label: ClassVar[str] = ""

    def __init__(self, target: Target | str | Path = DEFAULT_TARGET, *, max_sweeps: int = 8) -> None:
        super().__init__()
        self.target = load_target(target)
        self.max_sweeps = max_sweeps

    def rule(self) -> Any:
        """This pass's rule table of the target, None when the target does not ask for it."""
        return getattr(self.target.quant, self.rule_key)

    def apply(self, model: ir.Model) -> Changes:
        changes = Changes()
        rule = self.rule()
        if not rule:
            changes.miss(
                f"target {self.target.name}: no {self.rule_label or self.rule_key} rule; nothing to refine"
            )
            return changes
        graph = QuantGraph(model)
        for _ in range(self.max_sweeps):
            sweep = Changes()
            self.sweep(model, graph, rule, sweep)
            changes.merge(sweep)
            if not sweep.total:
                break
        else:
            changes.miss(
                f"{self.name}: positions still moved after {self.max_sweeps} sweeps "
                "(the rule conflicts with itself on shared tensors)"
            )
        return changes

    @abc.abstractmethod
    def sweep(self, model: ir.Model, graph: QuantGraph, rule: Any, changes: Changes) -> None:
        """Apply the rule once at every candidate node, counting each change and each miss."""

    @property
    def power_of_two(self) -> bool:
        return self.target.quant.power_of_two


def usable_sites(
    node: ir.Node, sites: Sequence[tuple[str, Site | None]], power_of_two: bool, changes: Changes
) -> list[Site] | None:
    """The sites (deduplicated) when each one exists and can be rewritten; else record why and return None.

    ``sites`` pairs a role ("input 0", "output") with the site found for it.
    """
    found: list[Site] = []
    for role, site in sites:
        if site is None:
            changes.miss(f"{label(node)}: {role} is not quantized; left alone")
            return None
        problem = site.problem(power_of_two)
        if problem:
            changes.miss(f"{label(node)}: {problem}")
            return None
        if site not in found:
            found.append(site)
    return found


def align_sites(graph: QuantGraph, sites: Sequence[Site], power_of_two: bool) -> tuple[int, str] | str:
    """Put ``sites`` on one grid; return (tensors moved, the grid) or why they cannot be aligned.

    Power of two: every position becomes the smallest (vai_q_onnx: the widest range wins). Float scales:
    the union [lo, hi] of the representable ranges; symmetric signed grids keep zero point 0 and take the
    largest scale (so power-of-two inputs give the same result as above), others get
    ``scale = (hi - lo) / (qmax - qmin)``, ``zero_point = round(qmin - lo / scale)``, the scale then widened
    just enough that lo and hi both stay representable with the rounded zero point (no new clipping).
    """
    params: list[tuple[float, int, int, int]] = []
    for site in sites:
        p = site.params()
        if isinstance(p, str):
            return f"tensor {site.name!r}: {p}"
        params.append(p)
    if len({(p[2], p[3]) for p in params}) != 1:
        ranges = ", ".join(f"{s.name}: [{p[2]}, {p[3]}]" for s, p in zip(sites, params, strict=True))
        return f"the tensors have different integer ranges ({ranges})"
    if power_of_two:
        pos = min(site.require_pos() for site in sites)
        return sum(graph.set_pos(site, pos) for site in sites), f"pos {pos}"
    if len(set(params)) == 1:
        return 0, ""
    qmin, qmax = params[0][2], params[0][3]
    lo = min((qmin - zp) * scale for scale, zp, _, _ in params)
    hi = max((qmax - zp) * scale for scale, zp, _, _ in params)
    if all(zp == 0 for _, zp, _, _ in params) and qmin == -qmax - 1:
        scale, zero_point = max(scale for scale, _, _, _ in params), 0
    else:
        scale = (hi - lo) / (qmax - qmin)
        zero_point = int(min(max(round(qmin - lo / scale), qmin), qmax))
        # Rounding the zero point shifts the grid: widen the scale so that both ends stay representable.
        if zero_point < qmax:
            scale = max(scale, hi / (qmax - zero_point))
        if zero_point > qmin:
            scale = max(scale, lo / (qmin - zero_point))
    moved = sum(graph.set_scale(site, scale, zero_point) for site in sites)
    pos = pos_of_scale(scale)
    if pos is not None and zero_point == 0:
        grid = f"pos {pos}"
    else:
        grid = f"scale {scale:.6g}" + (f" zero point {zero_point}" if zero_point else "")
    return moved, grid
