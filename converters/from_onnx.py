"""ONNX frontend: fix or name input dims, cut a subgraph between named tensors, clean, and check the result
against the original model in ORT (for a cut, against the original's intermediate tensors).
"""

from __future__ import annotations

__all__ = ["from_onnx", "convert_onnx", "input_dims", "set_input_dims", "cut_model"]

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from zonnx.backend.graph_reads import node_reads
from zonnx.converters.common import (
    DEFAULT_MIN_COSINE,
    ConversionError,
    ConversionResult,
    SourceInfo,
    check_against_source,
    finish,
)
from zonnx.errors import OptionError, VerificationError, did_you_mean
from zonnx.ir.io import default_opset, load_proto, to_ir, to_proto
from zonnx.ir.large import copy_model
from zonnx.passes.common.shape_inference import ShapeInferencePass
from zonnx.verify import make_inputs, run_ort

logger = logging.getLogger(__name__)

Dim = int | str


def input_dims(vi: onnx.ValueInfoProto) -> list[Dim | None]:
    """Declared dims: a positive number, a symbol name, or None (unknown)."""
    out: list[Dim | None] = []
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            out.append(d.dim_value)
        else:
            out.append(d.dim_param if d.HasField("dim_param") and d.dim_param not in ("", "?") else None)
    return out


def _fmt(dims: Sequence[Dim | None]) -> str:
    return ",".join("?" if d is None else str(d) for d in dims)


def _set_dim(dim: onnx.TensorShapeProto.Dimension, value: Dim) -> None:
    if isinstance(value, int):
        dim.dim_value = value
    else:
        dim.dim_param = value


def set_input_dims(model: onnx.ModelProto, shapes: Mapping[str, Sequence[Dim]]) -> onnx.ModelProto:
    """Fix (a number) or name (a string) every dim of the named inputs; returns a copy.

    The rule: a fixed dim of the model can only be given its own size; a symbol replaced here is
    replaced in the outputs too; stale intermediate shapes are dropped (the clean pipeline re-infers them).
    """
    out = copy_model(model)
    inputs = {vi.name: vi for vi in out.graph.input}
    renamed: dict[str, Dim] = {}
    for name, shape in shapes.items():
        if name not in inputs:
            raise OptionError(
                f"input shape given for {name!r}, which is not an input of the model."
                f"{did_you_mean(name, inputs)} Its inputs are {list(inputs)}."
            )
        vi = inputs[name]
        declared = input_dims(vi)
        shape = list(shape)
        bad = len(shape) != len(declared) or any(
            isinstance(d, int) and isinstance(s, int) and d != s
            for d, s in zip(declared, shape, strict=False)
        )
        if bad or any(isinstance(s, int) and s <= 0 for s in shape):
            raise OptionError(
                f"input shape {name}:{_fmt(shape)} does not fit the model's input {name!r} "
                f"({_fmt(declared)}); give one size per dimension and keep the fixed ones."
            )
        for dim, old, new in zip(vi.type.tensor_type.shape.dim, declared, shape, strict=True):
            if isinstance(old, str):
                renamed[old] = new
            _set_dim(dim, new)
    for vi in out.graph.output:
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in renamed:
                _set_dim(dim, renamed[dim.dim_param])
    del out.graph.value_info[:]
    return out


def _typed(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]] | None) -> onnx.ModelProto:
    """The model with a value_info for every tensor zonnx's shape inference can type."""
    ir_model = to_ir(copy_model(model))
    ShapeInferencePass(shapes=shapes)(ir_model)
    return to_proto(ir_model)


