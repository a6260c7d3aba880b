"""``extra_options["TensorQuantOverrides"]``: per-tensor quantization settings, as ORT defines them.

The option maps a tensor name to a list of dicts: one dict for a per-tensor setting, or one per channel
(the first holding ``axis``) for a weight quantized per channel. Keys:

- ``quant_type``: the tensor's type (QuantType, onnx.TensorProto int or name);
- ``scale`` + ``zero_point``: fixed parameters (no calibration); not with ``rmin``/``rmax``/``symmetric``/
  ``reduce_range``;
- ``rmin`` + ``rmax``: a fixed float range, turned into parameters by the usual rules;
- ``symmetric``: zero point at 0 (signed) or mid-range (unsigned);
- ``reduce_range``: ORT's 7-bit grid, initializers only;
- ``axis``: the channel axis of a per-channel weight;
- ``convert``: ``{"quant_type": ..., optional "scale"/"zero_point", "symmetric", "recv_nodes"}``: the
  readers named in ``recv_nodes`` (all when absent) read the tensor re-quantized to the second type
  (Q1 -> DQ1 -> Q2 -> DQ2, as ORT writes it); their biases use the second scale.

Validation follows ORT's rules, and each error is a ValueError (``OptionError``) naming the tensor.
A tensor the op rules leave float keeps no quantization whatever its override says (as in ORT). A
bias given an override is quantized like a weight of the given type instead of int32 (as in ORT).
"""

from __future__ import annotations

__all__ = ["TensorOverride", "parse_tensor_overrides", "apply_tensor_overrides"]

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from zonnx.errors import OptionError
from zonnx.quantization.config import resolve_type
from zonnx.quantization.plan import QuantPlan, Role, TensorPlan
from zonnx.quantization.schemes import QuantParams, qdtype

logger = logging.getLogger(__name__)

_KEYS = {"quant_type", "scale", "zero_point", "rmin", "rmax", "symmetric", "reduce_range", "axis", "convert"}
_NOT_WITH_SCALE = ("rmin", "rmax", "symmetric", "reduce_range")


@dataclasses.dataclass(frozen=True)
class TensorOverride:
    """One tensor's parsed override (per-channel values are arrays along ``axis``)."""

    quant_type: str | None = None
    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None
    rmin: np.ndarray | None = None
    rmax: np.ndarray | None = None
    symmetric: bool | None = None
    reduce_range: bool | None = None
    axis: int | None = None
    convert: TensorOverride | None = None
    recv_nodes: frozenset[str] | None = None


def _where(name: str) -> str:
    return f"extra_options['TensorQuantOverrides'][{name!r}]"


def _check_entry(name: str, entry: Any, is_init: bool) -> None:
    if not isinstance(entry, Mapping):
        raise OptionError(f"{_where(name)}: Tensor quantization overrides for '{name}' are not in a dict.")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise OptionError(
            f"{_where(name)}: unknown key(s) {unknown}; known keys: {', '.join(sorted(_KEYS))}."
        )
    if ("scale" in entry) != ("zero_point" in entry):
        raise OptionError(
            f"{_where(name)}: Must provide both 'scale' and 'zero_point' if one of the overrides is provided."
        )
    if "scale" in entry:
        bad = [k for k in _NOT_WITH_SCALE if k in entry]
        if bad:
            raise OptionError(
                f"{_where(name)}: Tensor override option(s) [{', '.join(bad)}] are invalid with 'scale' and "
                "'zero_point'; give either fixed parameters or a range."
            )
    if ("rmin" in entry) != ("rmax" in entry):
        raise OptionError(f"{_where(name)}: Must provide both 'rmin' and 'rmax' if one is provided.")
    if "reduce_range" in entry and not is_init:
        raise OptionError(
            f"{_where(name)}: Option 'reduce_range' is only supported for initializers, not for activation {name}."
        )
    if "convert" in entry:
        conv = entry["convert"]
        if is_init:
            raise OptionError(f"{_where(name)}: Cannot use 'convert' override for initializers.")
        if not isinstance(conv, Mapping) or "quant_type" not in conv:
            raise OptionError(
                f"{_where(name)}: 'convert' options (tensor '{name}') must specify a 'quant_type'."
            )
        if "reduce_range" in conv:
            raise OptionError(
                f"{_where(name)}: Option 'reduce_range' is only supported for initializers, not for activation "
                f"{name}."
            )
        if ("scale" in conv) != ("zero_point" in conv):
            raise OptionError(
                f"{_where(name)}: Must provide both 'scale' and 'zero_point' if one of the overrides is provided "
                f"(tensor '{name}')."
            )
        bad = [k for k in _NOT_WITH_SCALE if k in conv and "scale" in conv]
        if bad:
            raise OptionError(
                f"{_where(name)}: Tensor override option(s) [{', '.join(bad)}] are invalid with 'scale' and "
                f"'zero_point' (tensor '{name}')."
            )


