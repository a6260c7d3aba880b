"""Tiling and on-chip memory planning of an NPU ``Program`` for a target's buffers and DDR.

The model, kept simple enough to check by hand (in the spirit of TPU-MLIR's LayerGroup slicing and the
DPU's activation / weight banks):

- Every op is one layer with an output seen as ``(N, C, H, W)`` (2-D ``(M, K)`` tensors as ``C = K``
  channels of ``M`` rows; symbolic leading dims are 1). A tile is ``h`` output rows x ``w`` output
  columns x ``c`` output channels. A tile needs its input window: ``(h - 1) * stride + (k - 1) *
  dilation + 1`` rows for a kernel (the halo), the same rows for elementwise ops, every row for ops that
  mix rows (global pools, transposes, resizes); all input channels for conv (group 1) and matmul, the
  matching share for depthwise / elementwise ops; and its share ``c / C`` of the weights.
- On-chip fit: ``input tiles + output tile <= activation buffer`` and ``weight tile <= weight buffer``
  when the target has both (DPU banks), else ``inputs + output + weights <= onchip memory`` (one
  shared local memory: TPU LMEM, Zhouyi TCM). The planner splits output rows first (largest ``h``
  that fits, all channels), then output channels (weight chunks), then columns.
- A layer that does not fit even in 1 x 1 tiles is flagged (``fits``) and counted as one streamed tile.
- DDR traffic of a layer: inputs once per spatial tile (halo rows read twice), outputs once, weights
  once when all output channels fit (weights stay resident across row tiles), else once per spatial
  tile (re-read for every row tile). Ops that only rename a buffer (copy, reshape, flatten, squeeze,
  unsqueeze) cost nothing.
- Layer groups: when the target keeps tensors between layers on chip (``layer_group``), a tensor that
  only the very next layer reads stays on chip when neither layer is tiled: no DDR write and read.
  Otherwise it goes to DDR; such intermediate traffic is reported as a spill.

``Engine.from_target`` derives the numbers the model needs from ``[hardware]``; each number not in the
target file is recorded in ``Engine.assumed``. Public API: ``Engine``, ``LayerPlan``, ``plan_tiling``,
``attach_tiling``, ``TilingError``.
"""

from __future__ import annotations

__all__ = ["Engine", "LayerPlan", "TilingError", "plan_tiling", "attach_tiling", "ALIAS_KINDS", "PE_KINDS"]

import dataclasses
import logging
import math
from typing import Any

import numpy as np

from zonnx.backend.targets import Target, load_target
from zonnx.errors import ZonnxError

from .engine import Engine
from .program import Op, Program

logger = logging.getLogger(__name__)

#: Ops that rename a buffer (no data moves on the NPU).
ALIAS_KINDS = frozenset({"copy", "reshape", "flatten", "squeeze", "unsqueeze"})
#: Ops on the MAC array.
PE_KINDS = frozenset({"conv", "matmul"})


class TilingError(ZonnxError):
    """A program cannot be planned (a tensor without a static shape); the message says what to give."""


@dataclasses.dataclass
class LayerPlan:
    """The tiling of one program op and its DDR traffic in bytes (see the module docstring)."""

    index: int
    name: str
    kind: str
    unit: str  # "pe", "vector" or "alias"
    out: tuple[int, int, int, int]  # N, C, H, W
    tile: tuple[int, int, int]  # output rows, columns, channels per tile
    splits: tuple[int, int, int]  # tiles along H, W, C
    fits: bool
    onchip_bytes: int
    weight_size: int
    weights_resident: bool
    macs: int = 0
    work: int = 0  # vector-unit elements (output elements x window taps)
    taps: int = 1
    groups: int = 1
    cin: int = 0  # input channels per group (PE ops)
    weight_read: int = 0
    in_read: int = 0
    spill_read: int = 0
    out_write: int = 0
    spill_write: int = 0
    onchip_inputs: list[str] = dataclasses.field(default_factory=list)
    onchip_output: bool = False
    reads: dict[str, int] = dataclasses.field(default_factory=dict, repr=False)  # tensor -> bytes

    @property
    def n_tiles(self) -> int:
        return math.prod(self.splits)

    @property
    def ddr_read(self) -> int:
        return self.weight_read + self.in_read + self.spill_read

    @property
    def ddr_write(self) -> int:
        return self.out_write + self.spill_write

    def tile_sizes(self, axis: int) -> list[tuple[int, int]]:
        """(size, count) of the tiles along output axis 0 (rows), 1 (columns) or 2 (channels)."""
        total = (self.out[2], self.out[3], self.out[1])[axis]
        size, n = self.tile[axis], self.splits[axis]
        last = total - size * (n - 1)
        return [(size, n)] if last == size else [(size, n - 1), (last, 1)]

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("reads")
        data.update(n_tiles=self.n_tiles, ddr_read=self.ddr_read, ddr_write=self.ddr_write)
        return data


