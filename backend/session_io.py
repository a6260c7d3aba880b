"""What an ``InferenceSession`` tells and checks about its inputs and outputs: NodeArg-like descriptions
for the reference executor, and feeds checked by name, dtype and dims (InvalidInputError naming the input)."""

from __future__ import annotations

__all__ = ["InvalidInputError", "NodeArg", "check_feeds", "node_args"]

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from zonnx.backend.staged import ORT_TYPES
from zonnx.errors import ZonnxError, did_you_mean


class InvalidInputError(ZonnxError, ValueError):
    """A feed has the wrong name, shape or dtype (ORT's INVALID_ARGUMENT, naming the input)."""


@dataclasses.dataclass(frozen=True)
class NodeArg:
    """``onnxruntime.NodeArg``'s fields for the reference executor."""

    name: str
    type: str
    shape: list[Any]


def node_args(values: Any) -> list[Any]:
    """``onnxruntime.NodeArg``-like descriptions (name, ORT type string, dims) of graph value infos."""
    out = []
    for v in values:
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
        np_type = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        name = next(k for k, d in ORT_TYPES.items() if np.dtype(d) == np_type)
        out.append(NodeArg(v.name, name, dims))
    return out


def check_feeds(args: Sequence[Any], feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The feeds as arrays, checked against the session's inputs ``args`` (NodeArgs): an unknown or
    missing name, another dtype, rank or static dim raises InvalidInputError naming the input."""
    inputs = {i.name: i for i in args}
    for name in feeds:
        if name not in inputs:
            raise InvalidInputError(
                f"invalid input name {name!r}.{did_you_mean(name, inputs)} The model's inputs: {', '.join(inputs)}."
            )
    out = {}
    for name, arg in inputs.items():
        if name not in feeds:
            raise InvalidInputError(
                f"input {name!r} is missing from the feed (expected {arg.type} {arg.shape})."
            )
        x = np.asarray(feeds[name])
        want = np.dtype(ORT_TYPES.get(arg.type, x.dtype))
        if x.dtype != want:
            raise InvalidInputError(
                f"input {name!r}: unexpected data type, actual: tensor({x.dtype}), expected: {arg.type}; "
                f"convert it with .astype(np.{want.name})."
            )
        bad = len(x.shape) != len(arg.shape) or any(
            isinstance(d, int) and d != s for d, s in zip(arg.shape, x.shape, strict=False)
        )
        if bad:
            raise InvalidInputError(
                f"input {name!r}: got invalid dimensions {list(x.shape)}, expected {list(arg.shape)} "
                "(named dims may take any size); reshape the array."
            )
        out[name] = x
    return out