def _stack(entries: list[Mapping[str, Any]], key: str, dtype: Any) -> np.ndarray | None:
    if key not in entries[0]:
        return None
    values = [np.asarray(e[key], dtype=dtype).reshape(()) for e in entries]
    return np.stack(values) if len(values) > 1 else values[0]


def _parse_one(name: str, entry: Mapping[str, Any]) -> TensorOverride:
    qt = entry.get("quant_type")
    return TensorOverride(
        quant_type=resolve_type(qt, f"{_where(name)} quant_type") if qt is not None else None,
        scale=np.asarray(entry["scale"], np.float32).reshape(()) if "scale" in entry else None,
        zero_point=np.asarray(entry["zero_point"], np.int64).reshape(()) if "zero_point" in entry else None,
        rmin=np.asarray(entry["rmin"], np.float64).reshape(()) if "rmin" in entry else None,
        rmax=np.asarray(entry["rmax"], np.float64).reshape(()) if "rmax" in entry else None,
        symmetric=entry.get("symmetric"),
    )


def parse_tensor_overrides(
    raw: Mapping[str, Any], model: ir.Model, default_type: str = "int8"
) -> dict[str, TensorOverride]:
    """Validate the option against the model (every tensor must exist) and parse it."""
    graph = model.graph
    inits = graph.initializers
    known = {v.name for v in graph.inputs} | {o.name for n in graph for o in n.outputs} | set(inits)
    parsed: dict[str, TensorOverride] = {}
    for name, entries in raw.items():
        if name not in known:
            raise OptionError(
                f"{_where(name)}: Tensor '{name}' in TensorQuantOverrides is not present in the model; "
                "check the tensor name."
            )
        if not isinstance(entries, list | tuple):
            raise OptionError(
                f"{_where(name)}: Tensor quantization overrides for '{name}' are not in a list."
            )
        if not entries or not entries[0]:
            continue
        is_init = name in inits
        for entry in entries:
            _check_entry(name, entry, is_init)
        first = entries[0]
        per_channel = len(entries) > 1 or first.get("axis") is not None
        if per_channel:
            if not is_init:
                raise OptionError(
                    f"{_where(name)}: Tensor '{name}' has per-channel overrides, but is not an initializer."
                )
            if first.get("axis") is None:
                raise OptionError(f"{_where(name)}: per-channel overrides need an 'axis' in the first dict.")
            shape = inits[name].shape
            rank = len(shape) if shape is not None else 0
            axis = int(first["axis"])
            if not -rank <= axis < rank:
                raise OptionError(
                    f"{_where(name)}: Axis override value is out-of-bounds for tensor {name} (rank {rank})."
                )
            if len(entries) > 1 and len(entries) != shape[axis]:
                raise OptionError(
                    f"{_where(name)}: Incorrect number of channel overrides for tensor {name} (axis {axis}), "
                    f"expected {shape[axis]}, but found {len(entries)}."
                )
        qt = first.get("quant_type")
        conv = first.get("convert")
        converted = None
        if conv is not None:
            converted = _parse_one(name, conv)
            if converted.quant_type == (resolve_type(qt, "quant_type") if qt is not None else default_type):
                raise OptionError(
                    f"{_where(name)}: 'convert' quant_type must differ from original quant_type (tensor '{name}')."
                )
        parsed[name] = TensorOverride(
            convert=converted,
            recv_nodes=frozenset(conv["recv_nodes"]) if conv is not None and conv.get("recv_nodes") else None,
            quant_type=resolve_type(qt, f"{_where(name)} quant_type") if qt is not None else None,
            scale=_stack(list(entries), "scale", np.float32),
            zero_point=_stack(list(entries), "zero_point", np.int64),
            rmin=_stack(list(entries), "rmin", np.float64),
            rmax=_stack(list(entries), "rmax", np.float64),
            symmetric=first.get("symmetric"),
            reduce_range=first.get("reduce_range"),
            axis=int(first["axis"]) if first.get("axis") is not None else None,
        )
    return parsed


