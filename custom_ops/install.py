"""Put the zonnx function definitions a model uses into it, after checking and normalizing its zonnx nodes."""

from __future__ import annotations

__all__ = ["MIN_OPSET", "add_functions", "zonnx_nodes"]

import logging
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import onnx
import onnx_ir as ir
from onnx import helper

from zonnx.errors import OptionError, UnsupportedModelError
from zonnx.ir.io import default_opset

from . import grid
from .registry import REGISTRY, ZONNX_DOMAIN, ZONNX_VERSION, node_label
from .schema import OpDefinition

logger = logging.getLogger(__name__)

#: The bodies use Constant(value_int) (opset 12) and Clip with bound inputs; 13 is the oldest opset tested.
MIN_OPSET = 13
#: NodeProto.overload and FunctionProto.overload exist from IR version 10.
_MIN_IR_VERSION = 10

M = TypeVar("M", ir.Model, onnx.ModelProto)


def _subgraphs_proto(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _proto_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    for node in nodes:
        yield node
        for graph in _subgraphs_proto(node):
            yield from _proto_nodes(graph.node)


def zonnx_nodes(model: ir.Model | onnx.ModelProto) -> Iterator[onnx.NodeProto | ir.Node]:
    """Every node of the zonnx domain: main graph, subgraphs, and model functions other than zonnx's own."""
    if isinstance(model, onnx.ModelProto):
        graphs: list[Iterable[onnx.NodeProto]] = [model.graph.node]
        graphs += [f.node for f in model.functions if f.domain != ZONNX_DOMAIN]
        for nodes in graphs:
            yield from (n for n in _proto_nodes(nodes) if n.domain == ZONNX_DOMAIN)
        return
    containers: list[ir.Graph | ir.Function] = [model.graph]
    containers += [f for f in model.functions.values() if f.domain != ZONNX_DOMAIN]
    for container in containers:
        yield from (n for n in ir.traversal.RecursiveGraphIterator(container) if n.domain == ZONNX_DOMAIN)


def _attributes(node: onnx.NodeProto | ir.Node) -> dict[str, Any]:
    if isinstance(node, ir.Node):
        return {name: attr.value for name, attr in node.attributes.items()}
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


def _write_attributes(node: onnx.NodeProto | ir.Node, resolved: dict[str, int | str]) -> None:
    """Write every resolved attribute (defaults made explicit, canonical names) onto the node."""
    if isinstance(node, ir.Node):
        for attr in ir.convenience.convert_attributes(resolved):
            node.attributes[attr.name] = attr
        return
    del node.attribute[:]
    node.attribute.extend(helper.make_attribute(k, v) for k, v in resolved.items())


def _check_types(node: ir.Node, definition: OpDefinition, resolved: dict[str, int | str], label: str) -> None:
    """Where the IR knows tensor types: dequantized codes are integers, stored codes match output_dtype."""
    if definition.name == "VitisDequantizeLinear" and node.inputs and node.inputs[0] is not None:
        dtype = node.inputs[0].dtype
        if dtype is not None and dtype.value not in grid.STORAGE_TYPES:
            raise OptionError(
                f"{label}: input {node.inputs[0].name!r} is {dtype.name}; it must hold integer codes."
            )
    if definition.name == "VitisQuantizeLinear":
        dtype = node.outputs[0].dtype
        if dtype is not None and dtype.value != resolved["output_dtype"]:
            raise OptionError(
                f"{label}: output {node.outputs[0].name!r} is typed {dtype.name} but output_dtype is "
                f"{onnx.TensorProto.DataType.Name(int(resolved['output_dtype']))}; make them agree."
            )


def _prepare_nodes(model: ir.Model | onnx.ModelProto, wanted: set[str]) -> set[tuple[str, str]]:
    """Check and normalize the zonnx nodes of the ``wanted`` ops; return the (op, overload) pairs used."""
    used: set[tuple[str, str]] = set()
    for node in zonnx_nodes(model):
        outputs = list(node.outputs) if isinstance(node, ir.Node) else list(node.output)
        label = node_label(node.op_type, node.name, outputs)
        if node.op_type not in REGISTRY:
            raise OptionError(f"{label}: {node.op_type!r} is not a {ZONNX_DOMAIN} op.{_known()}")
        if node.op_type not in wanted:
            continue
        definition = REGISTRY[node.op_type]
        resolved = definition.resolve(_attributes(node), label)
        overload = definition.overload_of(resolved)
        if node.overload and node.overload != overload:
            raise OptionError(
                f"{label}: overload {node.overload!r} does not match its attributes ({overload!r} expected); "
                "set the overload to the canonical round_mode or remove it."
            )
        if isinstance(node, ir.Node):
            _check_types(node, definition, resolved, label)
        _write_attributes(node, resolved)
        node.overload = overload
        used.add((node.op_type, overload))
    return used


def _known() -> str:
    return f" Known ops: {', '.join(REGISTRY.names())}."


def add_functions(model: M, op_names: Iterable[str] | None = None) -> M:
    """Insert the FunctionProtos the model's zonnx nodes need and import the zonnx domain; return ``model``.

    The rule: for every node of the ops in ``op_names`` (all zonnx ops when None), the attributes are
    checked (OptionError naming the node), written out in full and the node's overload set to its
    canonical round_mode; then one function per (op, overload) in use is inserted, built at the model's
    default opset (ORT inlines function bodies at the model's opset, and onnx's checker wants the two to
    agree), replacing an earlier copy. The model imports ``com.zonnx`` version 1 and gets IR version >= 10
    (overloads). Ops that no node uses add nothing. The model is changed in place.
    """
    wanted = set(REGISTRY.names()) if op_names is None else set(op_names)
    for name in wanted:
        REGISTRY[name]  # raises OptionError for an unknown op name
    opset = default_opset(model)
    if opset < MIN_OPSET:
        raise UnsupportedModelError(
            f"model opset {opset}: the {ZONNX_DOMAIN} functions need opset {MIN_OPSET} or newer; "
            "run the opset-upgrade pass first."
        )
    used = _prepare_nodes(model, wanted)
    functions = [REGISTRY[op].function(opset, overload) for op, overload in sorted(used)]
    if isinstance(model, onnx.ModelProto):
        _install_proto(model, functions, bool(used))
    else:
        _install_ir(model, functions, bool(used))
    logger.info("added %d %s function(s) at opset %d", len(functions), ZONNX_DOMAIN, opset)
    return model


def _check_domain_version(version: int | None) -> None:
    if version is not None and version != ZONNX_VERSION:
        raise UnsupportedModelError(
            f"model imports {ZONNX_DOMAIN} version {version}; this zonnx writes version {ZONNX_VERSION}."
        )


def _install_proto(model: onnx.ModelProto, functions: list[onnx.FunctionProto], any_used: bool) -> None:
    keys = {(f.domain, f.name, f.overload) for f in functions}
    kept = [f for f in model.functions if (f.domain, f.name, f.overload) not in keys]
    del model.functions[:]
    model.functions.extend([*kept, *functions])
    if not any_used:
        return
    imports = {imp.domain: imp.version for imp in model.opset_import}
    _check_domain_version(imports.get(ZONNX_DOMAIN))
    if ZONNX_DOMAIN not in imports:
        model.opset_import.append(helper.make_opsetid(ZONNX_DOMAIN, ZONNX_VERSION))
    model.ir_version = max(model.ir_version, _MIN_IR_VERSION)


def _install_ir(model: ir.Model, functions: list[onnx.FunctionProto], any_used: bool) -> None:
    for proto in functions:
        function = ir.serde.deserialize_function(proto)
        model.functions[function.identifier()] = function
    if not any_used:
        return
    _check_domain_version(model.opset_imports.get(ZONNX_DOMAIN))
    model.opset_imports[ZONNX_DOMAIN] = ZONNX_VERSION
    model.ir_version = max(model.ir_version, _MIN_IR_VERSION)
