"""Estimated cycles, time and DDR traffic per NPU layer of a compiled model, from the target's hardware numbers.

The cost model (an estimate to compare layers, targets and buffer sizes, not a cycle-accurate simulator;
like Compass's profiler report and TPU-MLIR's LayerGroup cost, at the level of the DPU's PE array):

- conv / matmul on the MAC array with parallelism ``pixel x input channel x output channel`` (DPU B4096:
  8 x 16 x 16): per tile ``ceil(N h w / pp) * ceil(C_in_per_group / icp) * ceil(c / ocp) * kh * kw``
  (one tile per group-aligned chunk for grouped convs; depthwise: ``ceil(c / icp)`` in place of the
  two channel terms). A target with only ``macs_per_cycle`` (a flat array): ``ceil(tile MACs / macs_per_cycle)``.
- elementwise, pool, LUT, rescale, concat, transpose, resize: ``ceil(elements x window taps / vector
  width)`` (a global pool reads every input element once).
- every tile adds a fixed overhead (``engine.TILE_OVERHEAD_CYCLES``); renaming ops (copy, reshape) are free.
- memory cycles = DDR bytes (from ``zonnx.backend.compiler.tiling``: weights, inputs with halos,
  outputs, spills) / (DDR bandwidth / clock).
- layer cycles = ``max(compute, memory)``: DMA is double buffered and overlaps compute; the layer is
  "compute" or "memory" bound by which term wins. Layers run one after another on one core; the total
  is their sum, time = cycles / clock, fps = 1000 / total ms (NPU only).

CPU nodes of the compiled model are listed with their MACs but not estimated. A quantized model that
is not compiled yet is compiled first (``compile_model``). Public API: ``profile_model``,
``ProfileReport``, ``ProfileRow``, ``render_profile``, ``layer_cycles``.
"""

from __future__ import annotations

__all__ = ["ProfileRow", "ProfileReport", "profile_model", "render_profile", "layer_cycles"]

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any

import onnx
from rich.console import Console
from rich.table import Table

from zonnx.backend.compiled import NPU_DOMAIN, NPU_OP, compiled_info, is_compiled, read_program
from zonnx.backend.compiler.tiling import Engine, LayerPlan, plan_tiling
from zonnx.backend.targets import TARGETS_DIR, Target, load_target
from zonnx.errors import OptionError
from zonnx.inspection.macs import node_macs_by_name
from zonnx.inspection.render import PLAIN_BOX

logger = logging.getLogger(__name__)

PROFILE_VERSION = 1
#: CPU node types that only convert between float and codes (counted, not listed).
_CONVERT = {"QuantizeLinear", "DequantizeLinear", "FixNeuron", "VitisQuantizeLinear", "VitisDequantizeLinear"}
_MB = 1e6


def layer_cycles(plan: LayerPlan, eng: Engine) -> tuple[int, int]:
    """(compute cycles, memory cycles) of one planned layer by the module's rules."""
    if plan.unit == "alias":
        return 0, 0
    memory = math.ceil((plan.ddr_read + plan.ddr_write) / eng.ddr_bytes_per_cycle)
    overhead = eng.tile_overhead * plan.n_tiles
    if plan.unit == "vector":
        return math.ceil(plan.work / eng.vector) + overhead, memory
    n, c_out = plan.out[0], plan.out[1]
    compute = 0
    for th, nh in plan.tile_sizes(0):
        for tw, nw in plan.tile_sizes(1):
            for tc, nc in plan.tile_sizes(2):
                if eng.pe is None:
                    one = math.ceil(n * th * tw * tc * plan.cin * plan.taps / eng.macs_per_cycle)
                else:
                    pp, icp, ocp = eng.pe
                    pix = math.ceil(n * th * tw / pp)
                    if plan.groups > 1 and plan.cin == 1:  # depthwise: channels on the input-channel lanes
                        one = pix * math.ceil(tc / icp) * plan.taps
                    else:
                        oc_group = c_out // plan.groups
                        groups = max(1, math.ceil(tc / oc_group))
                        chans = math.ceil(plan.cin / icp) * math.ceil(min(tc, oc_group) / ocp)
                        one = pix * groups * chans * plan.taps
                compute += nh * nw * nc * one
    return compute + overhead, memory


@dataclasses.dataclass
class ProfileRow:
    """One NPU layer (with its plan and cycles) or one CPU node (MACs only, ``plan`` None)."""

    name: str
    kind: str
    device: str  # "npu" or "cpu"
    subgraph: int | None = None
    macs: int | None = 0
    plan: LayerPlan | None = None
    compute_cycles: int = 0
    memory_cycles: int = 0
    cycles: int = 0
    ms: float = 0.0
    bound: str = ""

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in dataclasses.asdict(self).items() if k != "plan"}
        if self.plan is not None:
            plan = self.plan.to_json()
            for key in ("index", "name", "kind", "macs"):
                plan.pop(key)
            data.update(plan)
        return data


