"""Small helpers the fusion rules share: the rule contract and driver, constant lookup, consumer checks."""

from __future__ import annotations

__all__ = [
    "Rule",
    "Context",
    "run_rules",
    "label",
    "const_array",
    "scalar",
    "is_close",
    "producer",
    "other_input",
    "consumer",
    "exclusive",
    "replace_value",
    "replace_with_meaning",
    "drop",
    "prune",
    "set_attr",
]

import abc
import logging
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from zonnx.ir.io import default_opset
from zonnx.passes.base import Changes

logger = logging.getLogger(__name__)

M = TypeVar("M")

#: Default relative tolerance when comparing a constant with the value a pattern expects.
RTOL = 1e-6


def label(node: ir.Node) -> str:
    """A name for messages: the node's name, else its op type and first output."""
    if node.name:
        return node.name
    out = node.outputs[0].name if node.outputs else "?"
    return f"{node.op_type}->{out}"


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The value's data when it is an initializer, a Constant output or an Identity of one; else None.

    An initializer that is also a graph input is not constant (the caller may feed it).
    """
    for _ in range(8):
        if value is None or value.is_graph_input():
            return None
        try:
            tensor = ir.convenience.get_const_tensor(value)
        except ValueError:
            return None
        if tensor is not None:
            try:
                return tensor.numpy()
            except Exception:  # undecodable or missing external data: treat as not constant
                return None
        node = value.producer()
        if node is None or node.op_type != "Identity" or node.domain != "":
            return None
        value = node.inputs[0]
    return None


def scalar(value: ir.Value | None) -> float | None:
    """The value as a Python float when it is a constant with one element and rank <= 1."""
    arr = const_array(value)
    if arr is None or arr.size != 1 or arr.ndim > 1 or arr.dtype.kind not in "fiu":
        return None
    return float(arr.reshape(()))


def is_close(got: float | None, want: float, rtol: float = RTOL) -> bool:
    """Whether ``got`` equals ``want`` within a relative tolerance."""
    return got is not None and abs(got - want) <= rtol * abs(want)


def producer(value: ir.Value | None, *op_types: str) -> ir.Node | None:
    """The default-domain node that produces ``value`` when its op type is one of ``op_types``."""
    if value is None:
        return None
    node = value.producer()
    if node is None or node.domain != "" or node.op_type not in op_types:
        return None
    return node


def other_input(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """For a two-input node, the input that is not ``value`` (None when ``value`` is not an input)."""
    a, b = (list(node.inputs) + [None, None])[:2]
    if a is value:
        return b
    if b is value:
        return a
    return None


def consumer(value: ir.Value, *op_types: str) -> ir.Node | None:
    """The first default-domain consumer of ``value`` whose op type is one of ``op_types``."""
    for node in value.consumers():
        if node.domain == "" and node.op_type in op_types:
            return node
    return None


def exclusive(values: Iterable[ir.Value | None], inside: Iterable[ir.Node]) -> str | None:
    """Why the values cannot be rewritten away: "V is also used by N" for a reader outside ``inside``."""
    members = set(inside)
    for value in values:
        if value is None:
            continue
        if value.is_graph_output():
            return f"{value.name} is also a graph output"
        for node in value.consumers():
            if node not in members:
                return f"{value.name} is also used by {label(node)}"
    return None


def set_attr(node: ir.Node, name: str, value: Any, default: Any = None) -> None:
    """Set an attribute, or remove it when ``value`` equals the ONNX default ``default``."""
    if default is not None and value == default:
        node.attributes.pop(name, None)
    else:
        node.attributes[name] = ir.convenience.convert_attribute(name, value)


def replace_value(old: ir.Value, new: ir.Value) -> None:
    """Point every reader of ``old`` at ``new``; a graph output keeps its name.

    When ``old`` is a graph output, ``new`` takes its name; if ``new`` cannot be renamed (it is a graph
    input, an initializer or already an output) an Identity named like ``old`` is added instead.
    """
    if new.type is None:
        new.type = old.type
    if new.shape is None and old.shape is not None:
        new.shape = old.shape
    graph = old.graph if old.is_graph_output() else None
    if graph is None:
        old.replace_all_uses_with(new)
        return
    name = old.name
    if new.is_graph_input() or new.is_initializer() or new.is_graph_output() or new.producer() is None:
        out = ir.Value(name=None, type=old.type, shape=old.shape)
        ident = ir.node("Identity", [new], outputs=[out])
        graph.append(ident)
        old.replace_all_uses_with(out, replace_graph_outputs=True)
        old.name = None
        out.name = name
        return
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    old.name = None
    new.name = name


def prune(values: Iterable[ir.Value | None]) -> None:
    """Remove initializers and Constant/Identity producers of values nobody reads any more."""
    stack = [v for v in values if v is not None]
    while stack:
        value = stack.pop()
        if value.uses() or value.is_graph_output() or value.is_graph_input():
            continue
        if value.is_initializer():
            graph = value.graph
            if graph is not None and graph.initializers.get(value.name) is value:
                graph.initializers.pop(value.name)
            continue
        node = value.producer()
        if node is None or node.graph is None or node.domain != "":
            continue
        if node.op_type not in ("Constant", "Identity"):
            continue
        if any(o.uses() or o.is_graph_output() for o in node.outputs):
            continue
        inputs = list(node.inputs)
        node.graph.remove(node, safe=True)
        stack.extend(v for v in inputs if v is not None)


def replace_with_meaning(old: ir.Value, new: ir.Value, nodes: Sequence[ir.Node]) -> None:
    """Replace ``old`` by ``new`` (``replace_value``), drop ``nodes`` and give ``new`` the name of ``old``:
    the rewrite computes the same value, so tools that pair tensors by name with the source model (compare,
    golden, triage) keep pairing it. ``new`` keeps its own name when it is a graph input or output."""
    name = old.name
    replace_value(old, new)
    drop(nodes)
    if name and new.name != name and not (new.is_graph_input() or new.is_graph_output()):
        old.name = None
        new.name = name


def drop(nodes: Sequence[ir.Node]) -> None:
    """Remove matched nodes (their outputs must be unread) and the constants only they read."""
    live = [n for n in dict.fromkeys(nodes) if n.graph is not None]
    inputs = [v for n in live for v in n.inputs]
    by_graph: dict[int, tuple[ir.Graph, list[ir.Node]]] = {}
    for n in live:
        by_graph.setdefault(id(n.graph), (n.graph, []))[1].append(n)
    for graph, group in by_graph.values():
        graph.remove(group, safe=True)
    prune(inputs)


class Context:
    """What rules need beyond the matched nodes: the model's opset, shapes on demand, new initializers."""

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self.opset = default_opset(model)
        self._names: set[str] | None = None
        self._inferred = False

    def shape(self, value: ir.Value | None) -> ir.Shape | None:
        """The value's shape; runs ONNX shape inference once per pass when a shape is missing."""
        if value is None:
            return None
        if value.shape is None and not self._inferred:
            self._inferred = True
            try:
                common_passes.ShapeInferencePass(check_type=False, strict_mode=False)(self.model)
            except Exception as e:  # inference is best effort: rules then record a miss
                logger.info("shape inference failed: %s", e)
        return value.shape

    def rank(self, value: ir.Value | None) -> int | None:
        shape = self.shape(value)
        return None if shape is None else len(shape)

    def static_shape(self, value: ir.Value | None) -> tuple[int, ...] | None:
        """The shape as ints when every dim is known, else None (constants use their data's shape)."""
        arr = const_array(value)
        if arr is not None:
            return tuple(arr.shape)
        shape = self.shape(value)
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None
        return tuple(int(d) for d in shape)

    def dims(self, value: ir.Value | None) -> tuple[int | None, ...] | None:
        """The shape with unknown dims as None, or None when even the rank is unknown."""
        shape = self.shape(value)
        if shape is None:
            return None
        return tuple(int(d) if isinstance(d, int) else None for d in shape)

    def initializer(self, graph: ir.Graph, hint: str, array: np.ndarray) -> ir.Value:
        """Register ``array`` as a new initializer whose name starts with ``hint`` and is unused."""
        if self._names is None:
            self._names = set(ir.convenience.create_value_mapping(self.model.graph))
        base = hint or "const"
        name, i = base, 0
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        array = np.asarray(array, order="C")  # ascontiguousarray would make 0-d arrays 1-d
        value = ir.Value(
            name=name,
            type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
            shape=ir.Shape(array.shape),
            const_value=ir.tensor(array, name=name),
        )
        graph.register_initializer(value)
        return value


