"""The operator-table checks: which row of ``target.ops`` covers a node and whether its limits hold.

Every number comes from the row (``OpLimits``) and ``target.hardware`` (``cp`` = channel_parallel,
``bn`` = bank_num); a missing limit means none. For a node with kernel ``k``, stride ``s``, dilation
``d``, pads ``p``, input channels ``ic`` and output channels ``oc`` (per spatial axis where it applies):

- ``kernel``: each k in range; ``kernel_area_max``: prod(k); ``square_kernel``: kh == kw;
  ``kernel_stride_ratio`` (transposed convolutions): each k/s in range;
- ``stride``, ``dilation``: each in range; ``pad_max_from_kernel``: each p <= min(k - 1, pad_cap) * d;
- ``in_channels_max``/``out_channels_max``: ic/oc; ``dilation_channels_max``: max(d) * ic;
- ``weight_buffer_depth``: prod(k) * ceil(ic / cp); ``kernel_bank_depth`` (pools): ceil(kh / bn) * kw;
- ``block_channels_max`` (SpaceToDepth): blocksize^2 * ic; ``nearest_bank_depth`` (Resize nearest, an
  integer scale s): ceil(s / bn) * s * ceil(ic / cp); ``bilinear_scales`` (``..._half_pixel_scales``):
  the integer scales linear Resize takes (align_corners never);
- ``modes`` (Resize, Pad), ``types`` (eltwise: Add sum, Mul prod, Sub sub, Max max, Min min, Div div),
  ``channel_axis_only`` (ArgMax/ReduceMax over axis 1), ``output_padding_zero``, ``unit_stride_axes``
  (Slice steps), ``max_inputs``.

Conv and ConvTranspose use ic and oc from the weight; Gemm/MatMul rows with ``lower_to`` are checked as a
1x1 convolution with ic = K and oc = N of a constant weight; global pools take the input's spatial size
as the kernel. ``auto_pad`` SAME pads are computed from the input size.
"""

from __future__ import annotations

__all__ = ["select_kind", "check_limits", "ELTWISE_TYPES"]

import dataclasses
import logging
import math

import numpy as np
import onnx_ir as ir

from zonnx.backend.partition.shapes import ShapeTable
from zonnx.backend.targets import OpLimits, Target
from zonnx.passes.fusion.matching import const_array

logger = logging.getLogger(__name__)

ELTWISE_TYPES = {"Add": "sum", "Mul": "prod", "Sub": "sub", "Max": "max", "Min": "min", "Div": "div"}
_CONVS = ("Conv", "ConvTranspose")


@dataclasses.dataclass
class _Geometry:
    """Kernel, strides, dilations, pads (begin..., end...) and channels of a convolution-like node."""

    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    pads: list[int]
    ic: int | None
    oc: int | None


def _channels(shapes: ShapeTable, value: ir.Value | None) -> int | None:
    dims = shapes.static(value) if value is not None else None
    return dims[1] if dims is not None and len(dims) > 1 else None


