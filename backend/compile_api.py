"""``compile_model(model, target)``: partition a quantized model, compile its NPU subgraphs, build the compiled model.

Steps: name every node (the partitioner's keys become node names, so partition and compiler agree);
``propose`` + ``partition``; for the FixNeuron form, a FixNeuron that quantizes a subgraph input from
the float tensor before it stays on the CPU (it is the boundary quantize) and the subgraph reads its
on-grid output; ``compile_subgraph`` per subgraph (a subgraph that fails to compile goes back to the
CPU with the compiler's message as its reason, rule ``compile``); ``build_compiled_model``.
A model without quantizers is refused with the command that quantizes it.
"""

from __future__ import annotations

__all__ = ["CompiledModel", "compile_model", "prepare_source", "not_quantized_message", "fix_input_shapes"]

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from zonnx import __version__
from zonnx.backend.compiled import (
    build_compiled_model,
    compiled_info,
    npu_nodes,
    partition_from_dict,
    read_program,
)
from zonnx.backend.compiled_store import needs_external, save_compiled
from zonnx.backend.compiler import CompileError, Program
from zonnx.backend.compiler.lower import compile_subgraph
from zonnx.backend.partition import (
    Partition,
    check_coverage,
    coverage_advice,
    format_partition,
    partition,
    propose,
)
from zonnx.backend.partition.capability import node_keys
from zonnx.backend.partition.coverage import dynamic_advice
from zonnx.backend.partition.partitioner import MIN_MACS
from zonnx.backend.targets import Target, load_target
from zonnx.converters.from_onnx import set_input_dims
from zonnx.errors import UnsupportedModelError
from zonnx.ir.io import check_structure, external_data_locations, load_proto, save_model, to_proto
from zonnx.ir.large import is_large, model_digest
from zonnx.passes.catalog import make_pass

logger = logging.getLogger(__name__)

_FIX = ("FixNeuron", "VitisQuantizeLinear")


@dataclasses.dataclass
class CompiledModel:
    """A compiled model (``model``, an ONNX ModelProto), its partition, programs and timing."""

    model: onnx.ModelProto
    partition: Partition
    programs: list[Program]
    target: str
    cache_key: str = ""
    seconds: float = 0.0
    #: The source kept its weights in external data: the compiled model does too (``save``).
    external_data: bool = False

    def wants_external(self) -> bool:
        """Saved with external data: the source had it, or the model passes the protobuf limit."""
        return self.external_data or needs_external(self.model)

    def save(self, path: str | Path, *, external_data: bool | None = None) -> Path:
        """Write the model: inline when it fits one protobuf and its source was inline, else (or with
        ``external_data``) with its weights and stored executable in ``NAME.onnx.data`` (``compiled_store``)."""
        if external_data or (external_data is None and self.wants_external()):
            return save_compiled(self.model, path)
        return save_model(self.model, path, external_data=False)

    def report(self, width: int = 160) -> str:
        """The partition tables plus one line per compiled program."""
        lines = [format_partition(self.partition, width).rstrip()]
        for sub, prog in zip(self.partition.subgraphs, self.programs, strict=True):
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(prog.op_counts().items()))
            lines.append(f"subgraph {sub.id}: {len(prog.ops)} NPU ops ({kinds})")
        lines.append(f"compiled in {self.seconds:.2f} s")
        return "\n".join(lines)

    @classmethod
    def from_proto(cls, model: onnx.ModelProto) -> CompiledModel:
        """Wrap an already compiled model (programs are read from its nodes)."""
        info = compiled_info(model)
        part = partition_from_dict(json.loads(info["partition"]))
        return cls(model, part, [read_program(n) for n in npu_nodes(model)], info.get("target", ""))


def not_quantized_message(where: str) -> str:
    stem = Path(where).stem if where.endswith(".onnx") else "model"
    src = where if where.endswith(".onnx") else "model.onnx"
    return (
        f"{where}: the model is not quantized (no QuantizeLinear/DequantizeLinear or FixNeuron nodes) and "
        f"the NPU runs integer models. Quantize first: zonnx quantize {src} {stem}_int8.onnx --calib DATA "
        "--target TARGET (or zonnx.quantize_static); or pass provider option fallback='cpu' to run "
        "everything on the CPU."
    )


def prepare_source(model: Any) -> tuple[onnx.ModelProto, bytes]:
    """(a ModelProto copy whose every node has a unique name, the source bytes for hashing)."""
    if isinstance(model, bytes | bytearray):
        data = bytes(model)
        proto = onnx.ModelProto()
        proto.ParseFromString(data)
        check_structure(proto, "model bytes", order=True)
    else:
        proto = load_proto(model) if isinstance(model, str | Path) else to_proto(model)
        data = proto.SerializeToString() if not is_large(proto) else model_digest(proto).encode()
        if not isinstance(model, str | Path):
            copy = onnx.ModelProto()
            copy.CopyFrom(proto)
            proto = copy
    try:  # shapes for the programs (the lowering reads them); best effort
        proto = onnx.shape_inference.infer_shapes(proto)
    except Exception as e:  # onnx raises several types on unusual models; say what it costs
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        logger.warning(
            "compile: onnx shape inference failed (%s); the partitioner and lowering see only the "
            "model's own shape annotations, so layers of unknown shape may stay on the CPU",
            first,
        )
    keys = node_keys(ir.serde.deserialize_graph(proto.graph))
    for node, key in zip(proto.graph.node, keys.values(), strict=True):
        node.name = key
    return proto, data