@dataclasses.dataclass
class _Input:
    name: str
    dims: tuple[int, int, int, int]
    itemsize: int
    rows: tuple[int, int, int, int] | None  # (kernel, stride, dilation, pad) or None = every row
    cols: tuple[int, int, int, int] | None
    follows: bool  # input channels split with the output channels

    def extent(self, out_len: int, axis: int) -> int:
        """Input rows (axis 0) or columns (axis 1) one tile of ``out_len`` needs, halo included."""
        full = self.dims[2 + axis]
        win = self.rows if axis == 0 else self.cols
        return full if win is None else min(full, (out_len - 1) * win[1] + (win[0] - 1) * win[2] + 1)

    def read(self, start: int, stop: int, axis: int) -> int:
        """Input rows / columns read for output [start, stop), clipped to the tensor (pads are free)."""
        full = self.dims[2 + axis]
        win = self.rows if axis == 0 else self.cols
        if win is None:
            return full
        k, s, d, pad = win
        lo, hi = start * s - pad, (stop - 1) * s - pad + (k - 1) * d + 1
        return max(0, min(hi, full) - max(lo, 0))


def _dims(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(N, C, H, W) of a tensor: NCHW as is; otherwise the last axis is C and the others are rows."""
    if len(shape) == 4:
        return (shape[0], shape[1], shape[2], shape[3])
    if not shape:
        return (1, 1, 1, 1)
    return (1, shape[-1], math.prod(shape[:-1]), 1)


def _shapes(program: Program) -> dict[str, tuple[int, ...]]:
    """Static shapes of every tensor: the program's, a symbolic leading dim as 1, else by running the op on zeros."""
    from zonnx.backend.runtime.reference import execute_op

    shapes: dict[str, tuple[int, ...]] = {}

    def known(name: str) -> tuple[int, ...] | None:
        info = program.tensors.get(name)
        if info is None or info.shape is None:
            return None
        dims = [
            d if isinstance(d, int) and d > 0 else (1 if i == 0 else None) for i, d in enumerate(info.shape)
        ]
        return None if None in dims else tuple(dims)  # type: ignore[return-value]

    for info in program.inputs:
        shape = known(info.name)
        if shape is None:
            raise TilingError(
                f"NPU program input {info.name!r} has no static shape ({info.shape}); compile the model "
                "with --input-shape NAME:D1,D2,... to profile it."
            )
        shapes[info.name] = shape
    for op in program.ops:
        out = op.outputs[0]
        shape = known(out)
        if shape is None:
            args = [np.zeros(shapes[i], np.int64) for i in op.inputs]
            shape = tuple(execute_op(op, args).shape)
        shapes[out] = shape
    return shapes


def _itemsize(program: Program, name: str) -> int:
    info = program.tensors.get(name)
    return np.dtype(info.dtype).itemsize if info is not None else 1


def _window(attrs: dict, axis: int, kernel: list[int]) -> tuple[int, int, int, int]:
    """(kernel, stride, dilation, leading pad) along output axis 0 (rows) or 1 (columns)."""
    strides, dil = attrs.get("strides") or [1, 1], attrs.get("dilations") or [1, 1]
    pads = attrs.get("pads") or [0, 0, 0, 0]
    return (int(kernel[axis]), int(strides[axis]), int(dil[axis]), int(pads[axis]))


def _inputs(op: Op, shapes: dict, program: Program) -> tuple[list[_Input], dict[str, Any]]:
    """The op's inputs as windows over its output, and its work numbers (macs, taps, groups, work)."""
    out = _dims(shapes[op.outputs[0]])
    n_out, a, x = math.prod(out), op.attrs, op.inputs[0]
    dims = {name: _dims(shapes[name]) for name in op.inputs}
    if op.kind == "conv" or (op.kind in ("maxpool", "avgpool") and not a.get("global")):
        kernel = list(op.params["w"].shape[2:]) if op.kind == "conv" else list(a["kernel"])
        kernel += [1] * (2 - len(kernel))
        taps, g = kernel[0] * kernel[1], int(a.get("group", 1))
        win = _Input(x, dims[x], _itemsize(program, x), _window(a, 0, kernel), _window(a, 1, kernel), True)
        if op.kind != "conv":
            return [win], {"work": n_out * taps, "taps": taps}
        win.follows = g > 1
        cin = int(op.params["w"].shape[1])
        return [win], {"macs": n_out * cin * taps, "taps": taps, "groups": g, "cin": cin}
    if op.kind == "matmul":
        same = (1, 1, 1, 0)
        k = int(op.params["w"].shape[0])
        return [_Input(x, dims[x], _itemsize(program, x), same, same, False)], {"macs": n_out * k, "cin": k}
    if op.kind in ("maxpool", "avgpool"):  # global: every input row for the one output row
        return [_Input(x, dims[x], _itemsize(program, x), None, None, True)], {"work": math.prod(dims[x])}
    rank = len(shapes[op.outputs[0]])
    channel_axis = 1 if rank == 4 else rank - 1
    mixes = op.kind in ("transpose", "resize_nearest") or (
        op.kind == "concat" and int(a.get("axis", 1)) % max(rank, 1) != channel_axis
    )
    ins = []
    for name in op.inputs:
        d = dims[name]
        row = (1, 1, 1, 0) if not mixes and d[2:] == out[2:] else None
        follows = not mixes and (d[1] == out[1] or op.kind == "concat")
        ins.append(_Input(name, d, _itemsize(program, name), row, row, follows))
    return ins, {"work": n_out}


def _weights(op: Op) -> tuple[int, bool]:
    """(bytes, split with the output channels): conv/matmul weights split, a LUT's table does not, a
    PRelu's per-channel tables do."""
    if op.kind in PE_KINDS:
        w = op.params["w"]
        return int(w.size * w.dtype.itemsize), True
    if op.kind == "lut":
        return int(op.params["table"].nbytes), False
    if op.kind == "prelu":  # one table per slope entry: per-channel tables split with the channels
        table = op.params["table"]
        return int(table.nbytes), table.shape[0] > 1
    return 0, False


def _fit(
    eng: Engine, ins: list[_Input], out: tuple, out_size: int, weights: int, split_w: bool
) -> tuple[tuple[int, int, int], bool, int]:
    """(tile h, w, c), whether it fits, its on-chip bytes: rows first, then channels, then columns."""
    n, c, h, w = out

    def need(th: int, tw: int, tc: int) -> tuple[int, int]:
        act = n * tc * th * tw * out_size
        for i in ins:
            ch = math.ceil(i.dims[1] * tc / c) if i.follows else i.dims[1]
            act += i.dims[0] * ch * i.extent(th, 0) * i.extent(tw, 1) * i.itemsize
        return act, (math.ceil(weights * tc / c) if split_w else weights)

    def ok(th: int, tw: int, tc: int) -> bool:
        act, wt = need(th, tw, tc)
        if eng.shared:
            return act + wt <= eng.onchip
        return act <= eng.act_buffer and wt <= eng.weight_buffer  # type: ignore[operator]

    align = eng.pe[2] if eng.pe else 1
    cands = {math.ceil(c / k) for k in range(1, c + 1)}
    chans = sorted({t if t == c or t <= align else t // align * align for t in cands})
    for tc in reversed(chans):
        if ok(1, w, tc):
            lo, hi = 1, h  # largest th with ok(th, w, tc): the footprint grows with th
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if ok(mid, w, tc) else (lo, mid - 1)
            return (lo, w, tc), True, sum(need(lo, w, tc))
    tc = chans[0]
    for tw in range(w, 0, -1):
        if ok(1, tw, tc):
            return (1, tw, tc), True, sum(need(1, tw, tc))
    return (h, w, c), False, sum(need(h, w, c))  # streamed whole: flagged, DDR counted once


def _plan_op(index: int, op: Op, shapes: dict, program: Program, eng: Engine) -> LayerPlan:
    out = _dims(shapes[op.outputs[0]])
    if op.kind in ALIAS_KINDS:
        return LayerPlan(
            index, op.name, op.kind, "alias", out, (out[2], out[3], out[1]), (1, 1, 1), True, 0, 0, True
        )
    ins, work = _inputs(op, shapes, program)
    out_size = _itemsize(program, op.outputs[0])
    wbytes, split_w = _weights(op)
    tile, fits, onchip = _fit(eng, ins, out, out_size, wbytes, split_w)
    splits = (math.ceil(out[2] / tile[0]), math.ceil(out[3] / tile[1]), math.ceil(out[1] / tile[2]))
    resident = splits[2] == 1 or not split_w
    unit = "pe" if op.kind in PE_KINDS else "vector"
    plan = LayerPlan(index, op.name, op.kind, unit, out, tile, splits, fits, onchip, wbytes, resident, **work)
    if not fits:
        logger.warning(
            "op %r does not fit on chip even in 1-row tiles; modelled as one streamed tile", op.name
        )
    plan.weight_read = wbytes if resident else wbytes * splits[0] * splits[1]
    for i in ins:
        rows = sum(i.read(k * tile[0], min(out[2], (k + 1) * tile[0]), 0) for k in range(splits[0]))
        cols = sum(i.read(k * tile[1], min(out[3], (k + 1) * tile[1]), 1) for k in range(splits[1]))
        plan.reads[i.name] = plan.reads.get(i.name, 0) + i.dims[0] * i.dims[1] * rows * cols * i.itemsize
    plan.out_write = math.prod(out) * out_size
    return plan


def _group_layers(plans: list[LayerPlan], program: Program, eng: Engine) -> None:
    """Keep a tensor on chip when only the next layer reads it and neither is tiled; classify DDR traffic."""
    root: dict[str, str] = {}
    for op, plan in zip(program.ops, plans, strict=True):
        if plan.unit == "alias":
            root[op.outputs[0]] = root.get(op.inputs[0], op.inputs[0])
    outputs = {root.get(t.name, t.name) for t in program.outputs}
    inputs = {t.name for t in program.inputs}
    readers: dict[str, list[int]] = {}
    for i, (op, plan) in enumerate(zip(program.ops, plans, strict=True)):
        if plan.unit != "alias":
            for name in op.inputs:
                readers.setdefault(root.get(name, name), []).append(i)
    real = [i for i, p in enumerate(plans) if p.unit != "alias"]
    following = {a: b for a, b in zip(real, real[1:], strict=False)}
    for i in real:
        op, plan = program.ops[i], plans[i]
        t = op.outputs[0]
        nxt = following.get(i)
        if (
            eng.layer_group
            and nxt is not None
            and t not in outputs
            and set(readers.get(t, [])) == {nxt}
            and plan.n_tiles == plans[nxt].n_tiles == 1
        ):
            plan.onchip_output, plan.out_write = True, 0
            plans[nxt].onchip_inputs += [n for n in program.ops[nxt].inputs if root.get(n, n) == t]
        elif t not in outputs:
            plan.spill_write, plan.out_write = plan.out_write, 0
    for plan in (plans[i] for i in real):
        for name, nbytes in plan.reads.items():
            if name not in plan.onchip_inputs and root.get(name, name) in inputs:
                plan.in_read += nbytes
            elif name not in plan.onchip_inputs:
                plan.spill_read += nbytes


def plan_tiling(
    program: Program, target: str | Target | Engine, *, clock_mhz: float | None = None
) -> list[LayerPlan]:
    """One ``LayerPlan`` per op of ``program`` (in order) for ``target``'s buffers; rules in the module docstring."""
    eng = target if isinstance(target, Engine) else Engine.from_target(target, clock_mhz)
    shapes = _shapes(program)
    plans = [_plan_op(i, op, shapes, program, eng) for i, op in enumerate(program.ops)]
    _group_layers(plans, program, eng)
    tiled, ddr = sum(p.n_tiles > 1 for p in plans), sum(p.ddr_read + p.ddr_write for p in plans)
    logger.info("planned %d ops for %s: %d tiled, %d DDR bytes", len(plans), eng.target, tiled, ddr)
    return plans


def attach_tiling(program: Program, target: str | Target | Engine) -> Program:
    """A copy of ``program`` whose ``meta["tiling"]`` holds the plan (target, per-op tiles and DDR bytes).

    Never fails on a program it cannot plan (a tensor without a static shape): the entry then holds
    ``"error"`` instead of ``"layers"``, so compiling such a model still works.
    """
    name = target.target if isinstance(target, Engine) else load_target(target).name
    keys = ("name", "tile", "n_tiles", "onchip_bytes", "weights_resident", "fits", "ddr_read", "ddr_write")
    try:
        entry: dict[str, Any] = {
            "layers": [
                {k: v for k, v in p.to_json().items() if k in keys} for p in plan_tiling(program, target)
            ]
        }
    except TilingError as e:
        logger.info("no tiling plan: %s", e)
        entry = {"error": str(e)}
    return dataclasses.replace(program, meta={**program.meta, "tiling": {"target": name, **entry}})
