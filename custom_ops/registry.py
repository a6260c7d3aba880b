"""The registry of zonnx ops (name -> definition) and the helpers writers use: make_node, reference_run."""

from __future__ import annotations

__all__ = [
    "ZONNX_DOMAIN",
    "ZONNX_VERSION",
    "OpRegistry",
    "REGISTRY",
    "make_node",
    "reference_run",
    "node_label",
]

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from zonnx.errors import OptionError, did_you_mean

from .dequantize_linear import VITIS_DEQUANTIZE_LINEAR
from .fixneuron import FIXNEURON
from .quantize_linear import VITIS_QUANTIZE_LINEAR
from .schema import ZONNX_DOMAIN, ZONNX_VERSION, OpDefinition

logger = logging.getLogger(__name__)


class OpRegistry:
    """An explicit mapping op name -> OpDefinition; unknown names raise OptionError with a suggestion."""

    def __init__(self, definitions: Iterable[OpDefinition]) -> None:
        self._ops: dict[str, OpDefinition] = {}
        for definition in definitions:
            if definition.name in self._ops:
                raise ValueError(f"op {definition.name} registered twice")
            self._ops[definition.name] = definition

    def __getitem__(self, name: str) -> OpDefinition:
        try:
            return self._ops[name]
        except KeyError:
            raise OptionError(
                f"{name!r} is not a {ZONNX_DOMAIN} op (known: {', '.join(self._ops)})."
                + did_you_mean(name, self._ops)
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    def __iter__(self) -> Iterator[str]:
        return iter(self._ops)

    def __len__(self) -> int:
        return len(self._ops)

    def names(self) -> tuple[str, ...]:
        return tuple(self._ops)


#: Every op of the zonnx domain.
REGISTRY = OpRegistry([FIXNEURON, VITIS_QUANTIZE_LINEAR, VITIS_DEQUANTIZE_LINEAR])


def node_label(op_name: str, name: str | None, outputs: Sequence[Any]) -> str:
    """How errors name a node: its name, else the tensor it produces."""
    if name:
        return f"node {name!r} ({op_name})"
    first = outputs[0] if outputs else None
    first_name = first.name if isinstance(first, ir.Value) else first
    return f"node producing {first_name!r} ({op_name})" if first_name else f"{op_name} node"


def make_node(
    op_name: str,
    inputs: Sequence[str] | Sequence[ir.Value],
    outputs: Sequence[str],
    *,
    name: str | None = None,
    **attrs: Any,
) -> onnx.NodeProto | ir.Node:
    """A zonnx node with every attribute written out (defaults included) and its overload set.

    ``inputs`` as tensor names gives an ``onnx.NodeProto``; as ``ir.Value`` objects, an ``ir.Node``
    whose output is named ``outputs[0]`` and typed (float32, or output_dtype) with the input's shape.
    Unknown attributes and out-of-range values raise OptionError
    naming the node. The overload is the canonical round_mode (FixNeuron, VitisQuantizeLinear).
    """
    definition = REGISTRY[op_name]
    resolved = definition.resolve(attrs, node_label(op_name, name, outputs))
    overload = definition.overload_of(resolved)
    if len(outputs) != 1:
        raise OptionError(f"{node_label(op_name, name, outputs)}: {op_name} has exactly one output.")
    if any(isinstance(value, ir.Value) for value in inputs):
        node = ir.node(
            op_name,
            list(inputs),  # type: ignore[arg-type]
            attributes=resolved,
            domain=ZONNX_DOMAIN,
            overload=overload,
            num_outputs=1,
            name=name,
        )
        out, source = node.outputs[0], inputs[0]
        out.name = outputs[0]
        out.dtype = ir.DataType(resolved.get("output_dtype", ir.DataType.FLOAT))
        if isinstance(source, ir.Value) and source.shape is not None:
            out.shape = source.shape
        return node
    proto = helper.make_node(op_name, list(inputs), list(outputs), name=name, domain=ZONNX_DOMAIN, **resolved)
    proto.overload = overload
    return proto


def reference_run(op_name: str, x: np.ndarray, **attrs: Any) -> np.ndarray:
    """Run the numpy reference kernel of ``op_name`` on ``x`` (attributes checked as make_node does)."""
    definition = REGISTRY[op_name]
    resolved = definition.resolve(attrs, f"reference_run({op_name})")
    return definition.kernel(np.asarray(x), **resolved)