def fix_input_shapes(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """Fix the named inputs' dims (``convert --input-shape``'s rule) and fold the shape arithmetic that
    becomes constant (Shape -> Gather -> Concat -> Reshape chains); quantizers keep their constants."""
    fixed = set_input_dims(proto, shapes)
    model = ir.serde.deserialize_model(fixed)
    for name in ("shape-inference", "constant-folding", "dead-code", "shape-inference"):
        make_pass(name)(model)
    out = ir.serde.serialize_model(model)
    logger.info("input shapes fixed: %s", ", ".join(f"{k}={list(v)}" for k, v in shapes.items()))
    return out


def _fixneuron_boundaries(proto: onnx.ModelProto, part: Partition) -> None:
    """Move input-side FixNeurons of each subgraph to the CPU; the subgraph reads their outputs."""
    by_name = {n.name: n for n in proto.graph.node}
    consts = {t.name for t in proto.graph.initializer}
    for sub in part.subgraphs:
        for i, name in enumerate(list(sub.inputs)):
            fix = [
                by_name[n]
                for n in sub.node_names
                if by_name[n].op_type in _FIX and by_name[n].input[0] == name and name not in consts
            ]
            if len(fix) != 1:
                continue
            node = fix[0]
            sub.node_names.remove(node.name)
            sub.inputs[i] = node.output[0]
            if node.name not in part.cpu_nodes:
                part.npu_nodes -= 1
            part.cpu_nodes[node.name] = (
                f"boundary quantize: {node.op_type} {node.name!r} quantizes {name!r}, which no NPU op "
                "produces; it runs on the CPU and the NPU reads its output"
            )
            part.rules[node.name] = "boundary"


def _drop(part: Partition, index: int, reason: str) -> None:
    sub = part.subgraphs.pop(index)
    for name in sub.node_names:
        if name not in part.cpu_nodes:
            part.npu_nodes -= 1
            part.cpu_nodes[name] = reason
            part.rules[name] = "compile"
    part.npu_ops -= sub.ops
    part.npu_macs -= sub.macs


def compile_model(
    model: Any,
    target: str | Path | Target = "dpu-b4096",
    *,
    min_nodes: int = 2,
    min_macs: int = MIN_MACS,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    cache_key: str = "",
    strict: bool = False,
) -> CompiledModel:
    """Partition and compile a quantized model (path, bytes, ModelProto or ir.Model) for ``target``.

    ``input_shapes`` fixes input dims and folds the shape arithmetic they make constant
    (``fix_input_shapes``). A partition that leaves the NPU (nearly) idle is logged as a warning with its
    cause and fix (``coverage``); ``strict`` raises ``LowCoverageError`` instead. Raises
    UnsupportedModelError for a model without quantizers (with the quantize command), OptionError for an
    unknown target (listing the known ones).
    """
    start = time.perf_counter()
    tgt = load_target(target)
    where = str(model) if isinstance(model, str | Path) else "model"
    proto, data = prepare_source(model)
    if input_shapes:
        proto = fix_input_shapes(proto, input_shapes)
    ir_model = ir.serde.deserialize_model(proto)
    capability = propose(ir_model, tgt, input_shapes=input_shapes)
    if not capability.quantized:
        raise UnsupportedModelError(not_quantized_message(where))
    part = partition(ir_model, capability, min_nodes=min_nodes, min_macs=min_macs)
    _fixneuron_boundaries(proto, part)
    programs: list[Program] = []
    dynamic_inputs = [n for n in capability.notes if n.startswith("input ")] if not input_shapes else []
    index = 0
    while index < len(part.subgraphs):
        sub = part.subgraphs[index]
        try:
            programs.append(compile_subgraph(proto, sub.node_names, sub.inputs, sub.outputs, tgt))
        except CompileError as e:
            hint = ""
            if dynamic_inputs:
                hint = (
                    f" The model has dynamic input dims ({'; '.join(dynamic_inputs[:2])}): fixing them with "
                    "--input-shape NAME:DIMS (provider option input_shapes) folds shape arithmetic to constants."
                )
            logger.warning("subgraph %d stays on the CPU: %s%s", sub.id, e, hint)
            _drop(part, index, f"compile: {e}")
            continue
        index += 1
    part.advice = coverage_advice(part, capability, tgt)
    check_coverage(part.advice, where, strict=strict)
    dynamic = dynamic_advice(part, capability)
    if dynamic and not part.advice:
        logger.warning("%s: %s", where, dynamic)
    compiled = build_compiled_model(
        proto,
        part,
        programs,
        cache_key=cache_key,
        source_sha256=hashlib.sha256(data).hexdigest(),
        version=__version__,
        source_path=str(Path(model).resolve()) if isinstance(model, str | Path) else "",
    )
    seconds = time.perf_counter() - start
    logger.info("compiled %s for %s in %.2f s", where, tgt.name, seconds)
    external = isinstance(model, str | Path) and bool(
        external_data_locations(load_proto(model, load_external_data=False))
    )
    return CompiledModel(compiled, part, programs, tgt.name, cache_key, seconds, external)