class Rule(abc.ABC, Generic[M]):
    """One rewrite: ``pattern`` finds a candidate at an anchor node, ``check`` says why it may not fire,
    ``rewrite`` edits the graph and returns the ``Changes`` key to count (default ``what``)."""

    #: Op type (default domain) of the node ``pattern`` starts from.
    anchor: ClassVar[str]
    #: Key counted in ``Changes`` for each rewrite.
    what: ClassVar[str]

    @abc.abstractmethod
    def pattern(self, ctx: Context, node: ir.Node) -> M | None:
        """The matched structure rooted at ``node``, or None when the structure is not there."""

    def check(self, ctx: Context, match: M) -> str | None:
        """A reason naming the node and value when the rewrite must not happen, else None."""
        return None

    @abc.abstractmethod
    def rewrite(self, ctx: Context, match: M) -> str | None:
        """Edit the graph; may return a more specific ``Changes`` key than ``what``."""


def _graphs(model: ir.Model) -> list[ir.Graph]:
    return [model.graph, *model.graph.subgraphs()]


def run_rules(model: ir.Model, rules: Sequence[Rule[Any]], max_sweeps: int = 8) -> Changes:
    """Apply ``rules`` over every graph until a sweep makes no rewrite.

    For each node, the rules anchored at its op type are tried in order; the first that fires wins.
    A rule whose check fails records its reason and lets the next rule try (so a fallback rule can
    fire while the miss still explains why the better one did not). A miss recorded in an earlier
    sweep is dropped when a rule later fires at the same node.
    """
    changes = Changes()
    ctx = Context(model)
    by_anchor: dict[str, list[Rule[Any]]] = {}
    for rule in rules:
        by_anchor.setdefault(rule.anchor, []).append(rule)
    misses: dict[str, tuple[ir.Node, int]] = {}
    for sweep in range(max_sweeps):
        fired = 0
        for graph in _graphs(model):
            for node in list(graph):
                for rule in by_anchor.get(node.op_type, ()):
                    if node.graph is not graph or node.domain != "":
                        break
                    match = rule.pattern(ctx, node)
                    if match is None:
                        continue
                    reason = rule.check(ctx, match)
                    if reason:
                        misses.pop(reason, None)
                        misses[reason] = (node, sweep)
                        continue
                    stale = [r for r, (n, k) in misses.items() if n is node and k < sweep]
                    for r in stale:
                        del misses[r]
                    key = rule.rewrite(ctx, match) or rule.what
                    changes.add(key)
                    logger.debug("%s at %s", key, label(node))
                    fired += 1
                    break
        if not fired:
            break
    for reason in misses:
        changes.miss(reason)
    return changes
