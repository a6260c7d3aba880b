"""The frozen dataclasses of a target description: one class per table of the TOML file."""

from __future__ import annotations

__all__ = [
    "IntRange",
    "RoundMode",
    "ROUND_MODES",
    "ROUND_ALIASES",
    "Requant",
    "Lut",
    "Align",
    "ShiftCut",
    "ShiftBias",
    "Eltwise",
    "SigmoidLimits",
    "LeakyReluSlope",
    "AvgPoolFactor",
    "QuantRules",
    "OpLimits",
    "Hardware",
    "Target",
]

import dataclasses
import math
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, NewType

IntRange = tuple[int, int]
#: A rounding-mode name of ``zonnx.custom_ops`` (half_even, half_up, half_away, floor, trunc or an alias).
RoundMode = NewType("RoundMode", str)
ROUND_MODES = frozenset({"half_even", "half_up", "half_away", "floor", "trunc"})
ROUND_ALIASES = {
    "toward_zero": "trunc",
    "std_round": "half_away",
    "half_away_from_zero": "half_away",
    "half_to_even": "half_even",
}


@dataclasses.dataclass(frozen=True)
class Requant:
    """How an accumulator is brought back to the output grid: ``shift`` only (power-of-two scales) or an
    integer ``multiplier`` of ``multiplier_bits`` bits then a right shift in ``shift``."""

    mode: Literal["shift", "multiplier_shift"]
    multiplier_bits: int = 0
    shift: IntRange | None = None
    per_channel: bool = False
    round_mode: RoundMode = RoundMode("half_up")
    accumulator_bits: int = 32
    bias_effective_bits: int | None = None  # high bits of the bias the hardware adds (low bits zeroed)


@dataclasses.dataclass(frozen=True)
class Lut:
    """Nonlinear ops computed by a lookup table of ``2^items_in_bits`` entries (more for 16-bit data)."""

    ops: tuple[str, ...]
    items_in_bits: int
    items_in_bits_16bit: int | None = None
    interpolate: bool = False


@dataclasses.dataclass(frozen=True)
class Align:
    """Ops whose inputs and output must share one position (power of two) or one scale and zero point."""

    concat: bool = False
    pool_ops: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ShiftCut:
    """``shift_cut = wpos + ipos - opos`` must lie in [min, max] for ``ops`` (fixed by moving wpos)."""

    ops: tuple[str, ...]
    min: int
    max: int


@dataclasses.dataclass(frozen=True)
class ShiftBias:
    """``shift_bias = wpos + ipos - bpos`` in [min(0, -(accumulator_bits - (data_bits + shift_cut))), max]."""

    max: int
    accumulator_bits: int = 24
    data_bits: int = 8

    def limits(self, shift_cut: int) -> IntRange:
        return min(0, -(self.accumulator_bits - (self.data_bits + shift_cut))), self.max


@dataclasses.dataclass(frozen=True)
class Eltwise:
    """Eltwise ``ops``: ``shift_read = max(ipos) - min(ipos)``, ``shift_write = min(ipos) - opos`` limits,
    or (float scales) all inputs on one scale when ``equal_input_scales``."""

    ops: tuple[str, ...]
    shift_read: IntRange | None = None
    shift_write: IntRange | None = None
    equal_input_scales: bool = False


@dataclasses.dataclass(frozen=True)
class SigmoidLimits:
    """``ipos`` in range, ``opos >= opos_min``, ``shift_offset + ipos - opos`` in ``shift``."""

    ops: tuple[str, ...]
    ipos: IntRange
    opos_min: int
    shift_offset: int
    shift: IntRange


@dataclasses.dataclass(frozen=True)
class LeakyReluSlope:
    """The slopes the hardware has: ``k / denominator`` for k in ``numerators``."""

    denominator: int
    numerators: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class AvgPoolFactor:
    """``1/(kh*kw)`` as ``k / 2^n``: ``special`` rows ``[kh, kw, k, n]``, else the closest ``k/2^n`` with
    ``k = round(2^n / (kh*kw))`` over ``n < search_extra_bits + ceil(log2(kh*kw))``; no scaling when a
    kernel side exceeds ``max_kernel``."""

    max_kernel: int
    search_extra_bits: int
    special: tuple[tuple[int, int, int, int], ...] = ()

    def factor(self, kh: int, kw: int) -> tuple[int, int] | None:
        """(k, n) with ``k/2^n`` the hardware's 1/(kh*kw); None when the division is exact or not scaled."""
        if kh > self.max_kernel or kw > self.max_kernel:
            return None
        for row in self.special:
            if (row[0], row[1]) == (kh, kw):
                return row[2], row[3]
        area = kh * kw
        best: tuple[float, int, int] | None = None
        for n in range(self.search_extra_bits + math.ceil(math.log2(area))):
            k = round(2**n / area)
            diff = abs(k / 2**n - 1 / area)
            if best is None or diff < best[0]:
                best = (diff, k, n)
        assert best is not None
        return None if best[0] == 0 else (best[1], best[2])


