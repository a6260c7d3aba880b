"""The compiled-model format: an ONNX file whose NPU subgraphs are single ``com.zonnx::NpuSubgraph`` nodes.

In the spirit of ONNX Runtime's EPContext models, compiling replaces each NPU subgraph of a quantized
model by one node (domain ``com.zonnx``, op type ``NpuSubgraph``) that carries the compiled program:

- attributes ``program`` (the ``Program.to_bytes()`` blob), ``target``, ``program_version`` (its format
  version), ``cache_key`` (the key of the compilation), ``program_sha256`` (checked when read) and
  ``subgraph_id``;
- inputs and outputs are the subgraph's integer boundary tensors. In the FixNeuron form a boundary
  tensor is a float exactly on its power-of-two grid, so a CPU ``QuantizeLinear`` turns it into codes
  before the node (``<name>__npu_q``) and a CPU ``DequantizeLinear`` turns the node's codes back after it;
  both are exact. CPU nodes, including the boundary Q/DQ, stay as they are.

The model's metadata says it is compiled (``zonnx.compiled``), for which target, by which zonnx, from
which source (``zonnx.source_sha256``) and holds the partition report (``zonnx.partition``, the JSON of
``partition.to_dict``). Weights only the NPU read are dropped (they live in the programs). The file is a
valid ONNX protobuf (Netron opens it); ``onnx.checker`` accepts it since ``com.zonnx`` ops have no schema
there. To run it, ``lower_npu_nodes`` replaces each node by ORT-native ops (see ``zonnx.backend.session``).
"""

from __future__ import annotations

__all__ = [
    "NPU_DOMAIN",
    "NPU_OP",
    "META_PREFIX",
    "CompiledModelError",
    "build_compiled_model",
    "is_compiled",
    "npu_nodes",
    "read_program",
    "compiled_info",
    "partition_from_dict",
    "lower_npu_nodes",
    "toposort",
]

import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from zonnx.backend.compiler.params import node_attrs
from zonnx.backend.compiler.program import FORMAT_VERSION, Program, ProgramFormatError, TensorInfo
from zonnx.backend.graph_reads import drop_unused_initializers, node_reads
from zonnx.backend.partition import Partition, Subgraph, to_dict
from zonnx.errors import ZonnxError

logger = logging.getLogger(__name__)

NPU_DOMAIN = "com.zonnx"
NPU_OP = "NpuSubgraph"
META_PREFIX = "zonnx."
_INT_TYPES = {
    "int8": onnx.TensorProto.INT8,
    "uint8": onnx.TensorProto.UINT8,
    "int16": onnx.TensorProto.INT16,
    "uint16": onnx.TensorProto.UINT16,
    "int32": onnx.TensorProto.INT32,
    "uint32": onnx.TensorProto.UINT32,
    "int64": onnx.TensorProto.INT64,
}
_QUANTIZERS = {"QuantizeLinear", "VitisQuantizeLinear"}


class CompiledModelError(ZonnxError):
    """A compiled model is malformed, corrupt or stale (recompile it from the quantized model)."""


#: Ops whose output has the element type of their first input (ONNX type constraint T -> T): codes
#: moved by one (a TFLite model's Transpose after its input quantize) are still codes.
_SAME_TYPE_OPS = {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Slice", "Gather",
                  "Concat", "Split", "MaxPool", "Pad", "DepthToSpace", "SpaceToDepth", "Expand", "Tile"}  # fmt: skip


def _is_integer_tensor(name: str, producers: dict[str, onnx.NodeProto], inputs: dict[str, int]) -> bool:
    """An integer tensor in the source model: a quantizer's output or an integer graph input, or the
    output of a same-type op (``_SAME_TYPE_OPS``) whose first input is one."""
    while True:
        if name in inputs:
            return inputs[name] in _INT_TYPES.values()
        prod = producers.get(name)
        if prod is None or prod.op_type not in _SAME_TYPE_OPS or not prod.input:
            return prod is not None and prod.op_type in _QUANTIZERS
        name = prod.input[0]


def _grid_consts(info: TensorInfo, prefix: str) -> tuple[str, str, list[onnx.TensorProto]]:
    if len(info.scale) != 1:
        raise CompiledModelError(
            f"NPU boundary tensor {info.name!r} has per-channel scales; boundaries must be per-tensor."
        )
    scale = numpy_helper.from_array(np.asarray(info.scale[0], np.float32), f"{prefix}_scale")
    zp = numpy_helper.from_array(np.asarray(info.zero_point[0], info.dtype), f"{prefix}_zero_point")
    return scale.name, zp.name, [scale, zp]


def _float_boundary(info: TensorInfo, src: str, dst: str, to_codes: bool) -> tuple[list, list]:
    """CPU nodes converting an on-grid float tensor to codes (QuantizeLinear) or back (DequantizeLinear)."""
    if info.dtype not in ("int8", "uint8"):
        raise CompiledModelError(
            f"NPU boundary tensor {info.name!r} is a float on a {info.dtype} grid; only 8-bit float "
            "boundaries are supported (quantize it with QuantizeLinear in the model)."
        )
    s, z, inits = _grid_consts(info, dst)
    op = "QuantizeLinear" if to_codes else "DequantizeLinear"
    return [helper.make_node(op, [src, s, z], [dst], name=f"{dst}_{op}")], inits


