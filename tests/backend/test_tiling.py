"""Tiling and DDR planning (zonnx.backend.compiler.tiling) on tiny hand-built programs, numbers derived by hand."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from zonnx.backend.compiler.program import Op, Program, TensorInfo
from zonnx.backend.compiler.tiling import Engine, TilingError, attach_tiling, plan_tiling
from zonnx.backend.profile import layer_cycles
from zonnx.backend.targets import TARGETS_DIR

DPU = "dpu-b4096"
CONV_REQ = {"zp_out": 0, "lo": -128, "hi": 127, "round_mode": "half_up", "pad_value": 0}


def _info(name: str, shape: list | None) -> TensorInfo:
    return TensorInfo(name, "int8", -128, 127, [1.0], [0], None, shape)


def _conv(
    name: str, x: str, y: str, c_in: int, c_out: int, k: int = 3, stride: int = 1, group: int = 1
) -> Op:
    pad = (k - 1) // 2
    attrs = {"strides": [stride] * 2, "pads": [pad] * 4, "dilations": [1, 1], "group": group, **CONV_REQ}
    params = {
        "w": np.ones((c_out, c_in // group, k, k), np.int8),
        "bias": np.zeros(c_out, np.int64),
        "multiplier": np.ones(c_out, np.int64),
        "shift": np.zeros(c_out, np.int64),
    }
    return Op("conv", name, [x], [y], attrs, params)


def _program(ops: list[Op], shapes: dict[str, list | None], inputs: list[str], outputs: list[str]) -> Program:
    tensors = {n: _info(n, s) for n, s in shapes.items()}
    return Program([tensors[n] for n in inputs], [tensors[n] for n in outputs], ops, tensors, DPU)


def conv_program(c: int = 64, hw: int = 56, k: int = 3, group: int = 1) -> Program:
    """One k x k conv c -> c on hw x hw, pad (k-1)/2, stride 1 (batch symbolic)."""
    return _program(
        [_conv("conv", "x", "y", c, c, k, group=group)],
        {"x": ["N", c, hw, hw], "y": ["N", c, hw, hw]},
        ["x"],
        ["y"],
    )


def chain_program() -> Program:
    """conv -> copy -> conv, 64 channels on 56 x 56: the middle tensor is read only by the next layer."""
    ops = [
        _conv("c1", "x", "t", 64, 64),
        Op("copy", "q", ["t"], ["t2"]),
        _conv("c2", "t2", "y", 64, 64),
    ]
    shape = ["N", 64, 56, 56]
    return _program(ops, {"x": shape, "t": shape, "t2": shape, "y": shape}, ["x"], ["y"])


def user_target(tmp: Path, **changes: object) -> Path:
    """A copy of dpu-b4096.toml with some top-level or [hardware] keys changed."""
    text = (TARGETS_DIR / f"{DPU}.toml").read_text()
    for key, value in changes.items():
        new = f'"{value}"' if isinstance(value, str) else str(value)
        text, n = re.subn(rf"(?m)^{key} = \S+", f"{key} = {new}", text)
        assert n == 1, key
    path = tmp / f"dpu_{'_'.join(f'{k}{v}' for k, v in changes.items())}.toml"
    path.write_text(text)
    return path


def test_engines_from_the_bundled_targets() -> None:
    dpu = Engine.from_target(DPU)
    assert dpu.pe == (8, 16, 16) and dpu.vector == 8 * 16 and not dpu.shared
    assert (dpu.act_buffer, dpu.weight_buffer, dpu.ddr_bytes_per_cycle) == (
        262144,
        524288,
        64.0,
    )  # 19.2e9 / 300e6
    assert not dpu.layer_group and "clock_mhz" in dpu.target_assumed
    tpu = Engine.from_target("bm1684x")
    assert tpu.pe == (4, 64, 64) and tpu.shared and tpu.onchip == 16 << 20 and tpu.layer_group
    assert any(a.startswith("pixel_parallel = 4") for a in tpu.assumed)  # 16384 / (64 x 64)
    assert any(a.startswith("output_channel_parallel = 64") for a in tpu.assumed)
    zhouyi = Engine.from_target("zhouyi-x2")
    assert zhouyi.pe is None and zhouyi.vector == 2048 // 16 and zhouyi.layer_group
    assert Engine.from_target(DPU, clock_mhz=150).ddr_bytes_per_cycle == 128.0


def test_conv3x3_on_dpu_b4096_by_hand() -> None:
    (p,) = plan_tiling(conv_program(), DPU)
    assert p.macs == 64 * 64 * 9 * 56 * 56 == 115_605_504
    # rows: 64*56*(h + 2) input + 64*56*h output <= 256 KiB  ->  h = 35, two tiles (35 + 21 rows)
    assert p.tile == (35, 56, 64) and p.splits == (2, 1, 1) and p.n_tiles == 2 and p.fits
    assert p.onchip_bytes == 64 * 56 * (37 + 35) + 36864
    assert p.weights_resident and p.weight_read == 64 * 64 * 9
    assert p.in_read == (36 + 22) * 64 * 56  # rows [0, 36) and [34, 56): the halo is read twice
    assert p.out_write == 64 * 56 * 56 and p.spill_read == p.spill_write == 0
    compute, memory = layer_cycles(p, Engine.from_target(DPU))
    # ceil(35*56/8) * (64/16) * (64/16) * 9 + the same for 21 rows, plus 64 cycles per tile
    assert compute == (245 + 147) * 4 * 4 * 9 + 2 * 64 == 56576
    assert memory == math.ceil((36864 + 58 * 3584 + 200704) / 64) == 6960


def test_shrunk_activation_buffer_from_a_user_target(tmp_path: Path) -> None:
    target = user_target(tmp_path, activation_buffer_bytes=65536)
    (p,) = plan_tiling(conv_program(), target)
    # 3584 * (2h + 2) <= 65536  ->  h = 8, 7 tiles; input rows 9 + 5 * 10 + 9
    assert p.tile == (8, 56, 64) and p.n_tiles == 7 and p.weights_resident
    assert p.in_read == 68 * 3584
    compute, _ = layer_cycles(p, Engine.from_target(target))
    assert compute == 7 * 56 * 16 * 9 + 7 * 64


def test_weights_that_do_not_fit_are_read_again_per_row_tile(tmp_path: Path) -> None:
    target = user_target(tmp_path, activation_buffer_bytes=65536, weight_buffer_bytes=16384)
    (p,) = plan_tiling(conv_program(), target)
    # weights 576 B per output channel: 16 channels fit (32 do not); then 3584 (h + 2) + 896 h <= 64 KiB -> 13
    assert p.tile == (13, 56, 16) and p.splits == (5, 1, 4) and not p.weights_resident
    assert p.weight_read == 5 * 36864
    compute, _ = layer_cycles(p, Engine.from_target(target))
    assert compute == 4 * 4 * 91 * 36 + 4 * 28 * 36 + 20 * 64


def test_bigger_buffers_never_mean_more_tiles_or_ddr_bytes(tmp_path: Path) -> None:
    plans = []
    for size in (16384, 32768, 65536, 131072, 262144, 1 << 20):
        target = user_target(tmp_path, activation_buffer_bytes=size, weight_buffer_bytes=size)
        plans.append(plan_tiling(conv_program(128, 28), target)[0])
    tiles = [p.n_tiles for p in plans]
    ddr = [p.ddr_read + p.ddr_write for p in plans]
    assert tiles == sorted(tiles, reverse=True) and tiles[0] > tiles[-1] == 1
    assert ddr == sorted(ddr, reverse=True) and ddr[0] > ddr[-1] == 128 * 28 * 28 * 2 + 128 * 128 * 9
    assert all(p.fits for p in plans)


def test_flat_mac_array_and_vector_ops() -> None:
    (p,) = plan_tiling(conv_program(), "zhouyi-x2")  # 4 MB shared: one tile
    assert p.n_tiles == 1 and layer_cycles(p, Engine.from_target("zhouyi-x2"))[0] == 115_605_504 // 2048 + 64
    (d,) = plan_tiling(conv_program(group=64), DPU)  # depthwise: channels on the 16 input-channel lanes
    assert d.macs == 64 * 9 * 56 * 56 and d.n_tiles == 2
    assert layer_cycles(d, Engine.from_target(DPU))[0] == (245 + 147) * 4 * 9 + 2 * 64
    pool = Op(
        "maxpool", "pool", ["x"], ["y"], {"global": 0, "kernel": [3, 3], "strides": [2, 2], "pads": [1] * 4}
    )
    prog = _program([pool], {"x": [1, 64, 112, 112], "y": [1, 64, 56, 56]}, ["x"], ["y"])
    (m,) = plan_tiling(prog, "bm1684x")
    assert m.unit == "vector" and m.work == 64 * 56 * 56 * 9 and m.n_tiles == 1
    assert layer_cycles(m, Engine.from_target("bm1684x")) == (
        64 * 56 * 56 * 9 // 4096 + 64,  # 1806336 / 4096 = 441 exactly
        math.ceil((802816 + 200704) / 68),
    )


def test_matmul_is_memory_bound_on_the_dpu() -> None:
    w = np.ones((512, 1000), np.int8)
    params = {"w": w, "bias": np.zeros(1000, np.int64), "multiplier": np.ones(1000), "shift": np.zeros(1000)}
    op = Op("matmul", "fc", ["x"], ["y"], dict(CONV_REQ), params)
    (p,) = plan_tiling(_program([op], {"x": ["N", 512], "y": ["N", 1000]}, ["x"], ["y"]), DPU)
    assert p.macs == 512_000 and p.tile == (1, 1, 1000) and p.weights_resident
    compute, memory = layer_cycles(p, Engine.from_target(DPU))
    assert compute == 1 * 32 * 63 + 64 and memory == math.ceil((512000 + 512 + 1000) / 64) == 8024


def test_layer_groups_keep_the_next_layers_input_on_chip(tmp_path: Path) -> None:
    grouped = plan_tiling(
        chain_program(), user_target(tmp_path, family="tpu", activation_buffer_bytes=1 << 20)
    )
    plain = plan_tiling(chain_program(), user_target(tmp_path, activation_buffer_bytes=1 << 20))
    t = 64 * 56 * 56
    assert grouped[0].onchip_output and grouped[2].onchip_inputs == ["t2"]  # through the copy
    assert grouped[0].ddr_write == 0 and grouped[2].in_read == grouped[2].spill_read == 0
    assert plain[0].spill_write == t and plain[2].spill_read == t and not plain[0].onchip_output
    assert grouped[1].unit == "alias" and grouped[1].ddr_read == grouped[1].ddr_write == 0
    total = [sum(p.ddr_read + p.ddr_write for p in ps) for ps in (plain, grouped)]
    assert total[0] - total[1] == 2 * t
    tiled = plan_tiling(chain_program(), user_target(tmp_path, family="tpu"))  # 256 KiB: both layers tiled
    assert tiled[0].n_tiles == 2 and tiled[0].spill_write == t


def test_attach_tiling_records_the_plan_in_meta() -> None:
    prog = conv_program()
    out = attach_tiling(prog, DPU)
    assert "tiling" not in prog.meta
    layers = Program.from_bytes(out.to_bytes()).meta["tiling"]["layers"]
    assert layers == [
        {
            "name": "conv",
            "tile": [35, 56, 64],
            "n_tiles": 2,
            "onchip_bytes": 294912,
            "weights_resident": True,
            "fits": True,
            "ddr_read": 36864 + 58 * 3584,
            "ddr_write": 200704,
        }
    ]


def test_missing_shapes() -> None:
    prog = chain_program()
    prog.tensors["t"].shape = None  # inferred by running the op on zeros
    assert plan_tiling(prog, DPU)[0].out == (1, 64, 56, 56)
    prog.tensors["x"].shape = ["N", 64, "H", 56]
    with pytest.raises(TilingError, match="'x' has no static shape.*--input-shape"):
        plan_tiling(prog, DPU)
    assert "no static shape" in attach_tiling(prog, DPU).meta["tiling"]["error"]  # compiling still works


def test_rows_mixing_ops_reread_their_input_and_too_big_layers_are_flagged(tmp_path: Path) -> None:
    op = Op("transpose", "t", ["x"], ["y"], {"perm": [0, 1, 3, 2]})
    prog = _program([op], {"x": [1, 64, 56, 56], "y": [1, 64, 56, 56]}, ["x"], ["y"])
    (p,) = plan_tiling(prog, DPU)  # the whole input (196 KiB) + 64 x 56 x h output rows <= 256 KiB: h = 17
    assert p.tile == (17, 56, 64) and p.n_tiles == 4 and p.fits and p.in_read == 4 * 200704
    (q,) = plan_tiling(prog, user_target(tmp_path, activation_buffer_bytes=65536))
    assert not q.fits and q.n_tiles == 1 and q.in_read == 200704
