"""Structural checks of an ONNX model's main graph, each a ModelLoadError naming the node, tensor or field.

They run where a model enters zonnx (``zonnx.ir.io.load_proto`` and the NPU session's own parser), so
no later code meets bytes where it expects text, a tensor whose stored data does not fill its shape,
an attribute of the wrong type, a second writer of a tensor, or a read of a tensor nobody writes.
"""

from __future__ import annotations

__all__ = [
    "MIN_OPSET",
    "check_header",
    "check_names",
    "check_single_writers",
    "check_wiring",
    "check_tensors",
    "check_attributes",
    "check_structure",
]

import math

import onnx
import onnx.defs
import onnx.helper

from zonnx.errors import ModelLoadError, UnsupportedModelError

#: Oldest default-domain opset the opset upgrade can start from.
MIN_OPSET = 7

#: Element types an initializer may have (every TensorProto.DataType but UNDEFINED).
_KNOWN_TYPES = frozenset(v for v in onnx.TensorProto.DataType.values() if v != onnx.TensorProto.UNDEFINED)
#: Types stored two to a byte (and two to an int32_data entry).
_PACKED_4BIT = frozenset(
    getattr(onnx.TensorProto, name)
    for name in ("INT4", "UINT4", "FLOAT4E2M1")
    if hasattr(onnx.TensorProto, name)
)
_COMPLEX = frozenset((onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128))


def check_header(model: onnx.ModelProto, where: str) -> None:
    """The model has an IR version, a graph and opset imports, and versions this onnx build can represent
    (IR and default-domain opset not newer than onnx's, opset not older than ``MIN_OPSET``)."""
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        raise ModelLoadError(
            f"{where}: not an ONNX model (no IR version, graph or opset import found); "
            "give a file written by an ONNX exporter."
        )
    newest_ir = onnx.IR_VERSION
    if model.ir_version > newest_ir:
        raise UnsupportedModelError(
            f"{where}: IR version {model.ir_version} is newer than onnx {onnx.__version__} understands "
            f"(at most {newest_ir}); re-export it with an older exporter setting."
        )
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    newest_opset = onnx.defs.onnx_opset_version()
    if opset > newest_opset:
        raise UnsupportedModelError(
            f"{where}: opset {opset} is newer than supported (at most {newest_opset}); "
            f"re-export it at opset {newest_opset} or lower."
        )
    if 0 < opset < MIN_OPSET:
        raise UnsupportedModelError(
            f"{where}: opset {opset} is too old (zonnx handles opset {MIN_OPSET} and newer); "
            "re-export the model from its source framework at a newer opset."
        )


def _bad_text(value: object) -> bool:
    return isinstance(value, bytes)  # protobuf hands back bytes for a string field that is not UTF-8


def _check_node_names(nodes, scope: str, fail) -> None:  # noqa: ANN001 - repeated NodeProto, callback
    """Names of ``nodes`` and of every graph their attributes hold (If/Loop/Scan bodies), recursively."""
    for i, n in enumerate(nodes):
        label = f"{scope}node #{i}" if _bad_text(n.name) else f"{scope}node {n.name!r}"
        for field, value in (
            ("name", n.name),
            ("op_type", n.op_type),
            ("domain", n.domain),
            ("overload", n.overload),
        ):
            if _bad_text(value):
                fail(f"{scope}node #{i} ({field})", value)
        for value in list(n.input) + list(n.output):
            if _bad_text(value):
                fail(f"{label}: tensor name", value)
        for a in n.attribute:
            if _bad_text(a.name):
                fail(f"{label}: attribute name", a.name)
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _check_graph_names(sub, f"{label}: attribute {a.name!r}: ", fail)


def _check_graph_names(g: onnx.GraphProto, scope: str, fail) -> None:  # noqa: ANN001 - callback
    if _bad_text(g.name):
        fail(f"{scope}the graph name", g.name)
    for kind, values in (("input", g.input), ("output", g.output), ("value_info", g.value_info)):
        for v in values:
            if _bad_text(v.name):
                fail(f"{scope}graph {kind}", v.name)
    for t in g.initializer:
        if _bad_text(t.name):
            fail(f"{scope}initializer", t.name)
    _check_node_names(g.node, scope, fail)


def check_names(model: onnx.ModelProto, where: str) -> None:
    """Every name in the model is text: a string field with invalid UTF-8 (in the main graph, in a
    subgraph of an If/Loop/Scan node, or in a model-local function) is a ModelLoadError naming the node,
    tensor or field (the rule: such bytes never reach code that expects text)."""

    def fail(what: str, value: object) -> None:
        raise ModelLoadError(
            f"{where}: {what} {value!r} is not valid UTF-8; rename it (e.g. with onnx's Python API) and save again."
        )

    for opset in model.opset_import:
        if _bad_text(opset.domain):
            fail("an opset domain", opset.domain)
    _check_graph_names(model.graph, "", fail)
    for f in model.functions:
        scope = "function #" if _bad_text(f.name) or _bad_text(f.domain) else f"function {f.domain}.{f.name}"
        for field, value in (("name", f.name), ("domain", f.domain), ("overload", f.overload)):
            if _bad_text(value):
                fail(f"{scope} ({field})", value)
        for value in list(f.input) + list(f.output) + list(f.attribute):
            if _bad_text(value):
                fail(f"{scope}: input, output or attribute name", value)
        for opset in f.opset_import:
            if _bad_text(opset.domain):
                fail(f"{scope}: an opset domain", opset.domain)
        _check_node_names(f.node, f"{scope}: ", fail)
    for prop in model.metadata_props:
        if _bad_text(prop.key) or _bad_text(prop.value):
            fail("metadata entry", prop.key)