def _apply(tp: TensorPlan, ov: TensorOverride) -> None:
    spec = tp.spec
    if ov.quant_type is not None:
        spec = dataclasses.replace(spec, dtype=qdtype(ov.quant_type))
    if tp.role is Role.BIAS:  # ORT: a bias with an override is quantized like a weight of that type
        tp.role, tp.bias_of = Role.WEIGHT, None
        spec = dataclasses.replace(spec, axis=None)
    symmetric = ov.symmetric if ov.symmetric is not None else (True if ov.axis is not None else None)
    if symmetric is not None:  # per-channel weights default to symmetric, as in ORT
        spec = dataclasses.replace(spec, symmetric=symmetric)
    if ov.quant_type is not None or symmetric is not None:  # ORT's restricted range goes with the type
        spec = dataclasses.replace(
            spec, restricted=spec.symmetric and spec.dtype.name in ("int8", "int16") and not spec.power_of_two
        )
    if ov.reduce_range is not None:
        spec = dataclasses.replace(spec, reduce_range=ov.reduce_range)
    if ov.axis is not None:
        spec = dataclasses.replace(spec, axis=ov.axis)
    if spec.power_of_two and spec != tp.spec:
        raise OptionError(
            f"{_where(tp.name)}: power-of-two quantization takes no per-tensor type or range overrides."
        )
    tp.spec = spec
    if ov.convert is not None:
        cv = ov.convert
        cspec = dataclasses.replace(spec, dtype=qdtype(cv.quant_type), reduce_range=False)
        if cv.symmetric is not None:
            cspec = dataclasses.replace(cspec, symmetric=cv.symmetric)
        cspec = dataclasses.replace(
            cspec, restricted=cspec.symmetric and cspec.dtype.name in ("int8", "int16")
        )
        tp.convert_spec, tp.convert_recv = cspec, ov.recv_nodes
        if cv.scale is not None and cv.zero_point is not None:
            lo, hi = cspec.dtype.qrange()
            tp.convert_fixed = QuantParams(
                cv.scale, cv.zero_point.astype(cspec.dtype.np_dtype), cspec.dtype, None, None, lo, hi
            )
    if ov.scale is not None and ov.zero_point is not None:
        qmin, qmax = spec.dtype.qrange()
        tp.fixed_params = QuantParams(
            ov.scale.astype(np.float32),
            ov.zero_point.astype(spec.dtype.np_dtype),
            spec.dtype,
            spec.axis if ov.scale.ndim else None,
            _pof2_position(ov.scale) if spec.power_of_two else None,
            qmin,
            qmax,
        )
    elif ov.rmin is not None and ov.rmax is not None:
        tp.fixed_range = (ov.rmin, ov.rmax) if tp.role is Role.WEIGHT else (float(ov.rmin), float(ov.rmax))


def _pof2_position(scale: np.ndarray) -> np.ndarray | None:
    """``pos`` with ``scale == 2^-pos`` when every scale is a power of two, else None."""
    pos = -np.log2(scale.astype(np.float64))
    return pos.round().astype(np.int64) if np.all(pos == np.round(pos)) else None


def apply_tensor_overrides(plan: QuantPlan, overrides: Mapping[str, TensorOverride]) -> None:
    """Change the plan's specs, fixed ranges and fixed parameters per the parsed overrides."""
    for name, ov in overrides.items():
        tp = plan.tensors.get(name)
        if tp is None:
            logger.info(
                "TensorQuantOverrides: %r is not quantized by the op rules; its override is unused", name
            )
            continue
        _apply(tp, ov)
        if ov.rmin is not None:
            plan.overridden.add(name)
