"""Check an exported model against torch on the same inputs.

The check inputs are the example and generated samples of its shapes and dtypes (one more with every
dynamic dim doubled). A quantized model's outputs made by a per-tensor DequantizeLinear are compared
in integer codes. An ORT failure becomes one line naming the node and the input sizes.

A module with packed quantized weights runs torch's fbgemm / x86 / oneDNN kernels, which on x86 without
VNNI add u8 x s8 products in saturating 16-bit pairs (activation codes above 128 against 127 weights): torch's
own numbers are then off by up to tens of codes, and ORT's exact run would be blamed for them. Where a probe
shows those kernels saturate, the check compares with a copy of the module re-packed for QNNPACK (u8 x u8 in
32 bits: exact, the same weights and quantization parameters); if that copy cannot be made or run, with
torch's own run, and a mismatch's message says torch's numbers are inexact on this CPU.
"""

from __future__ import annotations

__all__ = [
    "check_against_torch",
    "check_args",
    "codes_view",
    "flatten",
    "quant_input_ranges",
    "torch_u8s8_exact",
    "has_packed_weights",
    "exact_source",
    "QNNPACK_REFERENCE",
]

import contextlib
import copy
import functools
import io
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import torch

from zonnx.converters.common import ConversionError, check_against_source
from zonnx.converters.torch_export import TorchArgs
from zonnx.errors import VerificationError, first_line
from zonnx.ir.large import copy_model

# Logged under the frontend's module name, as before this check moved out of it.
logger = logging.getLogger("zonnx.converters.from_torch")


