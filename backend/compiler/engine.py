"""The target hardware numbers the tiling planner and the profiler need (``Engine.from_target``).

Each number a target file does not give is derived from what it gives and recorded in ``Engine.assumed``.
"""

from __future__ import annotations

__all__ = ["Engine", "TILE_OVERHEAD_CYCLES"]

import dataclasses

from zonnx.backend.targets import Target, load_target

#: Fixed cycles per tile (DMA descriptors, pipeline fill); no target file gives it.
TILE_OVERHEAD_CYCLES = 64
#: Families whose compilers keep tensors between layers on chip (TPU-MLIR LayerGroup, Compass auto-tiling).
_LAYER_GROUP_FAMILIES = {"tpu": "TPU-MLIR LayerGroup", "zhouyi": "Compass auto-tiling"}
_DEFAULT_ONCHIP = 1 << 20


@dataclasses.dataclass(frozen=True)
class Engine:
    """The hardware numbers of the cost model, derived from a target's ``[hardware]`` table.

    ``pe`` is (pixel, input-channel, output-channel) parallelism or None for a flat array of
    ``macs_per_cycle``; ``vector`` is elements per cycle of the elementwise / pool / LUT unit;
    ``act_buffer``/``weight_buffer`` are separate buffers (None when one ``onchip`` memory is shared).
    """

    target: str
    clock_mhz: float
    macs_per_cycle: int
    pe: tuple[int, int, int] | None
    vector: int
    act_buffer: int | None
    weight_buffer: int | None
    onchip: int
    ddr_bytes_per_cycle: float
    layer_group: bool
    tile_overhead: int = TILE_OVERHEAD_CYCLES
    assumed: tuple[str, ...] = ()  # derived here
    target_assumed: tuple[str, ...] = ()  # marked assumed in the target file

    @property
    def shared(self) -> bool:
        return self.act_buffer is None or self.weight_buffer is None

    @classmethod
    def from_target(cls, target: str | Target, clock_mhz: float | None = None) -> Engine:
        """Derive the engine; every value the file does not state is listed in ``assumed``."""
        t = load_target(target)
        hw = t.hardware
        assumed: list[str] = []
        pp, icp, ocp = hw.pixel_parallel, hw.input_channel_parallel, hw.output_channel_parallel
        pe: tuple[int, int, int] | None = None
        if pp or icp or ocp:
            icp = icp or hw.channel_parallel or 1
            if not ocp:
                ocp = hw.lanes or hw.channel_parallel or 1
                assumed.append(f"output_channel_parallel = {ocp} (output channels spread over the lanes)")
            if not pp:
                pp = max(1, hw.macs_per_cycle // (icp * ocp))
                assumed.append(f"pixel_parallel = {pp} (macs_per_cycle / (input x output channel parallel))")
            pe = (pp, icp, ocp)
        if hw.lanes and hw.eu_bytes:
            vector = hw.lanes * hw.eu_bytes
            assumed.append(f"vector unit = {vector} elements/cycle (lanes x eu_bytes)")
        elif pe is not None:
            vector = pe[0] * pe[1]
            assumed.append(f"vector unit = {vector} elements/cycle (pixel x input channel parallel)")
        else:
            vector = max(1, hw.macs_per_cycle // 16)
            assumed.append(f"vector unit = {vector} elements/cycle (macs_per_cycle / 16)")
        onchip = hw.onchip_memory_bytes or (hw.lanes or 0) * (hw.lane_memory_bytes or 0)
        if not onchip:
            onchip = (hw.activation_buffer_bytes or 0) + (hw.weight_buffer_bytes or 0) or _DEFAULT_ONCHIP
            assumed.append(f"onchip_memory_bytes = {onchip}")
        bw = hw.ddr_bandwidth_gbps or 8.0
        if not hw.ddr_bandwidth_gbps:
            assumed.append("ddr_bandwidth_gbps = 8.0")
        clock = clock_mhz if clock_mhz is not None else hw.clock_mhz
        group = getattr(hw, "layer_group", None)
        if group is None:
            group = t.family in _LAYER_GROUP_FAMILIES
            how = _LAYER_GROUP_FAMILIES.get(t.family, "each layer reads and writes DDR")
            assumed.append(f"layer_group = {str(group).lower()} (family {t.family or '?'}: {how})")
        assumed.append(f"{TILE_OVERHEAD_CYCLES} cycles of overhead per tile")
        buffers = (hw.activation_buffer_bytes, hw.weight_buffer_bytes, int(onchip))
        return cls(t.name, float(clock), hw.macs_per_cycle, pe, int(vector), *buffers, bw * 1e9 / (clock * 1e6),
                   bool(group), assumed=tuple(assumed), target_assumed=hw.assumed)  # fmt: skip
