"""PyTorch frontend: export a module (eager, TorchScript ``.pt``, ``torch.export`` ``.pt2``, float or
quantized with ``torch.ao.quantization``) with the legacy exporter, clean it, and check it against torch.

The numeric check runs torch and ORT on the same inputs: the user's, or generated ones of the example
inputs' shapes and dtypes (two samples at the example sizes, one with every dynamic dim doubled).
Float outputs must reach the cosine threshold. A quantized model (the exporter writes QuantizeLinear /
DequantizeLinear around float ops) is compared in integer codes: an output produced by a per-tensor
DequantizeLinear is compared as ``round(y / scale) + zero_point`` on both sides, within ``max_lsb``.
"""

from __future__ import annotations

__all__ = [
    "from_torch",
    "convert_module",
    "export_torch",
    "torch_input_names",
    "codes_view",
    "quant_input_ranges",
]

import contextlib
import inspect
import io
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from zonnx.converters.common import (
    DEFAULT_MIN_COSINE,
    ConversionError,
    ConversionResult,
    SourceInfo,
    check_against_source,
    finish,
)
from zonnx.errors import VerificationError, first_line
from zonnx.ir.large import copy_model

logger = logging.getLogger(__name__)

#: Newest opset the TorchScript exporter writes; the clean pipeline upgrades from there when asked.
_EXPORTER_MAX_OPSET = 20
_TorchArgs = tuple[Any, ...]


# ---------------------------------------------------------------- loading and naming


def torch_input_names(module: torch.nn.Module) -> list[str]:
    """Names of ``forward``'s positional parameters (TorchScript schema or Python signature), no ``self``."""
    forward = getattr(module, "forward", module)
    schema = getattr(forward, "schema", None)
    if schema is not None:
        return [a.name for a in schema.arguments][1:]
    try:
        params = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _as_args(example_inputs: Any, names: Sequence[str]) -> _TorchArgs:
    """Example inputs as a tuple of tensors: a tensor, array, tuple/list of them, or a dict by name."""
    if isinstance(example_inputs, Mapping):
        missing = [n for n in names if n not in example_inputs]
        if missing or len(example_inputs) > len(names):
            raise ConversionError(
                f"inputs (--test-input or example_inputs) are keyed {sorted(example_inputs)} but forward() takes "
                f"{list(names)}; key them by forward()'s parameter names."
            )
        example_inputs = [example_inputs[n] for n in names if n in example_inputs]
    if not isinstance(example_inputs, tuple | list):
        example_inputs = (example_inputs,)
    return tuple(
        torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a for a in example_inputs
    )


def _flatten(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, Mapping):
        out = list(out.values())
    if isinstance(out, tuple | list):
        return [t for item in out for t in _flatten(item)]
    raise ConversionError(
        f"forward() returned a {type(out).__name__}; only tensors, tuples, lists and "
        "dicts of tensors can be exported."
    )


def _default_output_names(out: Any, count: int) -> list[str]:
    if isinstance(out, Mapping) and len(out) == count:
        return [str(k) for k in out]
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return (t.int_repr() if t.is_quantized else t).cpu().numpy()


# ---------------------------------------------------------------- export with short errors


@contextlib.contextmanager
def _capture_output() -> Iterator[io.StringIO]:
    """Capture file descriptors 1 and 2: the exporter's C++ log dumps the TorchScript graph there on failure."""
    captured = io.StringIO()
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, old in zip((1, 2), saved, strict=True):
                os.dup2(old, fd)
                os.close(old)
            tmp.seek(0)
            captured.write(tmp.read().decode(errors="replace"))


_KIND = re.compile(r"'((?:aten|prim|quantized|onnx)::\w+)'|kind '([\w:]+)'")