def _conv_group(node: ir.Node, shapes: ShapeTable) -> tuple[str, int, int | None]:
    """('one' | 'depthwise' | 'grouped', group, channels) of a Conv/ConvTranspose."""
    group = node.attributes.get_int("group", 1)
    w = shapes.static(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    channels = _channels(shapes, node.inputs[0])
    if channels is None and w is not None:
        channels = w[1] * group if node.op_type == "Conv" else w[0]
    if group == 1:
        return "one", group, channels
    return ("depthwise" if channels == group else "grouped"), group, channels


def select_kind(node: ir.Node, target: Target, shapes: ShapeTable) -> tuple[str, OpLimits] | str:
    """The (kind, limits) row covering ``node``, or the reason no row does (rule op_type)."""
    rows = target.ops_for(node.op_type) if node.domain in ("", "ai.onnx") else {}
    if not rows:
        return f"op type {node.op_type} is not in {target.name}'s operator table"
    if node.op_type in _CONVS:
        grouping, group, channels = _conv_group(node, shapes)
        fitting = {k: v for k, v in rows.items() if v.group in ("any", grouping)}
        if not fitting:
            return (
                f"{node.op_type} with group={group} over {channels} channels is a {grouping} convolution; "
                f"{target.name} has rows for " + ", ".join(f"{k} (group {v.group})" for k, v in rows.items())
            )
        rows = fitting
    kind, limits = next(iter(rows.items()))
    return kind, limits


def _ints(node: ir.Node, name: str, n: int, default: int) -> list[int]:
    values = node.attributes.get_ints(name)
    return list(values) if values else [default] * n


def _geometry(node: ir.Node, shapes: ShapeTable) -> _Geometry | str:
    x = shapes.static(node.inputs[0]) if node.inputs and node.inputs[0] is not None else None
    if node.op_type in _CONVS:
        w = shapes.static(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if w is None:
            return f"the weight of {node.op_type} {node.name!r} has no static shape"
        kernel = list(node.attributes.get_ints("kernel_shape") or w[2:])
        group = node.attributes.get_int("group", 1)
        ic, oc = (w[1] * group, w[0]) if node.op_type == "Conv" else (w[0], w[1] * group)
    elif node.op_type.startswith("Global"):
        if x is None:
            return f"the input of {node.op_type} {node.name!r} has no static shape"
        kernel, ic, oc = list(x[2:]), x[1], x[1]
    else:
        kernel = list(node.attributes.get_ints("kernel_shape") or [])
        ic = oc = x[1] if x is not None and len(x) > 1 else None
    n = len(kernel)
    strides, dilations = _ints(node, "strides", n, 1), _ints(node, "dilations", n, 1)
    pads = _ints(node, "pads", 2 * n, 0)
    auto_pad = node.attributes.get_string("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") and x is not None and node.op_type != "ConvTranspose":
        pads = [0] * (2 * n)
        for i, (size, k, s, d) in enumerate(zip(x[2:], kernel, strides, dilations, strict=False)):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            pads[i], pads[i + n] = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    return _Geometry(kernel, strides, dilations, pads, ic, oc)


def _lowered_fc(node: ir.Node, shapes: ShapeTable) -> _Geometry | str:
    """A Gemm/MatMul as a 1x1 convolution: ic = K, oc = N of its constant weight."""
    w_value = node.inputs[1] if len(node.inputs) > 1 else None
    src = w_value.producer() if w_value is not None else None
    codes = src.inputs[0] if src is not None and src.inputs else w_value
    if w_value is None or (const_array(w_value) is None and const_array(codes) is None):
        return f"{node.op_type} {node.name!r} multiplies two activations; a fully-connected row needs a constant weight"
    w = shapes.static(w_value)
    if w is None or len(w) != 2:
        return f"{node.op_type} {node.name!r} has a weight of rank other than 2"
    trans_b = node.op_type == "Gemm" and node.attributes.get_int("transB", 0)
    ic, oc = (w[1], w[0]) if trans_b else (w[0], w[1])
    return _Geometry([1, 1], [1, 1], [1, 1], [0, 0, 0, 0], ic, oc)


def _range(values: list[int] | list[float], bounds: tuple[int, int] | None) -> bool:
    return bounds is None or all(bounds[0] <= v <= bounds[1] for v in values)


def _fmt(values: list[int]) -> str:
    return "x".join(str(v) for v in values)


def _geometry_rules(g: _Geometry, lim: OpLimits, target: Target) -> tuple[str, str] | None:
    hw = target.hardware
    k, s, d = g.kernel, g.strides, g.dilations
    n = len(k)
    if not _range(k, lim.kernel):
        return "kernel", f"kernel {_fmt(k)} is outside [{lim.kernel[0]}, {lim.kernel[1]}]"  # type: ignore[index]
    if lim.kernel_area_max is not None and math.prod(k) > lim.kernel_area_max:
        return "kernel", f"kernel area {_fmt(k)} = {math.prod(k)} exceeds {lim.kernel_area_max}"
    if lim.square_kernel and len(set(k)) > 1:
        return "kernel", f"kernel {_fmt(k)} is not square"
    if lim.kernel_stride_ratio is not None and not _range(
        [a / b for a, b in zip(k, s, strict=False)], lim.kernel_stride_ratio
    ):
        lo, hi = lim.kernel_stride_ratio
        return "kernel", f"kernel/stride {_fmt(k)}/{_fmt(s)} is outside [{lo}, {hi}]"
    if not _range(s, lim.stride):
        return "stride", f"stride {_fmt(s)} is outside [{lim.stride[0]}, {lim.stride[1]}]"  # type: ignore[index]
    if not _range(d, lim.dilation):
        return "dilation", f"dilation {_fmt(d)} is outside [{lim.dilation[0]}, {lim.dilation[1]}]"  # type: ignore[index]
    if lim.pad_max_from_kernel:
        for i in range(n):
            cap = k[i] - 1 if lim.pad_cap is None else min(k[i] - 1, lim.pad_cap)
            top = cap * d[i]
            for p in (g.pads[i], g.pads[i + n]):
                if p > top:
                    return (
                        "pad",
                        f"pad {p} on spatial axis {i} exceeds min(k-1{', ' + str(lim.pad_cap) if lim.pad_cap is not None else ''})*dilation = {top} (kernel {_fmt(k)})",
                    )
    if g.ic is not None and lim.in_channels_max is not None and g.ic > lim.in_channels_max:
        return "channels", f"{g.ic} input channels exceed {lim.in_channels_max}"
    if g.oc is not None and lim.out_channels_max is not None and g.oc > lim.out_channels_max:
        return "channels", f"{g.oc} output channels exceed {lim.out_channels_max}"
    if (
        g.ic is not None
        and lim.dilation_channels_max is not None
        and max(d, default=1) * g.ic > lim.dilation_channels_max
    ):
        return (
            "dilation",
            f"dilation {max(d)} * {g.ic} input channels = {max(d) * g.ic} exceeds {lim.dilation_channels_max}",
        )
    if g.ic is not None and lim.weight_buffer_depth is not None and hw.channel_parallel:
        need = math.prod(k) * math.ceil(g.ic / hw.channel_parallel)
        if need > lim.weight_buffer_depth:
            return "buffer", (
                f"kernel {_fmt(k)} * ceil({g.ic} channels / {hw.channel_parallel}) = {need} exceeds the weight buffer "
                f"depth {lim.weight_buffer_depth}"
            )
    if lim.kernel_bank_depth is not None and hw.bank_num and len(k) == 2:
        need = math.ceil(k[0] / hw.bank_num) * k[1]
        if need > lim.kernel_bank_depth:
            return (
                "buffer",
                f"ceil(kernel h {k[0]} / {hw.bank_num} banks) * kernel w {k[1]} = {need} exceeds {lim.kernel_bank_depth}",
            )
    return None


def _resize_rules(node: ir.Node, lim: OpLimits, target: Target, shapes: ShapeTable) -> tuple[str, str] | None:
    mode = node.attributes.get_string("mode", "nearest")
    if lim.modes and mode not in lim.modes:
        return "mode", f"mode {mode!r} is not one of {', '.join(lim.modes)}"
    x = shapes.static(node.inputs[0])
    y = shapes.static(node.outputs[0])
    if x is None or y is None or len(x) != 4:
        return None
    ratios = [b / a for a, b in zip(x[2:], y[2:], strict=True)]
    if any(r != int(r) for r in ratios) or len(set(ratios)) > 1:
        return "attribute", f"scales {ratios} are not one integer"
    scale, hw, ic = int(ratios[0]), target.hardware, x[1]
    if mode == "nearest" and lim.nearest_bank_depth is not None and hw.bank_num and hw.channel_parallel:
        need = math.ceil(scale / hw.bank_num) * scale * math.ceil(ic / hw.channel_parallel)
        if need > lim.nearest_bank_depth:
            return (
                "buffer",
                f"ceil({scale}/{hw.bank_num}) * {scale} * ceil({ic}/{hw.channel_parallel}) = {need} exceeds {lim.nearest_bank_depth}",
            )
    if mode == "linear" and (lim.bilinear_scales or lim.bilinear_half_pixel_scales):
        ctm = node.attributes.get_string("coordinate_transformation_mode", "half_pixel")
        if ctm == "align_corners":
            return "mode", "linear resize with align_corners is not supported"
        allowed = (
            lim.bilinear_half_pixel_scales
            if ctm in ("half_pixel", "pytorch_half_pixel")
            else lim.bilinear_scales
        )
        if scale not in allowed:
            return "attribute", f"linear scale {scale} ({ctm}) is not one of {list(allowed)}"
    return None


def _other_rules(node: ir.Node, lim: OpLimits, shapes: ShapeTable) -> tuple[str, str] | None:
    op = node.op_type
    if lim.max_inputs is not None and len(node.inputs) > lim.max_inputs:
        return "attribute", f"{len(node.inputs)} inputs exceed {lim.max_inputs}"
    if lim.types and op in ELTWISE_TYPES and ELTWISE_TYPES[op] not in lim.types:
        return "attribute", f"eltwise {ELTWISE_TYPES[op]} is not one of {', '.join(lim.types)}"
    if lim.modes and op == "Pad":
        mode = node.attributes.get_string("mode", "constant")
        if mode not in lim.modes:
            return "mode", f"pad mode {mode!r} is not one of {', '.join(lim.modes)}"
    x = shapes.static(node.inputs[0]) if node.inputs and node.inputs[0] is not None else None
    rank = len(x) if x is not None else None
    if lim.channel_axis_only:
        if op == "ArgMax":
            axes = [node.attributes.get_int("axis", 0)]
        else:
            given = node.attributes.get_ints("axes")
            arr = const_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
            axes = list(given) if given else ([] if arr is None else [int(a) for a in np.ravel(arr)])
        if rank is not None and [a % rank for a in axes] != [1]:
            return "attribute", f"reduces over axes {axes}; only the channel axis (1) is supported"
    if lim.output_padding_zero and any(node.attributes.get_ints("output_padding") or []):
        return "attribute", f"output_padding {list(node.attributes.get_ints('output_padding'))} is not zero"
    if lim.unit_stride_axes and op == "Slice" and rank is not None:
        axes_arr = (
            const_array(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
        )
        steps_arr = (
            const_array(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else None
        )
        if steps_arr is not None:
            axes = [int(a) % rank for a in np.ravel(axes_arr)] if axes_arr is not None else list(range(rank))
            for axis, step in zip(axes, np.ravel(steps_arr), strict=False):
                if axis in lim.unit_stride_axes and int(step) != 1:
                    return (
                        "stride",
                        f"slice step {int(step)} on axis {axis}; axes {list(lim.unit_stride_axes)} need step 1",
                    )
    ic = x[1] if x is not None and len(x) > 1 else None
    if lim.block_channels_max is not None and ic is not None:
        block = node.attributes.get_int("blocksize", 1)
        if block * block * ic > lim.block_channels_max:
            return (
                "channels",
                f"blocksize {block}^2 * {ic} channels = {block * block * ic} exceeds {lim.block_channels_max}",
            )
    if lim.in_channels_max is not None and ic is not None and ic > lim.in_channels_max:
        return "channels", f"{ic} input channels exceed {lim.in_channels_max}"
    return None


def check_limits(
    node: ir.Node, kind: str, limits: OpLimits, target: Target, shapes: ShapeTable
) -> tuple[str, str] | None:
    """(rule, reason) of the first limit of row ``kind`` that ``node`` breaks, or None."""
    row, lim = kind, limits
    if lim.lower_to is not None:
        geometry: _Geometry | str | None = _lowered_fc(node, shapes)
        row, lim = lim.lower_to, target.ops[lim.lower_to]
    elif node.op_type in _CONVS or lim.kernel is not None or lim.kernel_bank_depth is not None:
        geometry = _geometry(node, shapes) if node.op_type in _CONVS or "Pool" in node.op_type else None
    else:
        geometry = None
    if isinstance(geometry, str):
        return "attribute", f"{node.op_type} {node.name!r}: {geometry}"
    if node.op_type == "Resize" or node.op_type == "Upsample":
        bad = _resize_rules(node, lim, target, shapes)
    elif geometry is not None:
        bad = _geometry_rules(geometry, lim, target)
    else:
        bad = _other_rules(node, lim, shapes)
    if bad is None:
        return None
    rule, why = bad
    via = f" (as {row})" if row != kind else ""
    return rule, f"{node.op_type} {node.name!r}: {why} ({target.name} {kind}{via})"