def build_compiled_model(
    source: onnx.ModelProto,
    partition: Partition,
    programs: list[Program],
    *,
    cache_key: str = "",
    source_sha256: str = "",
    version: str = "",
    source_path: str = "",
) -> onnx.ModelProto:
    """The compiled model: ``source`` (nodes named) with each subgraph of ``partition`` replaced by its node.

    Metadata records the quantized source's path (``source``, when known) and carries over the float
    model's path the quantizer recorded (``float_source``), for ``zonnx run --compare golden``.
    """
    model = onnx.ModelProto()
    model.CopyFrom(source)
    g = model.graph
    producers = {o: n for n in g.node for o in n.output}
    g_inputs = {i.name: i.type.tensor_type.elem_type for i in g.input}
    on_npu = {name for s in partition.subgraphs for name in s.node_names} - set(partition.cpu_nodes)
    nodes = [n for n in g.node if n.name not in on_npu]
    inits: list[onnx.TensorProto] = []
    infos: list[onnx.ValueInfoProto] = []
    # A float boundary tensor read by several subgraphs, or written by one and read by another, gets
    # one codes tensor ``{t}__npu_q``: made once by a boundary quantize, or taken from the writer.
    made: set[str] = set()
    npu_made = {
        f"{info.name}__npu_q"
        for prog in programs
        for info in prog.outputs
        if not _is_integer_tensor(info.name, producers, g_inputs)
    }
    for sub, prog in zip(partition.subgraphs, programs, strict=True):
        blob = prog.to_bytes()
        ins, outs = [], []
        for info in prog.inputs:
            if _is_integer_tensor(info.name, producers, g_inputs):
                ins.append(info.name)
                continue
            q = f"{info.name}__npu_q"
            if q not in made and q not in npu_made:
                new, more = _float_boundary(info, info.name, q, to_codes=True)
                nodes += new
                inits += more
                made.add(q)
            ins.append(q)
        for info in prog.outputs:
            if _is_integer_tensor(info.name, producers, g_inputs):
                outs.append(info.name)
                continue
            q = f"{info.name}__npu_q"
            new, more = _float_boundary(info, q, info.name, to_codes=False)
            nodes += new
            inits += more
            outs.append(q)
            infos.append(helper.make_tensor_value_info(q, _INT_TYPES[info.dtype], info.shape))
        nodes.append(
            helper.make_node(
                NPU_OP,
                ins,
                outs,
                name=f"npu_subgraph_{sub.id}",
                domain=NPU_DOMAIN,
                doc_string=f"NPU subgraph {sub.id}: {len(sub.node_names)} nodes, {sub.ops} ops, {sub.macs} MACs",
                program=blob,
                target=prog.target,
                program_version=prog.version,
                cache_key=cache_key,
                program_sha256=hashlib.sha256(blob).hexdigest(),
                subgraph_id=sub.id,
            )
        )
    del g.node[:]
    g.node.extend(toposort(nodes, {i.name for i in g.input} | {t.name for t in g.initializer}))
    g.initializer.extend(inits)
    drop_unused_initializers(g)  # keeps what If/Loop bodies read from the outer scope
    used = {i for n in g.node for i in node_reads(n)}
    present = used | {o for n in g.node for o in n.output}
    vis = [v for v in g.value_info if v.name in present]
    del g.value_info[:]
    g.value_info.extend(vis + infos)
    if not any(o.domain == NPU_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(NPU_DOMAIN, 1))
    meta = {
        "compiled": "1",
        "target": partition.target,
        "version": version,
        "cache_key": cache_key,
        "source_sha256": source_sha256,
        "program_version": str(FORMAT_VERSION),
        "partition": json.dumps(to_dict(partition), separators=(",", ":")),
    }
    if source_path:
        meta["source"] = source_path
    float_source = {p.key: p.value for p in source.metadata_props}.get(META_PREFIX + "float_source")
    if float_source:
        meta["float_source"] = float_source
    kept_props = [p for p in model.metadata_props if not p.key.startswith(META_PREFIX)]
    del model.metadata_props[:]
    model.metadata_props.extend(kept_props)
    for k, v in meta.items():
        model.metadata_props.add(key=META_PREFIX + k, value=v)
    return model


def toposort(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """Nodes in a topological order (stable: the given order wherever it is already valid)."""
    produced = {o for n in nodes for o in n.output}
    ready = set(available) | {""}
    out, pending = [], list(nodes)
    while pending:
        rest = []
        for n in pending:
            if all(i in ready or i not in produced for i in node_reads(n)):
                out.append(n)
                ready.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            raise CompiledModelError(f"the graph has a cycle through node {rest[0].name!r}.")
        pending = rest
    return out


def is_compiled(model: onnx.ModelProto) -> bool:
    """True when the model holds at least one NpuSubgraph node."""
    return any(n.op_type == NPU_OP and n.domain == NPU_DOMAIN for n in model.graph.node)


def npu_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == NPU_OP and n.domain == NPU_DOMAIN]


