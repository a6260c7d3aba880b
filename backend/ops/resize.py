"""``resize_nearest``: nearest-neighbour Resize on codes.

Each output code is the input code at ONNX's nearest index (``coordinate_transformation_mode`` and
``nearest_mode`` as in the model; scales or sizes constant), on the same grid, so the op is exact.
Other Resize modes are not lowered (the partitioner refuses them, ``check``). ORT lowering: ``Resize``
with the same coordinate rules on stored codes.
"""

from __future__ import annotations

__all__ = ["SPEC", "check", "compile_resize", "reference", "lower_ort"]

import logging
import math
from typing import Any

import numpy as np
import onnx

from zonnx.backend.compiler.params import node_attrs
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.values import Codes, CompileError, constant_inputs, emit_code
from zonnx.backend.runtime.ort_kernels import Storage
from zonnx.backend.runtime.ort_values import Val

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)


def check(node: Any) -> str | None:
    """Why an ``onnx_ir`` Resize node is not lowered (a mode other than nearest), else None."""
    mode = node.attributes.get_string("mode", "nearest")
    return None if mode == "nearest" else f"only nearest Resize is lowered (mode {mode!r})"


def compile_resize(low: Any, node: onnx.NodeProto, x: Codes, ins: list[Any]) -> None:
    """Emit the ``resize_nearest`` of a nearest Resize reading codes ``x``."""
    consts, a = constant_inputs(ins), node_attrs(node)
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise CompileError(f"node {node.name!r}: auto_pad is not supported; make pads explicit.")
    mode = a.get("mode", b"nearest")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "nearest":
        raise CompileError(f"node {node.name!r}: only nearest Resize runs on codes (mode {mode!r}).")
    scales = consts[2] if len(consts) > 2 else (consts[1] if len(consts) == 2 else None)
    sizes = consts[3] if len(consts) > 3 else None
    dec = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in a.items()}
    attrs = {
        "scales": None if scales is None or np.size(scales) == 0 else [float(v) for v in scales],
        "sizes": None if sizes is None or np.size(sizes) == 0 else [int(v) for v in sizes],
        "ctm": dec.get("coordinate_transformation_mode", "half_pixel"),
        "nearest_mode": dec.get("nearest_mode", "round_prefer_floor"),
    }
    emit_code(low, node, x, "resize_nearest", attrs)


def reference(args: list[np.ndarray], op: Op) -> np.ndarray:
    """ONNX nearest Resize index rules, axis by axis."""
    x = args[0]
    a = op.attrs
    out = x
    for ax in range(x.ndim):
        n_in = x.shape[ax]
        if a["sizes"] is not None:
            n_out = a["sizes"][ax]
            scale = n_out / n_in
        else:
            scale = a["scales"][ax]
            n_out = int(math.floor(n_in * scale))
        if n_out == n_in and scale == 1.0:
            continue
        i = np.arange(n_out, dtype=np.float64)
        ctm = a["ctm"]
        if ctm == "asymmetric":
            c = i / scale
        elif ctm == "align_corners":
            c = i * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros_like(i)
        elif ctm == "tf_half_pixel_for_nn":
            c = (i + 0.5) / scale
        elif ctm == "pytorch_half_pixel" and n_out == 1:
            c = np.zeros_like(i)
        else:  # half_pixel, pytorch_half_pixel
            c = (i + 0.5) / scale - 0.5
        mode = a["nearest_mode"]
        idx = {
            "round_prefer_floor": lambda v: np.ceil(v - 0.5),
            "round_prefer_ceil": lambda v: np.floor(v + 0.5),
            "floor": np.floor,
            "ceil": np.ceil,
        }[mode](c)
        out = np.take(out, np.clip(idx, 0, n_in - 1).astype(np.int64), axis=ax)
    return out


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """ONNX ``Resize`` (nearest) on stored codes."""
    a = op.attrs
    if a["sizes"] is not None:
        ins = [args[0].name, "", "", low.b.const(a["sizes"], np.int64, "sizes")]
    else:
        ins = [args[0].name, "", low.b.const(a["scales"], np.float32, "scales")]
    return low.b.op(
        "Resize",
        ins,
        mode="nearest",
        coordinate_transformation_mode=a["ctm"],
        nearest_mode=a["nearest_mode"],
    )


SPEC = OpSpec(
    module=__name__,
    kinds=(Kind("resize_nearest", reference, lower_ort),),
    rules=(Rule(frozenset({"Resize"}), "code", compile_resize),),
    checks={"Resize": check},
)