def _where(kind: str, graph_log: str) -> str:
    """' at node <module path>/<op> (file:line)' for the first node of ``kind`` in the exporter's graph dump."""
    for line in graph_log.splitlines():
        m = re.search(rf"= {re.escape(kind)}\(.*?\)(?:, scope: (\S+))?(?: # (\S+))?\s*$", line)
        if m:
            scope, loc = m.group(1) or "", m.group(2) or ""
            path = "/".join(
                part.split("::", 1)[1] for part in scope.split("/") if "::" in part and part.split("::", 1)[1]
            )
            where = f" at node /{path + '/' if path else ''}{kind.split('::')[-1]}"
            if loc.count(":") >= 2:
                file, line_no, _ = loc.rsplit(":", 2)
                where += f" ({Path(file).name}:{line_no})"
            return where
    return ""


def _short_export_error(e: Exception, graph_log: str, opset: int) -> ConversionError:
    """Shorten the exporter's error to the failing op and its node (module path, source line)."""
    text = str(e).strip()
    m = _KIND.search(text)
    kind = (m.group(1) or m.group(2)) if m else ""
    first = first_line(e).split("  [Caused by")[0].rstrip(". ")
    if not kind:
        return ConversionError(f"torch cannot export the model: {first}.")
    added = re.search(r"added in version (\d+)", text)
    if added:
        hint = f"it needs opset {added.group(1)}: pass --opset {added.group(1)}"
    elif "is not supported" in first:
        hint = "rewrite that part with supported ops or keep it out of the exported model"
    else:
        hint = f"{first}; rewrite that part or keep it out of the exported model"
    return ConversionError(
        f"torch cannot export operator {kind} to ONNX opset {opset}{_where(kind, graph_log)}: {hint}."
    )