@dataclasses.dataclass
class ProfileReport:
    """Rows in model order, the engine used, and what was assumed or done on the way (``notes``)."""

    model: str
    engine: Engine
    rows: list[ProfileRow]
    target_path: str = ""
    compiled_for: str = ""
    compiled_here: bool = False
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def npu_rows(self) -> list[ProfileRow]:
        return [r for r in self.rows if r.device == "npu"]

    @property
    def totals(self) -> dict[str, Any]:
        npu = [r for r in self.npu_rows if r.plan is not None]
        plans = [r.plan for r in npu if r.plan is not None]
        cycles = sum(r.cycles for r in npu)
        ms = cycles / (self.engine.clock_mhz * 1e3)
        return {
            "npu_layers": len(npu),
            "cpu_nodes": len(self.rows) - len(npu),
            "cycles": cycles,
            "ms": ms,
            "fps": 1000.0 / ms if ms else None,
            "macs_npu": sum(p.macs for p in plans),
            "macs_cpu": sum(r.macs or 0 for r in self.rows if r.device == "cpu"),
            "ddr_read": sum(p.ddr_read for p in plans),
            "ddr_write": sum(p.ddr_write for p in plans),
            "weight_read": sum(p.weight_read for p in plans),
            "in_read": sum(p.in_read for p in plans),
            "out_write": sum(p.out_write for p in plans),
            "spill": sum(p.spill_read + p.spill_write for p in plans),
            "tiled_layers": sum(p.n_tiles > 1 for p in plans),
            "memory_bound": sum(r.bound == "memory" for r in npu),
            "not_fitting": sum(not p.fits for p in plans),
        }

    def to_dict(self) -> dict[str, Any]:
        """Every number as plain JSON types (version ``PROFILE_VERSION``)."""
        return {
            "version": PROFILE_VERSION,
            "model": self.model,
            "target": self.engine.target,
            "target_path": self.target_path,
            "compiled_for": self.compiled_for,
            "compiled_here": self.compiled_here,
            "hardware": {k: v for k, v in dataclasses.asdict(self.engine).items() if "assumed" not in k},
            "assumed": list(self.engine.assumed),
            "assumed_in_target": list(self.engine.target_assumed),
            "notes": list(self.notes),
            "layers": [r.to_json() for r in self.rows],
            "totals": self.totals,
        }


def _load(model: Any) -> tuple[onnx.ModelProto, str]:
    from zonnx.backend.compile_api import CompiledModel
    from zonnx.ir.io import load_proto, to_proto

    if isinstance(model, CompiledModel):
        return model.model, "model"
    if isinstance(model, str | Path):
        return load_proto(model), str(model)
    if isinstance(model, bytes | bytearray):
        proto = onnx.ModelProto()
        proto.ParseFromString(bytes(model))
        return proto, "model"
    return (model if isinstance(model, onnx.ModelProto) else to_proto(model)), "model"


def profile_model(
    model: Any,
    target: str | Path | Target | None = None,
    *,
    clock_mhz: float | None = None,
    min_nodes: int = 2,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
) -> ProfileReport:
    """Profile a compiled model (or a quantized one, compiled first for ``target``; default dpu-b4096).

    ``target`` defaults to the compiled model's target; another target re-plans the same programs with
    its hardware numbers (a user ``.toml`` with other buffer sizes, say). ``clock_mhz`` overrides the
    target's clock. Errors: OptionError (bad clock or target), UnsupportedModelError (float model).
    """
    if clock_mhz is not None and not clock_mhz > 0:
        raise OptionError(f"--clock-mhz {clock_mhz}: give a positive frequency in MHz, e.g. 300.")
    proto, where = _load(model)
    notes: list[str] = []
    compiled_here = not is_compiled(proto)
    if compiled_here:
        from zonnx.backend.compile_api import compile_model

        chosen = target if target is not None else "dpu-b4096"
        src = model if isinstance(model, str | Path) else proto
        proto = compile_model(src, chosen, min_nodes=min_nodes, input_shapes=input_shapes).model
        compiled_for = load_target(chosen).name
        notes.append(f"{where} is not compiled: compiled it for {compiled_for} first")
    else:
        compiled_for = compiled_info(proto).get("target", "")
    tgt = load_target(target if target is not None else compiled_for)
    eng = Engine.from_target(tgt, clock_mhz)
    if clock_mhz is not None:
        notes.append(f"clock {clock_mhz:g} MHz given (the target's is {tgt.hardware.clock_mhz:g} MHz)")
    path = str(tgt.path) if tgt.path is not None and tgt.path.parent != TARGETS_DIR else ""
    if not compiled_here and compiled_for and compiled_for != eng.target:
        notes.append(f"compiled for {compiled_for}; profiled with the hardware numbers of {eng.target}")
    rows: list[ProfileRow] = []
    cpu_macs = node_macs_by_name(proto, input_shapes)  # shape arithmetic folded, as `zonnx inspect`
    converts = 0
    for node in proto.graph.node:
        if node.op_type == NPU_OP and node.domain == NPU_DOMAIN:
            rows += _npu_rows(node, eng)
        elif node.op_type in _CONVERT or node.op_type == "Constant":
            converts += 1
        else:
            rows.append(ProfileRow(node.name, node.op_type, "cpu", macs=cpu_macs.get(node.name, 0)))
    if converts:
        notes.append(f"{converts} quantize/dequantize/constant nodes run on the CPU (not listed)")
    aliases = sum(1 for r in rows if r.plan is not None and r.plan.unit == "alias")
    rows = [r for r in rows if r.plan is None or r.plan.unit != "alias"]
    if aliases:
        notes.append(
            f"{aliases} renaming NPU ops (copy, reshape, flatten, squeeze) cost nothing (not listed)"
        )
    report = ProfileReport(where, eng, rows, path, compiled_for, compiled_here, notes)
    logger.info("profiled %s for %s: %s", where, eng.target, report.totals)
    return report


