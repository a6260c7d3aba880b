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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import torch

from zonnx.converters.common import (
    DEFAULT_MIN_COSINE,
    ConversionError,
    ConversionResult,
    SourceInfo,
    finish,
)
from zonnx.converters.torch_check import (
    check_against_torch,
    check_args,
    codes_view,
    flatten,
    quant_input_ranges,
)
from zonnx.converters.torch_export import TorchArgs, export_torch
from zonnx.errors import first_line

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


def _as_args(example_inputs: Any, names: Sequence[str]) -> TorchArgs:
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


def _default_output_names(out: Any, count: int) -> list[str]:
    if isinstance(out, Mapping) and len(out) == count:
        return [str(k) for k in out]
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


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
    outs = flatten(example_out)
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
        samples = check_args(args, in_names, dynamic, quant_input_ranges(model))
        generated = len(samples)
        samples += [_as_args(c, forward_names) for c in check_inputs or ()]
        checks = check_against_torch(
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