def flatten(out: Any) -> list[torch.Tensor]:
    """forward()'s result as a flat list of tensors (tuples, lists and dict values in order)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, Mapping):
        out = list(out.values())
    if isinstance(out, tuple | list):
        return [t for item in out for t in flatten(item)]
    raise ConversionError(
        f"forward() returned a {type(out).__name__}; only tensors, tuples, lists and "
        "dicts of tensors can be exported."
    )


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return (t.int_repr() if t.is_quantized else t).cpu().numpy()


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


# ---------------------------------------------------------------- an exact torch run

#: ``OutputCheck.reference`` when torch's result came from the module re-packed for QNNPACK.
QNNPACK_REFERENCE = (
    "torch re-run with QNNPACK, exact: its x86/fbgemm kernels saturate u8 x s8 sums on this CPU"
)
#: The engines whose u8 x s8 kernels use 16-bit pair sums on x86 without VNNI (QNNPACK is u8 x u8, 32-bit).
_PACKING_ENGINES = ("fbgemm", "x86", "onednn")


@contextlib.contextmanager
def _engine(name: str) -> Iterator[None]:
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


@functools.cache
def torch_u8s8_exact(engine: str) -> bool:
    """Whether torch's quantized Linear packed under ``engine`` adds 64 products 255 x 127 exactly here
    (x86 without VNNI: pairs overflow int16 and the sum comes out near half; ``zonnx.hostcpu``)."""
    k = 64
    try:
        with _engine(engine), torch.no_grad():
            linear = torch.ao.nn.quantized.Linear(k, 4)
            weight = torch.quantize_per_tensor(torch.full((4, k), 127.0), 1.0, 0, torch.qint8)
            linear.set_weight_bias(weight, None)
            linear.scale, linear.zero_point = k * 255 * 127 / 200, 0  # the exact sum is code 200
            x = torch.quantize_per_tensor(torch.full((8, k), 255.0), 1.0, 0, torch.quint8)
            return bool((linear(x).int_repr() == 200).all())
    except RuntimeError:  # an engine this build cannot run packs no module's weights either
        return True


def _torch_saturates() -> bool:
    """Whether any engine a module may have been packed under saturates u8 x s8 sums on this host."""
    engines = set(torch.backends.quantized.supported_engines)
    return any(not torch_u8s8_exact(e) for e in _PACKING_ENGINES if e in engines)


def has_packed_weights(module: Any) -> bool:
    """Whether ``module`` (eager or TorchScript) holds packed quantized weights (torch's integer kernels)."""
    modules = module.modules() if hasattr(module, "modules") else ()
    return any(isinstance(getattr(m, "_packed_params", None), torch.ScriptObject) for m in modules)


def _qnnpack_copy(module: Any) -> Any:
    """``module`` with every packed weight re-packed for QNNPACK (unpacked and packed again: same numbers)."""
    with _engine("qnnpack"):
        if isinstance(module, torch.jit.ScriptModule):
            buffer = io.BytesIO()
            torch.jit.save(module, buffer)
            buffer.seek(0)
            return torch.jit.load(buffer)
        return copy.deepcopy(module)


def exact_source(module: Any, first: TorchArgs) -> tuple[Callable[..., Any], str, str]:
    """How to run ``module`` exactly on this host: (run, reference, note on a mismatch).

    A module with packed quantized weights, on a host where torch's x86/fbgemm kernels saturate u8 x s8
    sums, runs as a QNNPACK copy (tried on ``first``); if that fails, as itself, with a note naming the
    cause. Any other module runs as itself, with no reference or note.
    """
    if not (has_packed_weights(module) and _torch_saturates()):
        return module, "", ""
    cpu = "without VNNI, torch's x86/fbgemm kernels add u8 x s8 products in saturating 16-bit pairs"
    if "qnnpack" not in torch.backends.quantized.supported_engines:
        return module, "", f"torch's own result is not exact on this CPU ({cpu}; this torch has no QNNPACK)"
    try:
        exact = _qnnpack_copy(module)
        with _engine("qnnpack"), torch.no_grad():
            exact(*first)
    except Exception as e:  # any failure of a user's module: fall back to its own run, and say so
        return (
            module,
            "",
            (
                f"torch's own result is not exact on this CPU ({cpu}), and its QNNPACK re-run, exact, failed: "
                f"{type(e).__name__}: {first_line(e)}"
            ),
        )

    def run(*args: Any) -> Any:
        with _engine("qnnpack"):
            return exact(*args)

    logger.info("conversion check: %s; compared with that run", QNNPACK_REFERENCE)
    return run, QNNPACK_REFERENCE, ""


# ---------------------------------------------------------------- check inputs


def _random_like(t: torch.Tensor, shape: Sequence[int], rng: np.random.Generator, span: Any) -> torch.Tensor:
    """Random data of ``t``'s dtype: uniform in ``span`` or normal floats; ints below ``t``'s max + 1."""
    if t.dtype.is_floating_point:
        arr = rng.uniform(*span, shape) if span else rng.standard_normal(shape)
        return torch.from_numpy(arr.astype(np.float32)).to(t.dtype)
    if t.dtype == torch.bool:
        return torch.from_numpy(rng.integers(0, 2, shape).astype(bool))
    return torch.from_numpy(rng.integers(0, max(int(t.max()) + 1 if t.numel() else 10, 1), shape)).to(t.dtype)


def check_args(args: TorchArgs, names: Sequence[str], dynamic: Mapping[str, Any], ranges: Mapping) -> list:
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


def check_against_torch(
    module: torch.nn.Module,
    model: onnx.ModelProto,
    samples: Sequence[TorchArgs],
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
    source, reference, note = exact_source(module, samples[0]) if samples else (module, "", "")
    with torch.no_grad():
        for index, args in enumerate(samples):
            feeds = {
                n: _to_numpy(t) for n, t in zip(in_names, args, strict=False) if isinstance(t, torch.Tensor)
            }
            try:
                theirs = [_to_numpy(t) for t in flatten(source(*args))]
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
            view,
            lambda f: refs[id(f)],
            feeds_list,
            min_cosine=min_cosine,
            max_lsb=max_lsb,
            reference=reference,
            note=note,
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