def check_single_writers(model: onnx.ModelProto, where: str) -> None:
    """Each tensor of the main graph has one writer: a graph input, an initializer or one node output.

    A second writer is a ModelLoadError naming the tensor and both writers (ONNX requires SSA form)."""
    writers: dict[str, str] = {}
    for v in model.graph.input:
        writers[v.name] = f"graph input {v.name!r}"
    for t in model.graph.initializer:
        writers.setdefault(t.name, f"initializer {t.name!r}")
    for i, n in enumerate(model.graph.node):
        for out in n.output:
            if not out:
                continue
            me = f"node {n.name or '#' + str(i)!r} ({n.op_type})"
            if out in writers:
                raise ModelLoadError(
                    f"{where}: tensor {out!r} is written by {writers[out]} and by {me}; an ONNX graph gives "
                    "each tensor one writer: rename one of the outputs."
                )
            writers[out] = me


def check_wiring(model: onnx.ModelProto, where: str, *, order: bool = True) -> None:
    """The main graph is well formed: every node input and graph output is produced by a graph input, an
    initializer or a node, and (with ``order``) nodes come in topological order (no node reads a later
    node's output: that is unsorted nodes or a cycle). Otherwise a ModelLoadError naming the node and
    the tensor. Without ``order`` only reads of tensors nobody writes are refused (ORT sorts a graph
    itself, so a model loader need not)."""
    g = model.graph
    known = {v.name for v in g.input} | {t.name for t in g.initializer} | {""}
    if not order:
        known |= {o for n in g.node for o in n.output}
    later = {o: (i, n) for i, n in enumerate(g.node) for o in n.output if o}
    for i, n in enumerate(g.node):
        for name in n.input:
            if name in known:
                continue
            label = f"node {n.name or '#' + str(i)!r} ({n.op_type})"
            if name in later:
                j, writer = later[name]
                raise ModelLoadError(
                    f"{where}: {label} reads {name!r} before node {writer.name or '#' + str(j)!r} writes it "
                    "(nodes out of order or a cycle); the input model is invalid: re-export it."
                )
            raise ModelLoadError(
                f"{where}: {label} reads {name!r}, which no node, input or initializer produces; the input "
                "model is invalid: re-export it."
            )
        known.update(o for o in n.output if o)
    for v in g.output:
        if v.name not in known:
            raise ModelLoadError(
                f"{where}: graph output {v.name!r} is produced by no node; the input model is invalid."
            )
    if not order:
        _check_acyclic(g, where)


def _check_acyclic(g: onnx.GraphProto, where: str) -> None:
    """The nodes can be put in topological order (Kahn's algorithm); otherwise name a node of the cycle."""
    writer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    waiting = [len({writer[x] for x in n.input if x in writer}) for n in g.node]
    readers: dict[int, list[int]] = {}
    for i, n in enumerate(g.node):
        for j in {writer[x] for x in n.input if x in writer}:
            readers.setdefault(j, []).append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for j in readers.get(i, []):
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)
    if done < len(g.node):
        i = next(i for i, count in enumerate(waiting) if count > 0)
        raise ModelLoadError(
            f"{where}: {_label(g.node[i], i)} depends on its own output through a cycle; an ONNX graph is "
            "acyclic: the input model is invalid: re-export it."
        )


def _label(node: onnx.NodeProto, index: int) -> str:
    return f"node {node.name or '#' + str(index)!r} ({node.op_type})"


def _stored_count(t: onnx.TensorProto) -> tuple[int, str] | None:
    """(entries stored, unit) of an initializer with inline data; None for external data."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return None
    if t.data_type != onnx.TensorProto.STRING and t.HasField("raw_data"):
        raw = t.raw_data  # upb copies the bytes on each read: read once
        if raw:
            return len(raw), "bytes of data"
    field = onnx.helper.tensor_dtype_to_field(t.data_type)
    return len(getattr(t, field)), f"{field} entries"


def _expected_count(t: onnx.TensorProto, elements: int, unit: str) -> int:
    """How many stored entries ``elements`` values of ``t``'s type take in ``unit``."""
    if t.data_type == onnx.TensorProto.STRING:
        return elements
    if unit == "bytes of data":
        if t.data_type in _PACKED_4BIT:
            return (elements + 1) // 2
        return elements * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    if t.data_type in _PACKED_4BIT:
        return (elements + 1) // 2
    return elements * 2 if t.data_type in _COMPLEX else elements