@dataclasses.dataclass(frozen=True)
class QuantRules:
    """Quantization constraints; the rule tables that are absent are not required by the target."""

    scale: Literal["power_of_two", "float"]
    activation_dtypes: tuple[str, ...]
    weight_dtypes: tuple[str, ...]
    bias_bits: int
    activation_symmetric: bool
    weight_symmetric: bool
    requant: Requant
    activation_granularity: Literal["per_tensor", "per_channel"] = "per_tensor"
    weight_granularity: Literal["per_tensor", "per_channel"] = "per_tensor"
    activation_narrow: bool = False
    weight_narrow: bool = False
    activation_round_mode: RoundMode = RoundMode("half_even")
    weight_round_mode: RoundMode = RoundMode("half_even")
    align: Align = Align()
    lut: Lut | None = None
    shift_cut: ShiftCut | None = None
    shift_bias: ShiftBias | None = None
    eltwise: Eltwise | None = None
    sigmoid: SigmoidLimits | None = None
    leaky_relu: LeakyReluSlope | None = None
    avgpool: AvgPoolFactor | None = None

    @property
    def power_of_two(self) -> bool:
        return self.scale == "power_of_two"


@dataclasses.dataclass(frozen=True)
class OpLimits:
    """One row of the operator table; a missing limit means none. Formulas use ``hardware`` numbers."""

    onnx: tuple[str, ...]
    group: Literal["any", "one", "depthwise"] = "any"
    kernel: IntRange | None = None  # each of kh, kw
    kernel_area_max: int | None = None  # kh * kw
    square_kernel: bool = False
    kernel_stride_ratio: IntRange | None = None  # kh/sh and kw/sw (transposed convolutions)
    stride: IntRange | None = None
    dilation: IntRange | None = None
    pad_max_from_kernel: bool = False  # each pad <= (min(k-1, pad_cap)) * dilation
    pad_cap: int | None = None
    in_channels_max: int | None = None
    out_channels_max: int | None = None
    dilation_channels_max: int | None = None  # dilation * ic
    weight_buffer_depth: int | None = None  # kw * kh * ceil(ic / channel_parallel)
    kernel_bank_depth: int | None = None  # ceil(kh / bank_num) * kw
    block_channels_max: int | None = None  # blocksize^2 * ic (space-to-depth)
    nearest_bank_depth: int | None = None  # ceil(scale / bank_num) * scale * ceil(ic / channel_parallel)
    bilinear_scales: tuple[int, ...] = ()
    bilinear_half_pixel_scales: tuple[int, ...] = ()
    channel_axis_only: bool = False
    output_padding_zero: bool = False
    unit_stride_axes: tuple[int, ...] = ()
    max_inputs: int | None = None
    types: tuple[str, ...] = ()  # eltwise kinds: sum, prod
    modes: tuple[str, ...] = ()  # resize / pad modes
    activations: tuple[str, ...] = ()  # ONNX activations fused into the op
    lower_to: str | None = None  # handled as another kind (FC -> conv2d)
    notes: str = ""


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Numbers for the profiler; ``assumed`` names the fields that are assumptions, not documented."""

    clock_mhz: float
    macs_per_cycle: int
    cores: int = 1
    pixel_parallel: int | None = None
    input_channel_parallel: int | None = None
    output_channel_parallel: int | None = None
    channel_parallel: int | None = None
    bank_depth: int | None = None
    bank_num: int | None = None
    lanes: int | None = None
    lane_memory_bytes: int | None = None
    memory_banks: int | None = None
    eu_bytes: int | None = None
    onchip_memory_bytes: int | None = None
    activation_buffer_bytes: int | None = None
    weight_buffer_bytes: int | None = None
    l2_memory_bytes: int | None = None
    global_memory_bytes: int | None = None
    ddr_bandwidth_gbps: float | None = None
    dma_align_bytes: int | None = None
    weight_align_bytes: int | None = None
    accumulator_bits: int | None = None
    assumed: tuple[str, ...] = ()

    @property
    def peak_ops_per_second(self) -> float:
        """2 ops per MAC, all cores."""
        return 2.0 * self.macs_per_cycle * self.cores * self.clock_mhz * 1e6


@dataclasses.dataclass(frozen=True)
class Target:
    """A whole target description (the file format is described in ``zonnx.backend.targets``)."""

    name: str
    quant: QuantRules
    hardware: Hardware
    ops: Mapping[str, OpLimits] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    description: str = ""
    family: str = ""
    aliases: tuple[str, ...] = ()
    path: Path | None = None

    def ops_for(self, onnx_op: str) -> dict[str, OpLimits]:
        """The table rows (kind -> limits) that cover an ONNX op type."""
        return {kind: lim for kind, lim in self.ops.items() if onnx_op in lim.onnx}