def _npu_rows(node: onnx.NodeProto, eng: Engine) -> list[ProfileRow]:
    sub = next((a.i for a in node.attribute if a.name == "subgraph_id"), None)
    rows = []
    for plan in plan_tiling(read_program(node), eng):
        compute, memory = layer_cycles(plan, eng)
        cycles = max(compute, memory)
        bound = "" if plan.unit == "alias" else ("compute" if compute >= memory else "memory")
        ms = cycles / (eng.clock_mhz * 1e3)
        rows.append(
            ProfileRow(plan.name, plan.kind, "npu", sub, plan.macs, plan, compute, memory, cycles, ms, bound)
        )
    return rows


def _kb(n: int) -> str:
    return f"{n / 1024:,.1f}"


def _header(report: ProfileReport) -> str:
    e = report.engine
    array = f"PE {e.pe[0]}x{e.pe[1]}x{e.pe[2]}" if e.pe else f"{e.macs_per_cycle} MACs/cycle"
    if e.shared:
        mem = f"on-chip {e.onchip // 1024} KiB shared"
    else:
        mem = f"activation buffer {e.act_buffer // 1024} KiB, weight buffer {e.weight_buffer // 1024} KiB"  # type: ignore[operator]
    bw = e.ddr_bytes_per_cycle * e.clock_mhz * 1e6 / 1e9
    src = f" ({report.target_path})" if report.target_path else ""
    return (
        f"[bold]{report.model}[/] on [bold]{e.target}[/]{src}: {e.clock_mhz:g} MHz, {array}, vector "
        f"{e.vector}/cycle, {mem}, DDR {bw:g} GB/s, layer groups {'on' if e.layer_group else 'off'}"
    )


def render_profile(report: ProfileReport, console: Console | None = None) -> None:
    """Print the header, one row per NPU layer and CPU node, the totals and every assumption."""
    console = console or Console()
    console.print(_header(report))
    table = Table(box=PLAIN_BOX)
    cols = [
        "#",
        "layer",
        "op",
        "dev",
        "MACs",
        "cycles",
        "ms",
        "DDR rd KB",
        "DDR wr KB",
        "tile HxWxC",
        "tiles",
        "W res",
        "bound",
    ]
    for col in cols:
        table.add_column(
            col, justify="left" if col in ("layer", "op", "dev", "tile HxWxC", "bound") else "right"
        )
    for i, r in enumerate(report.rows):
        macs = "?" if r.macs is None else f"{r.macs:,}"
        p = r.plan
        if p is None:
            table.add_row(str(i), r.name, r.kind, "cpu", macs, *(["-"] * 7), "not estimated")
            continue
        tile = "x".join(map(str, p.tile)) + ("" if p.fits else " (too big)")
        res = "yes" if p.weights_resident else "no"
        table.add_row(
            str(i), r.name, r.kind, "npu", macs, f"{r.cycles:,}", f"{r.ms:.4f}", _kb(p.ddr_read),
            _kb(p.ddr_write), tile, str(p.n_tiles), res if p.weight_size else "-", r.bound,
        )  # fmt: skip
    console.print(table)
    t = report.totals
    fps = f"{t['fps']:.1f}" if t["fps"] else "n/a"
    console.print(
        f"NPU total: {t['cycles']:,} cycles = {t['ms']:.3f} ms at {report.engine.clock_mhz:g} MHz "
        f"({fps} fps, NPU only); DDR read {t['ddr_read'] / _MB:.2f} MB, written {t['ddr_write'] / _MB:.2f} MB "
        f"(weights {t['weight_read'] / _MB:.2f}, spills {t['spill'] / _MB:.2f}); {t['tiled_layers']} of "
        f"{t['npu_layers']} layers tiled, {t['memory_bound']} memory bound"
    )
    console.print(
        f"MACs: {t['macs_npu']:,} on the NPU, {t['macs_cpu']:,} on the CPU (CPU time not estimated)"
    )
    for note in report.notes:
        console.print(f"note: {note}")
    if report.engine.target_assumed:
        console.print(f"assumed in the target file: {', '.join(report.engine.target_assumed)}")
    for item in report.engine.assumed:
        console.print(f"assumed: {item}")