def check_tensors(model: onnx.ModelProto, where: str) -> None:
    """Every initializer has a known element type, non-negative dims, and inline data that fills its shape
    exactly (external data is checked by the reader that loads it)."""
    for t in model.graph.initializer:
        if t.data_type not in _KNOWN_TYPES:
            raise ModelLoadError(
                f"{where}: initializer {t.name!r} has element type {t.data_type}, which is not an ONNX type; "
                "the file is corrupt: re-export it."
            )
        if any(d < 0 for d in t.dims):
            raise ModelLoadError(f"{where}: initializer {t.name!r} has a negative dimension {list(t.dims)}.")
        stored = _stored_count(t)
        if stored is None:
            continue
        count, unit = stored
        expected = _expected_count(t, math.prod(t.dims), unit)
        if count != expected:
            raise ModelLoadError(
                f"{where}: initializer {t.name!r} of shape {list(t.dims)} and type "
                f"{onnx.TensorProto.DataType.Name(t.data_type)} needs {expected} {unit} but holds "
                f"{count}; the file is corrupt: re-export it."
            )


def _custom_attribute_types(domain: str, op_type: str) -> dict[str, int] | None:
    """Attribute types of a zonnx custom op (``com.zonnx``), None for an op zonnx does not define."""
    from zonnx.custom_ops.registry import REGISTRY
    from zonnx.custom_ops.schema import ZONNX_DOMAIN

    if domain != ZONNX_DOMAIN or op_type not in REGISTRY:
        return None
    kinds = {int: onnx.AttributeProto.INT, str: onnx.AttributeProto.STRING}
    return {a.name: kinds[a.kind] for a in REGISTRY[op_type].attributes}


def _schema(node: onnx.NodeProto, opsets: dict[str, int]) -> onnx.defs.OpSchema | None:
    """ONNX's schema of ``node`` at the model's opset of its domain, None when ONNX has none."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    version = opsets.get(domain)
    if version is None or not onnx.defs.has(node.op_type, domain):
        return None
    try:
        return onnx.defs.get_schema(node.op_type, version, domain)
    except onnx.defs.SchemaError:
        return None


def _attribute_types(node: onnx.NodeProto, schema: onnx.defs.OpSchema | None) -> dict[str, int] | None:
    """Expected attribute types of ``node`` from its ONNX schema, or zonnx's own op definition."""
    custom = _custom_attribute_types("" if node.domain == "ai.onnx" else node.domain, node.op_type)
    if custom is not None:
        return custom
    return None if schema is None else {name: int(attr.type) for name, attr in schema.attributes.items()}


def _check_arity(node: onnx.NodeProto, schema: onnx.defs.OpSchema, label: str, where: str) -> None:
    """The node has as many inputs and outputs as its schema allows."""
    for kind, count, low, high in (
        ("inputs", len(node.input), schema.min_input, schema.max_input),
        ("outputs", len(node.output), schema.min_output, schema.max_output),
    ):
        if not low <= count <= high:
            allowed = f"{low}" if low == high else f"{low} to {high}" if high < 2**20 else f"at least {low}"
            raise ModelLoadError(
                f"{where}: {label} has {count} {kind}, but {node.op_type} takes {allowed}; the file is corrupt "
                "or hand-edited: re-export it."
            )


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def check_attributes(model: onnx.ModelProto, where: str) -> None:
    """A node whose op has a known schema has as many inputs and outputs as it allows; each attribute
    carries the type that schema declares, and a
    text attribute of such an op is valid UTF-8 (string attributes of other ops may hold any bytes: an
    NPU program is one)."""
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    names = {v: k for k, v in onnx.AttributeProto.AttributeType.items()}
    for i, node in enumerate(model.graph.node):
        schema = _schema(node, opsets)
        if schema is not None:
            _check_arity(node, schema, _label(node, i), where)
        expected = _attribute_types(node, schema) if node.attribute else None
        for a in node.attribute:
            want = None if expected is None else expected.get(a.name)
            if want == onnx.AttributeProto.STRING and a.type == want and not _is_utf8(a.s):
                raise ModelLoadError(
                    f"{where}: {_label(node, i)}: attribute {a.name!r} is not valid UTF-8 text; the file is "
                    "corrupt or hand-edited: re-export it."
                )
            if a.type == onnx.AttributeProto.UNDEFINED or (want is not None and a.type != want):
                raise ModelLoadError(
                    f"{where}: {_label(node, i)}: attribute {a.name!r} is of type {names.get(a.type, a.type)}"
                    + (f", but {node.op_type} takes {names.get(want, want)}" if want is not None else "")
                    + "; the file is corrupt or hand-edited: re-export it."
                )


def check_structure(model: onnx.ModelProto, where: str, *, order: bool = False) -> None:
    """Every check above, in the order a corrupt file is best explained (header and names first, wiring
    last)."""
    check_header(model, where)
    check_names(model, where)
    check_single_writers(model, where)
    check_tensors(model, where)
    check_attributes(model, where)
    check_wiring(model, where, order=order)