def export_torch(
    module: torch.nn.Module,
    args: _TorchArgs,
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: Mapping[str, Any] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    """Export with the legacy (TorchScript) exporter in eval mode; errors become one-line ConversionErrors."""
    with contextlib.suppress(NotImplementedError):  # torch.export modules refuse .eval()
        module.eval()
    export_opset = min(opset, _EXPORTER_MAX_OPSET)
    # to a file, not a buffer: past 2 GB the exporter puts the weights in external data beside it
    folder = tempfile.TemporaryDirectory(prefix="zonnx-export-")
    path = os.path.join(folder.name, "model.onnx")
    with folder, warnings.catch_warnings(), _capture_output() as log:
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(
                module,
                args,
                path,
                dynamo=False,
                opset_version=export_opset,
                input_names=list(input_names),
                output_names=list(output_names),
                dynamic_axes={k: v for k, v in (dynamic_axes or {}).items()},
                training=torch.onnx.TrainingMode.PRESERVE,
            )
            error = None
        except Exception as e:  # the exporter raises RuntimeError, OnnxExporterError, TypeError, ...
            error = e
        if error is None:
            model = onnx.load(path)  # external data, if any, read into the proto (never serialized whole)
    if error is not None:
        raise _short_export_error(error, log.getvalue(), export_opset) from None
    return model


# ---------------------------------------------------------------- quantized models


def _const(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    for t in model.graph.initializer:
        if t.name == name:
            return onnx.numpy_helper.to_array(t)
    return None


def _qparams(model: onnx.ModelProto, node: onnx.NodeProto) -> tuple[float, int, np.dtype] | None:
    """(scale, zero point, code dtype) of a per-tensor Q/DQ node with constant parameters, else None."""
    scale = _const(model, node.input[1]) if len(node.input) > 1 else None
    zp = _const(model, node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.uint8)
    if scale is None or zp is None or scale.size != 1 or zp.size != 1 or zp.dtype.kind not in "iu":
        return None
    return float(scale.ravel()[0]), int(zp.ravel()[0]), zp.dtype


def quant_input_ranges(model: onnx.ModelProto) -> dict[str, tuple[float, float]]:
    """Float range to draw check inputs from for inputs that feed a QuantizeLinear: half its code range
    around the zero point (models quantized with ``reduce_range`` saturate beyond that)."""
    inputs = {i.name for i in model.graph.input}
    ranges = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] in inputs and (q := _qparams(model, node)):
            scale, zp, dtype = q
            info = np.iinfo(dtype)
            ranges[node.input[0]] = ((info.min - zp) * scale / 2, (info.max - zp) * scale / 2)
    return ranges


def codes_view(model: onnx.ModelProto) -> tuple[onnx.ModelProto, Any]:
    """A copy of ``model`` whose outputs made by a per-tensor DequantizeLinear give the integer codes
    instead, and a function turning the source's outputs (keys "0", "1", ...) into the same codes. A model
    with no such output is its own view (no copy of its weights)."""
    made_by = {o: n for n in model.graph.node for o in n.output}
    if not any(
        (n := made_by.get(out.name)) is not None and n.op_type == "DequantizeLinear" and _qparams(model, n)
        for out in model.graph.output
    ):
        return model, dict
    view = copy_model(model)  # never serialized: works past 2 GB
    producers = {o: n for n in view.graph.node for o in n.output}
    params: dict[str, tuple[float, int, np.dtype]] = {}
    for i, out in enumerate(view.graph.output):
        node = producers.get(out.name)
        if node is None or node.op_type != "DequantizeLinear" or not (q := _qparams(view, node)):
            continue
        params[str(i)] = q
        floats = out.name + "__float"
        for n in view.graph.node:
            n.input[:] = [floats if x == out.name else x for x in n.input]
        node.output[0] = floats
        view.graph.node.append(onnx.helper.make_node("Identity", [node.input[0]], [out.name]))
        out.type.tensor_type.elem_type = onnx.helper.np_dtype_to_tensor_dtype(q[2])

    def to_codes(outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        coded = dict(outputs)
        for key, (scale, zp, dtype) in params.items():
            y = outputs.get(key)
            if y is not None and y.dtype.kind == "f":
                info = np.iinfo(dtype)
                coded[key] = np.clip(np.round(y.astype(np.float64) / scale) + zp, info.min, info.max).astype(
                    dtype
                )
        return coded

    return view, to_codes


# ---------------------------------------------------------------- check inputs


def _random_like(t: torch.Tensor, shape: Sequence[int], rng: np.random.Generator, span: Any) -> torch.Tensor:
    """Random data of ``t``'s dtype: uniform in ``span`` or normal floats; ints below ``t``'s max + 1."""
    if t.dtype.is_floating_point:
        arr = rng.uniform(*span, shape) if span else rng.standard_normal(shape)
        return torch.from_numpy(arr.astype(np.float32)).to(t.dtype)
    if t.dtype == torch.bool:
        return torch.from_numpy(rng.integers(0, 2, shape).astype(bool))
    return torch.from_numpy(rng.integers(0, max(int(t.max()) + 1 if t.numel() else 10, 1), shape)).to(t.dtype)


def _check_args(args: _TorchArgs, names: Sequence[str], dynamic: Mapping[str, Any], ranges: Mapping) -> list:
    """The example itself, one random sample of the same shapes, and one with every dynamic dim doubled."""
    rng = np.random.default_rng(0)
    samples = [args]
    for factor in (1, 2) if dynamic else (1,):
        sample = [
            _random_like(
                t,
                [d * (factor if i in dynamic.get(n, ()) else 1) for i, d in enumerate(t.shape)],
                rng,
                ranges.get(n),
            )
            if isinstance(t, torch.Tensor)
            else t
            for n, t in zip(names, args, strict=False)
        ]
        samples.append(tuple(sample) + tuple(args[len(names) :]))
    return samples


# ---------------------------------------------------------------- the frontend


def from_torch(
    module: torch.nn.Module,
    example_inputs: Any,
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_axes: Mapping[str, Mapping[int, str] | Sequence[int]] | None = None,
    opset: int = 17,
    check: bool = True,
    check_inputs: Sequence[Any] | None = None,
    min_cosine: float = DEFAULT_MIN_COSINE,
    max_lsb: int = 1,
    source: str = "<python>",
) -> ConversionResult:
    """Convert a torch module to clean ONNX checked against torch (see ``convert_module``)."""
    kwargs = {k: v for k, v in locals().items() if k not in ("module", "example_inputs")}
    return convert_module(module, example_inputs, **kwargs)[0]


def convert_module(
    module: torch.nn.Module,
    example_inputs: Any,
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_axes: Mapping[str, Mapping[int, str] | Sequence[int]] | None = None,
    opset: int = 17,
    check: bool = True,
    check_inputs: Sequence[Any] | None = None,
    min_cosine: float = DEFAULT_MIN_COSINE,
    max_lsb: int = 1,
    source: str = "<python>",
    options: Mapping[str, Any] | None = None,
) -> tuple[ConversionResult, onnx.ModelProto]:
    """Convert a torch module to clean ONNX and check it against torch on the same inputs.

    Returns the result and the exporter's raw model (for before/after op counts).

    Input names default to forward()'s parameter names, output names to a returned dict's keys or
    ``output`` / ``output_<i>``. ``dynamic_axes`` names dims (``{"x": {0: "batch"}}``); those dims
    are also varied by the check. ``check_inputs`` are extra input samples (tensors/arrays or tuples).
    Raises ConversionError when export fails (the op and node named) or an output does not match.
    """
    forward_names = torch_input_names(module)
    args = _as_args(example_inputs, forward_names)
    with contextlib.suppress(NotImplementedError):
        module.eval()
    with torch.no_grad():
        try:
            example_out = module(*args)
        except Exception as e:
            shapes = ", ".join(
                f"{n}:{','.join(map(str, t.shape))}"
                for n, t in zip(forward_names or [f"input_{i}" for i in range(len(args))], args, strict=False)
                if isinstance(t, torch.Tensor)
            )
            raise ConversionError(
                f"the model fails on example inputs {shapes} ({first_line(e)}); give input "
                "shapes that fit the model (--input-shape NAME:D1,D2,...)."
            ) from None
    outs = _flatten(example_out)
    in_names = list(input_names or forward_names[: len(args)] or [f"input_{i}" for i in range(len(args))])
    out_names = list(output_names or _default_output_names(example_out, len(outs)))
    if len(in_names) != len(args) or len(out_names) != len(outs):
        raise ConversionError(
            f"{len(in_names)} input names for {len(args)} inputs and {len(out_names)} output "
            f"names for {len(outs)} outputs; give one name per tensor."
        )
    _check_axes(
        dynamic_axes or {}, dict(zip(in_names, args, strict=True)) | dict(zip(out_names, outs, strict=True))
    )
    raw = export_torch(
        module, args, input_names=in_names, output_names=out_names, dynamic_axes=dynamic_axes, opset=opset
    )
    shapes = {n: list(t.shape) for n, t in zip(in_names, args, strict=True) if isinstance(t, torch.Tensor)}
    axes = {k: dict(v) if isinstance(v, Mapping) else list(v) for k, v in (dynamic_axes or {}).items()}
    info = SourceInfo(source, "torch", torch.__version__, {
        "input_names": in_names, "output_names": out_names, "opset": opset, "dynamic_axes": axes,
        "input_shapes": shapes, **dict(options or {}),
    })  # fmt: skip
    model = finish(raw, info, opset=opset, input_names=in_names, output_names=out_names)
    for tensor in raw.graph.initializer:  # the exporter's model is kept for its op counts only
        tensor.ClearField("raw_data")
    checks = []
    if check:
        dynamic = {k: list(v) for k, v in (dynamic_axes or {}).items() if k in in_names}
        samples = _check_args(args, in_names, dynamic, quant_input_ranges(model))
        generated = len(samples)
        samples += [_as_args(c, forward_names) for c in check_inputs or ()]
        checks = _check(
            module, model, samples, in_names, min_cosine=min_cosine, max_lsb=max_lsb, generated=generated
        )
    return ConversionResult(model, checks, info), raw


def _check_axes(dynamic_axes: Mapping[str, Any], tensors: Mapping[str, Any]) -> None:
    """Every dynamic axis must name an input or output and one of its dims."""
    for name, axes in dynamic_axes.items():
        if name not in tensors:
            raise ConversionError(
                f"dynamic axes given for {name!r}, which is not an input or output; the inputs "
                f"and outputs are {list(tensors)}."
            )
        rank = getattr(tensors[name], "ndim", 0)
        bad = [a for a in axes if not 0 <= int(a) < rank]
        if bad:
            raise ConversionError(f"dynamic axis {bad[0]} of {name!r}: it has {rank} dims (0..{rank - 1}).")


def _check(
    module: torch.nn.Module,
    model: onnx.ModelProto,
    samples: Sequence[_TorchArgs],
    in_names: Sequence[str],
    *,
    min_cosine: float,
    max_lsb: int,
    generated: int | None = None,
) -> list:
    """Compare ORT with torch on every sample (quantized outputs in integer codes).

    Rule: torch failing on the first sample or on a given one (index >= ``generated``, the user's test
    inputs) is an error; on a generated sample at another size of a dynamic dim it is skipped with one
    warning naming the sizes, so the check never covers fewer inputs than it says.
    """
    view, to_codes = codes_view(model)
    feeds_list, refs, skipped = [], {}, []
    generated = len(samples) if generated is None else generated
    with torch.no_grad():
        for index, args in enumerate(samples):
            feeds = {
                n: _to_numpy(t) for n, t in zip(in_names, args, strict=False) if isinstance(t, torch.Tensor)
            }
            try:
                theirs = [_to_numpy(t) for t in _flatten(module(*args))]
            except Exception as e:  # the user's module raises anything; given samples must run
                if index == 0:
                    raise
                sizes = ", ".join(f"{k}:{','.join(map(str, v.shape))}" for k, v in feeds.items())
                if index >= generated:
                    raise ConversionError(
                        f"the torch module fails on test input {index - generated + 1} ({sizes}): "
                        f"{type(e).__name__}: {first_line(e)}; fix the input or leave it out."
                    ) from None
                skipped.append(f"{sizes} ({first_line(e)})")
                continue
            feeds_list.append(feeds)
            refs[id(feeds)] = to_codes({str(i): a for i, a in enumerate(theirs)})
    if skipped:
        logger.warning(
            "conversion check: torch fails at %d generated size(s) of the dynamic dims, which are not "
            "checked: %s; checked %d of %d samples",
            len(skipped),
            "; ".join(skipped),
            len(feeds_list),
            len(samples),
        )
    try:
        return check_against_source(
            view, lambda f: refs[id(f)], feeds_list, min_cosine=min_cosine, max_lsb=max_lsb
        )
    except VerificationError as e:
        raise ConversionError(_runtime_failure(str(e), feeds_list)) from None


def _runtime_failure(message: str, feeds_list: Sequence[Mapping[str, np.ndarray]]) -> str:
    """One line: which node fails in ORT on which input sizes, and the likely cause (a traced size)."""
    sizes = "; ".join(
        ", ".join(f"{k}:{','.join(map(str, v.shape))}" for k, v in f.items()) for f in feeds_list
    )
    node = re.search(r"Name:'([^']+)'", message)
    op = re.search(r"running (\w+) node", message)
    where = f"node {node.group(1)!r} ({op.group(1) if op else 'op'}) fails" if node else message.rstrip(".")
    return (
        f"the exported model does not run on the check inputs ({sizes}): {where}. The exporter probably "
        "traced a size as a constant: mark fewer dims dynamic, or fix the input sizes."
    )