def cut_model(
    model: onnx.ModelProto,
    inputs: Sequence[str] | None,
    outputs: Sequence[str] | None,
    *,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> onnx.ModelProto:
    """The subgraph that computes ``outputs`` from ``inputs`` (tensor names; None keeps the model's own).

    Original graph inputs the subgraph still needs stay inputs. Unknown names, or outputs that do not
    depend on the given inputs, are OptionErrors naming the tensor.
    """
    typed = _typed(model, shapes)
    g = typed.graph
    producer = {o: n for n in g.node for o in n.output if o}
    inits = {t.name for t in g.initializer}
    graph_inputs = [vi.name for vi in g.input if vi.name not in inits]
    known = set(producer) | set(graph_inputs)
    in_names = list(inputs) if inputs else graph_inputs
    out_names = list(outputs) if outputs else [o.name for o in g.output]
    for kind, names in (("--inputs", in_names), ("--outputs", out_names)):
        for name in names:
            if name not in known:
                raise OptionError(
                    f"{kind}: the model has no tensor {name!r}.{did_you_mean(name, known)} "
                    "List tensor names with a viewer such as Netron."
                )
    needed, stack, seen = [], list(out_names), set(in_names)
    while stack:
        name = stack.pop()
        if name in seen or name in inits or not name:
            continue
        seen.add(name)
        node = producer.get(name)
        if node is None:
            continue  # an original graph input the cut still reads
        needed.append(node)
        stack.extend(node_reads(node))
    used = {x for n in needed for x in node_reads(n)} | set(out_names)
    unused = [n for n in in_names if n not in used]
    if unused:
        raise OptionError(
            f"--inputs: tensor(s) {unused} are not needed to compute {out_names}; give inputs "
            "that lie between the model's inputs and the chosen outputs."
        )
    vis = {vi.name: vi for vi in [*g.input, *g.value_info, *g.output]}
    new_inputs = in_names + [n for n in graph_inputs if n in used and n not in in_names]
    for name in new_inputs + out_names:
        if (
            name not in vis
            or not vis[name].type.HasField("tensor_type")
            or not vis[name].type.tensor_type.elem_type
        ):
            raise OptionError(
                f"tensor {name!r}: its type cannot be inferred, so it cannot be a cut point; "
                "choose a neighbouring tensor."
            )
    order = {id(n): i for i, n in enumerate(g.node)}
    graph = onnx.helper.make_graph(
        sorted(needed, key=lambda n: order[id(n)]),
        g.name,
        [vis[n] for n in new_inputs],
        [vis[n] for n in out_names],
        [t for t in g.initializer if t.name in used],
    )
    produced = {o for n in needed for o in n.output} - set(out_names)
    graph.value_info.extend(vi for vi in g.value_info if vi.name in produced)
    cut = onnx.helper.make_model(graph, opset_imports=list(typed.opset_import), ir_version=typed.ir_version)
    cut.functions.extend(typed.functions)
    for p in typed.metadata_props:
        cut.metadata_props.add(key=p.key, value=p.value)
    return cut


def _with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of the model that also outputs the given intermediate tensors."""
    out = copy_model(model)
    present = {o.name for o in out.graph.output}
    out.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names if n not in present)
    return out


def _generated_feeds(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]] | None) -> list[dict]:
    """Two samples at the base sizes, and one with every symbolic input dim doubled (when there is one)."""
    feeds = [make_inputs(model, seed=s, shapes=shapes) for s in (0, 1)]
    doubled = {}
    for vi in model.graph.input:
        if vi.name in feeds[0]:
            base = feeds[0][vi.name].shape
            doubled[vi.name] = tuple(
                s if isinstance(d, int) else 2 * s for d, s in zip(input_dims(vi), base, strict=True)
            )
    if any(doubled[n] != feeds[0][n].shape for n in doubled):
        feeds.append(make_inputs(model, seed=2, shapes=doubled))
    return feeds


def convert_onnx(
    model: str | os.PathLike[str] | onnx.ModelProto,
    *,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    input_shapes: Mapping[str, Sequence[Dim]] | None = None,
    opset: int = 17,
    check: bool = True,
    check_inputs: Sequence[Mapping[str, np.ndarray]] | None = None,
    min_cosine: float = DEFAULT_MIN_COSINE,
    source: str | None = None,
    framework: tuple[str, str] | None = None,
    options: Mapping[str, Any] | None = None,
) -> tuple[ConversionResult, onnx.ModelProto]:
    """``from_onnx`` that also returns the model it started from (for before/after op counts)."""
    original = model if isinstance(model, onnx.ModelProto) else load_proto(model)
    src = source or (str(model) if not isinstance(model, onnx.ModelProto) else "<ModelProto>")
    shaped = set_input_dims(original, input_shapes) if input_shapes else original
    fixed = {k: tuple(v) for k, v in (input_shapes or {}).items() if all(isinstance(d, int) for d in v)}
    cut = cut_model(shaped, inputs, outputs, shapes=fixed or None) if inputs or outputs else shaped
    in_names = [vi.name for vi in cut.graph.input if vi.name not in {t.name for t in cut.graph.initializer}]
    out_names = [o.name for o in cut.graph.output]
    producer = f"{original.producer_name} {original.producer_version}".strip()
    fw = framework or (
        "onnx",
        f"opset {default_opset(original)}" + (f", from {producer}" if producer else ""),
    )
    info = SourceInfo(
        src,
        fw[0],
        fw[1],
        {
            "inputs": list(inputs or []),
            "outputs": list(outputs or []),
            "opset": opset,
            "input_shapes": {k: list(v) for k, v in (input_shapes or {}).items()},
            **dict(options or {}),
        },
    )
    cleaned = finish(cut, info, opset=opset, input_names=in_names, output_names=out_names)
    checks = []
    if check:
        graph_inputs = [
            vi.name for vi in shaped.graph.input if vi.name not in {t.name for t in shaped.graph.initializer}
        ]
        for feeds in check_inputs or ():
            if sorted(feeds) != sorted(graph_inputs):
                raise OptionError(
                    f"--test-input holds {sorted(feeds)}, but the model's inputs are {graph_inputs}; "
                    "give one array per input, keyed by input name."
                )
        feeds_list = list(check_inputs) if check_inputs else _generated_feeds(shaped, fixed or None)
        checks = _check_with_original(
            shaped, cleaned, feeds_list, in_names, out_names, min_cosine, given=bool(check_inputs)
        )
    return ConversionResult(cleaned, checks, info), original


def _check_with_original(
    original: onnx.ModelProto,
    model: onnx.ModelProto,
    feeds_list: Sequence[Mapping],
    in_names: Sequence[str],
    out_names: Sequence[str],
    min_cosine: float,
    *,
    given: bool = False,
) -> list:
    """Run the original (exposing the cut tensors) on each feed; the cut model gets its intermediate tensors.

    Rule: the original failing on the first feed or on any ``given`` one (--test-input) is an error; on
    a generated feed (another size of a dynamic dim) it is skipped with one warning saying how many were
    checked.
    """
    probe = _with_outputs(original, [*in_names, *out_names])
    cut_feeds, refs, skipped = [], {}, []
    for i, feeds in enumerate(feeds_list):
        try:
            values = run_ort(probe, feeds)
        except VerificationError as e:
            if i == 0 or given:
                which = f"test input {i + 1}" if given else "the check inputs"
                raise ConversionError(f"the original model does not run on {which}: {e}") from None
            skipped.append(f"sample {i} ({e})")
            continue
        sample = {n: values.get(n, feeds.get(n)) for n in in_names}
        cut_feeds.append(sample)
        refs[id(sample)] = {n: values[n] for n in out_names}
    if skipped:
        logger.warning(
            "conversion check: the original model fails on %d generated sample(s), not checked: %s; "
            "checked %d of %d",
            len(skipped),
            "; ".join(skipped),
            len(cut_feeds),
            len(feeds_list),
        )
    return check_against_source(model, lambda f: refs[id(f)], cut_feeds, min_cosine=min_cosine)


def from_onnx(
    model: str | os.PathLike[str] | onnx.ModelProto,
    *,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    input_shapes: Mapping[str, Sequence[Dim]] | None = None,
    opset: int = 17,
    check: bool = True,
    check_inputs: Sequence[Mapping[str, np.ndarray]] | None = None,
    min_cosine: float = DEFAULT_MIN_COSINE,
) -> ConversionResult:
    """Bring an existing ONNX model into zonnx's clean form, optionally with fixed/named input dims
    (``input_shapes={"x": (1, 3, "H", "W")}``) and cut between tensor names (``inputs``/``outputs``).

    The check runs the original model in ORT on ``check_inputs`` (feeds of the original model) or on
    generated inputs; a cut model is fed the original's tensors at its inputs and compared at its outputs.
    """
    return convert_onnx(
        model,
        inputs=inputs,
        outputs=outputs,
        input_shapes=input_shapes,
        opset=opset,
        check=check,
        check_inputs=check_inputs,
        min_cosine=min_cosine,
    )[0]
