"""Run models holding zonnx ops without ORT, for debugging: numpy kernels, or the function bodies themselves.

``onnx.reference.ReferenceEvaluator`` (onnx 1.23) ignores two things zonnx models rely on: function
overloads (it keys functions by domain and name only, so the last overload wins) and attribute defaults
declared in ``FunctionProto.attribute_proto``. ``evaluator_model`` therefore gives each overload its own
op name and writes every attribute onto the nodes before the evaluator sees the model.
"""

from __future__ import annotations

__all__ = ["kernel_ops", "run_reference", "evaluator_model", "run_functions"]

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from zonnx.ir.io import ModelLike, to_proto

from .install import add_functions, zonnx_nodes
from .registry import REGISTRY, ZONNX_DOMAIN, node_label

logger = logging.getLogger(__name__)


def _kernel_class(op_name: str) -> type[OpRun]:
    """A ReferenceEvaluator op whose ``_run`` calls the numpy reference kernel of ``op_name``."""
    definition = REGISTRY[op_name]

    def _run(self: OpRun, x: np.ndarray, **attrs: Any) -> tuple[np.ndarray]:
        node = self.onnx_node
        label = node_label(op_name, node.name, list(node.output))
        values = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        values = {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}
        return (definition.kernel(x, **definition.resolve(values, label)),)

    return type(op_name, (OpRun,), {"op_domain": ZONNX_DOMAIN, "_run": _run})


@functools.cache
def kernel_ops() -> tuple[type[OpRun], ...]:
    """ReferenceEvaluator ``new_ops`` classes: one per zonnx op, each running its numpy kernel."""
    return tuple(_kernel_class(name) for name in REGISTRY)


def _run(
    evaluator: ReferenceEvaluator, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None
) -> dict:
    names = list(outputs) if outputs is not None else list(evaluator.output_names)
    # Overflow to inf and NaN codes are defined results here, not accidents worth a numpy warning.
    with np.errstate(over="ignore", invalid="ignore"):
        return dict(zip(names, evaluator.run(names, dict(feeds)), strict=True))


def run_reference(
    model: ModelLike, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """Run ``model`` in onnx's ReferenceEvaluator with the zonnx ops replaced by their numpy kernels."""
    proto = to_proto(model)
    return _run(ReferenceEvaluator(proto, new_ops=list(kernel_ops())), feeds, outputs)


def evaluator_model(model: ModelLike) -> onnx.ModelProto:
    """A copy of ``model`` whose zonnx function bodies ReferenceEvaluator runs as ORT would.

    The rule: nodes and functions are normalized by ``add_functions`` (all attributes explicit), then
    each zonnx node and function with an overload is renamed ``<op>__<overload>`` and its overload cleared.
    """
    proto = onnx.ModelProto()
    proto.CopyFrom(to_proto(model))
    add_functions(proto)
    for node in zonnx_nodes(proto):
        if node.overload:
            node.op_type, node.overload = f"{node.op_type}__{node.overload}", ""
    for function in proto.functions:
        if function.domain == ZONNX_DOMAIN and function.overload:
            function.name, function.overload = f"{function.name}__{function.overload}", ""
    return proto


def run_functions(
    model: ModelLike, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """Run ``model`` in ReferenceEvaluator executing the zonnx function bodies (see ``evaluator_model``)."""
    return _run(ReferenceEvaluator(evaluator_model(model)), feeds, outputs)