def read_program(node: onnx.NodeProto) -> Program:
    """The node's Program, after checking its hash and version; CompiledModelError when corrupt or stale."""
    a = node_attrs(node)
    blob = a.get("program")
    if isinstance(blob, onnx.TensorProto):  # saved with external data (``compiled_store``), loaded
        if blob.data_location == onnx.TensorProto.EXTERNAL:
            raise CompiledModelError(
                f"node {node.name!r}: its program is in external data that was not loaded; open the model "
                "with zonnx.ir.io.load_proto (or onnx.load) from its folder."
            )
        blob = blob.raw_data
    if not isinstance(blob, bytes):
        raise CompiledModelError(f"node {node.name!r}: no 'program' attribute; recompile the model.")
    digest = a.get("program_sha256", b"")
    digest = digest.decode() if isinstance(digest, bytes) else str(digest)
    if digest and hashlib.sha256(blob).hexdigest() != digest:
        raise CompiledModelError(
            f"node {node.name!r}: its program does not match its sha256 (corrupted); recompile the model."
        )
    if a.get("program_version") != FORMAT_VERSION:
        raise CompiledModelError(
            f"node {node.name!r}: program format version {a.get('program_version')}, this zonnx reads "
            f"{FORMAT_VERSION}; recompile the model."
        )
    try:
        return Program.from_bytes(blob)
    except ProgramFormatError as e:
        raise CompiledModelError(f"node {node.name!r}: {e}") from None


def compiled_info(model: onnx.ModelProto) -> dict[str, str]:
    """The ``zonnx.*`` metadata of a compiled model, without the prefix."""
    n = len(META_PREFIX)
    return {p.key[n:]: p.value for p in model.metadata_props if p.key.startswith(META_PREFIX)}


def partition_from_dict(data: dict[str, Any]) -> Partition:
    """Rebuild a ``Partition`` from ``to_dict`` output (for a compiled model's report)."""
    s = data["summary"]
    return Partition(
        target=data["target"],
        subgraphs=[
            Subgraph(g["id"], g["nodes"], g["inputs"], g["outputs"], g["macs"], g["ops"])
            for g in data["subgraphs"]
        ],
        cpu_nodes={c["node"]: c["reason"] for c in data["cpu_nodes"]},
        rules={c["node"]: c["rule"] for c in data["cpu_nodes"]},
        total_nodes=s["total_nodes"],
        npu_nodes=s["npu_nodes"],
        total_ops=s["total_ops"],
        npu_ops=s["npu_ops"],
        total_macs=s["total_macs"],
        npu_macs=s["npu_macs"],
        min_nodes=data["min_nodes"],
        min_macs=data.get("min_macs", 0),
        advice=data.get("advice", ""),
    )


def _name(x: Any) -> str:
    return x if isinstance(x, str) else x.name


def lower_npu_nodes(model: onnx.ModelProto, lower: Callable[..., Any], *, opset: int) -> onnx.ModelProto:
    """A copy of a compiled model with every NpuSubgraph node replaced by ``lower(program, name=, opset=)``.

    ``lower`` returns an object with ``nodes``, ``initializers``, ``functions``, ``inputs`` and
    ``outputs`` (names or ValueInfoProtos, in program order); the node's own tensor names are wired to
    them by renaming, so the result is one plain ORT model.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    nodes: list[onnx.NodeProto] = []
    domains = {o.domain for o in out.opset_import}
    have_fn = {(f.domain, f.name) for f in out.functions}
    for node in model.graph.node:
        if not (node.op_type == NPU_OP and node.domain == NPU_DOMAIN):
            nodes.append(node)
            continue
        low = lower(read_program(node), name=node.name, opset=opset)
        rename = {_name(a): b for a, b in zip(low.inputs, node.input, strict=True)}
        rename |= {_name(a): b for a, b in zip(low.outputs, node.output, strict=True)}
        for n in low.nodes:
            m = onnx.NodeProto()
            m.CopyFrom(n)
            m.input[:] = [rename.get(i, i) for i in m.input]
            m.output[:] = [rename.get(o, o) for o in m.output]
            nodes.append(m)
        g.initializer.extend(low.initializers)
        for d, v in getattr(low, "opset_imports", {}).items():
            if d not in domains:  # e.g. com.microsoft for NhwcMaxPool / QLinearAdd
                out.opset_import.append(helper.make_opsetid(d, v))
                domains.add(d)
        for f in low.functions:
            if (f.domain, f.name) not in have_fn:
                out.functions.append(f)
                have_fn.add((f.domain, f.name))
            for o in f.opset_import:
                if o.domain not in domains:
                    out.opset_import.append(helper.make_opsetid(o.domain, o.version))
                    domains.add(o.domain)
            if f.domain not in domains:
                out.opset_import.append(helper.make_opsetid(f.domain, 1))
                domains.add(f.domain)
    del g.node[:]
    g.node.extend(nodes)
    drop_unused_initializers(g)
    return out
