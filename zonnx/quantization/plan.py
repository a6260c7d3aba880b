"""The quantization plan: which tensors to quantize, in what role, and which must share one scale.

Op rules fill a plan (annotate), calibration fills its ranges (observe), schemes turn ranges into
parameters, refinement passes adjust them, and a writer inserts the nodes. The plan is plain data.
"""

from __future__ import annotations

__all__ = ["Role", "TensorPlan", "QuantPlan"]

import dataclasses
import enum

from zonnx.quantization.schemes import QuantParams, QuantSpec


class Role(enum.Enum):
    ACTIVATION = "activation"
    WEIGHT = "weight"
    BIAS = "bias"


@dataclasses.dataclass
class TensorPlan:
    """One tensor to quantize.

    ``bias_of`` names (input activation, weight) for a bias; ``fixed_range`` pins an activation's range
    (Softmax/Sigmoid outputs); ``consumers`` names the nodes whose input edge carries the quantizer
    (None: every reader, graph outputs included); ``softmax_span`` caps how far below its maximum the
    range of a Softmax input reaches (see ``op_rules.SOFTMAX_SPAN``); ``fixed_params`` replaces calibration
    (the group of a shared scale takes them); ``params`` is filled after calibration.
    """

    name: str
    role: Role
    spec: QuantSpec
    bias_of: tuple[str, str] | None = None
    fixed_range: tuple[float, float] | None = None
    params: QuantParams | None = None
    rmin: float | None = None
    rmax: float | None = None
    consumers: frozenset[str] | None = None
    softmax_span: float | None = None
    #: parameters given by the user (TensorQuantOverrides scale/zero_point): used instead of calibration
    fixed_params: QuantParams | None = None
    float16: bool = False  # the tensor is float16 in the model (scales are written as float16)
    #: TensorQuantOverrides 'convert': a second quantization for some readers (None: every reader)
    convert_spec: QuantSpec | None = None
    convert_fixed: QuantParams | None = None
    convert_recv: frozenset[str] | None = None
    convert_params: QuantParams | None = None
    bias_node: str | None = None  # for a bias: the node it belongs to
    #: the model already holds this tensor behind a DequantizeLinear: its parameters are that node's
    #: (``fixed_params``) and nothing is written for it
    prequantized: bool = False


@dataclasses.dataclass
class QuantPlan:
    """Tensors by name, shared-scale groups (union-find), quantized nodes, and reasons for skipped nodes."""

    tensors: dict[str, TensorPlan] = dataclasses.field(default_factory=dict)
    quantized_nodes: list[str] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    #: tensors whose range the user fixed (TensorQuantOverrides rmin/rmax): it wins over their group's union
    overridden: set[str] = dataclasses.field(default_factory=set)
    #: Relu/Clip nodes to remove (ORT's removable activations): node name -> (input name, output name)
    removed: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    _parent: dict[str, str] = dataclasses.field(default_factory=dict)

    def add(self, tp: TensorPlan) -> TensorPlan:
        """Add a tensor; a tensor already planned keeps its first role and spec, and its quantized edges
        grow to cover both (every reader when either asks for every reader)."""
        existing = self.tensors.get(tp.name)
        if existing is not None:
            if existing.consumers is not None:
                existing.consumers = None if tp.consumers is None else existing.consumers | tp.consumers
            return existing
        self.tensors[tp.name] = tp
        self._parent.setdefault(tp.name, tp.name)
        return tp

    def find(self, name: str) -> str:
        parent = self._parent.setdefault(name, name)
        if parent != name:
            parent = self._parent[name] = self.find(parent)
        return parent

    def share(self, a: str, b: str) -> None:
        """Require tensors a and b to use the same scale and zero point."""
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self._parent[rb] = ra

    def groups(self) -> list[list[str]]:
        """Shared-scale groups of activations (singletons included), in plan order."""
        out: dict[str, list[str]] = {}
        for name, tp in self.tensors.items():
            if tp.role is Role.ACTIVATION:
                out.setdefault(self.find(name), []).append(name)
        return list(out.values())

    def activations(self) -> list[str]:
        return [n for n, t in self.tensors.items() if t.role is Role.ACTIVATION]
