"""Tests for the target descriptions: bundled files, the numbers they carry, and errors on bad files."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

from zonnx.backend.targets import TARGETS_DIR, Target, known_targets, load_target
from zonnx.errors import OptionError


def test_bundled_targets_load_and_are_named_after_their_files() -> None:
    assert known_targets() == ["bm1684x", "dpu-b4096", "zhouyi-x2"]
    for name in known_targets():
        target = load_target(name)
        assert target.name == name
        assert target.path == TARGETS_DIR / f"{name}.toml"
        assert target.quant.activation_dtypes and target.ops and target.hardware.clock_mhz > 0
        for kind, limits in target.ops.items():
            assert limits.onnx, kind
    assert load_target("dpu-b4096") is load_target("dpu-b4096")  # cached
    assert load_target("DPUCZDX8G_ISA1_B4096").name == "dpu-b4096"  # alias
    target = load_target("bm1684x")
    assert load_target(target) is target
    with pytest.raises(dataclasses.FrozenInstanceError):
        target.name = "other"  # type: ignore[misc]


def test_dpu_quantization_rules_match_the_vitis_documents() -> None:
    q = load_target("dpu-b4096").quant
    assert q.power_of_two and q.activation_dtypes == ("int8",) and q.bias_bits == 8
    assert (q.activation_round_mode, q.weight_round_mode) == ("half_up", "half_even")
    assert q.align.concat and q.align.pool_ops == ("MaxPool", "AveragePool", "GlobalAveragePool")
    assert q.shift_cut is not None and (q.shift_cut.min, q.shift_cut.max) == (0, 16)
    assert q.shift_bias is not None
    # shift_bias in [min(0, -(24 - (8 + shift_cut))), 16]
    assert [q.shift_bias.limits(sc) for sc in (0, 8, 16)] == [(-16, 16), (-8, 16), (0, 16)]
    assert q.eltwise is not None and (q.eltwise.shift_read, q.eltwise.shift_write) == ((0, 15), (-15, 15))
    assert q.sigmoid is not None and (q.sigmoid.ipos, q.sigmoid.opos_min, q.sigmoid.shift) == (
        (0, 15),
        7,
        (0, 31),
    )
    assert q.leaky_relu is not None and [k / q.leaky_relu.denominator for k in q.leaky_relu.numerators] == [
        0.1015625
    ]


def test_dpu_avgpool_factors() -> None:
    rule = load_target("dpu-b4096").quant.avgpool
    assert rule is not None
    # The documented kernels: 3x3 -> 9*7/64, 5x5 -> 25*10/256, 6x6 -> 36*7/256, 7x7 -> 49*21/1024, 14x14 -> 196*21/4096.
    factors = {k: rule.factor(k, k) for k in (3, 5, 6, 7, 14)}
    assert factors == {3: (7, 6), 5: (10, 8), 6: (7, 8), 7: (21, 10), 14: (21, 12)}
    assert [k * k * m / 2**n for k, (m, n) in factors.items()] == [
        0.984375,
        0.9765625,
        0.984375,
        1.0048828125,
        1.0048828125,
    ]
    assert rule.factor(2, 2) is None and rule.factor(4, 4) is None and rule.factor(1, 1) is None  # exact
    assert rule.factor(256, 2) is None  # above max_kernel: not scaled
    k, n = rule.factor(10, 10)  # type: ignore[misc]
    assert (k, n) == (41, 12) and abs(k / 2**n - 0.01) < 1e-5  # n < 7 + ceil(log2(100)) = 14
    assert rule.factor(6, 1) == (85, 9)


def test_dpu_operator_table_reproduces_table_28_numbers() -> None:
    target = load_target("dpu-b4096")
    hw, conv = target.hardware, target.ops["conv2d"]
    assert (hw.channel_parallel, hw.bank_depth, hw.bank_num) == (16, 2048, 8)
    assert conv.kernel == (1, 16) and conv.stride == (1, 8) and conv.group == "one"
    assert conv.in_channels_max == conv.out_channels_max == 256 * hw.channel_parallel == 4096

    # kw * kh * ceil(ic / cp) <= bank_depth: a 3x3 conv takes at most 3632 input channels, 16x16 at most 128.
    def max_ic(k: int) -> int:
        return max(
            ic
            for ic in range(1, 4097)
            if k * k * math.ceil(ic / hw.channel_parallel) <= conv.weight_buffer_depth
        )

    assert (max_ic(3), max_ic(16)) == (3632, 128)
    # max pool: ceil(kh / bank_num) * kw <= bank_depth: kernel height 256 allows width 64.
    pool = target.ops["maxpool2d"]
    assert max(w for w in range(1, 257) if math.ceil(256 / hw.bank_num) * w <= pool.kernel_bank_depth) == 64
    assert set(target.ops_for("Conv")) == {"conv2d", "depthwise-conv2d"}
    assert (
        target.ops["depthwise-conv2d"].pad_cap == 15
        and "LeakyRelu" not in target.ops["depthwise-conv2d"].activations
    )
    assert target.ops["transposed-conv2d"].kernel_stride_ratio == (1, 16)
    assert target.ops["resize"].bilinear_scales == (2, 4, 8)
    assert target.ops["fully-connected"].lower_to == "conv2d"
    assert (
        hw.macs_per_cycle
        == hw.pixel_parallel * hw.input_channel_parallel * hw.output_channel_parallel
        == 2048
    )
    assert hw.peak_ops_per_second == pytest.approx(4096 * 300e6)
    assert "clock_mhz" in hw.assumed and "bank_depth" not in hw.assumed


def test_zhouyi_and_bm1684x_carry_their_quantization_schemes() -> None:
    z = load_target("zhouyi-x2")
    assert not z.quant.power_of_two and not z.quant.activation_symmetric
    assert z.quant.weight_granularity == "per_channel" and z.quant.weight_narrow
    assert set(z.quant.activation_dtypes) >= {"int8", "int16"}
    assert (z.quant.requant.mode, z.quant.requant.multiplier_bits, z.quant.requant.shift) == (
        "multiplier_shift",
        15,
        (0, 31),
    )
    assert z.quant.requant.bias_effective_bits == 32 and z.quant.requant.accumulator_bits == 48
    assert z.quant.lut is not None and (z.quant.lut.items_in_bits, z.quant.lut.items_in_bits_16bit) == (8, 10)
    assert "Sigmoid" in z.quant.lut.ops and z.quant.align.concat and z.quant.shift_cut is None
    b = load_target("bm1684x")
    assert b.quant.activation_symmetric and b.quant.weight_granularity == "per_channel"
    assert (b.quant.requant.multiplier_bits, b.quant.requant.per_channel, b.quant.requant.round_mode) == (
        32,
        True,
        "half_up",
    )
    assert b.quant.align.pool_ops == ("MaxPool",) and b.quant.leaky_relu is None
    hw = b.hardware
    assert (hw.lanes, hw.lane_memory_bytes, hw.memory_banks, hw.eu_bytes) == (64, 256 * 1024, 16, 64)
    assert hw.lanes * hw.lane_memory_bytes == hw.onchip_memory_bytes == 16 * 2**20


def _write(tmp_path: Path, text: str, name: str = "mine.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _dpu_text(**replace: str) -> str:
    text = (TARGETS_DIR / "dpu-b4096.toml").read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def test_a_user_file_loads_by_path(tmp_path: Path) -> None:
    path = _write(
        tmp_path, _dpu_text(**{'name = "dpu-b4096"': 'name = "my-dpu"', "max = 16\n": "max = 12\n"})
    )
    target = load_target(path)
    assert isinstance(target, Target) and target.name == "my-dpu" and target.path == path.resolve()
    assert target.quant.shift_cut is not None and target.quant.shift_cut.max == 12
    assert load_target(str(path)).quant.shift_cut.max == 12  # type: ignore[union-attr]
    minimal = _write(
        tmp_path,
        'name = "tiny"\n[quant]\nscale = "float"\nactivation_dtypes = ["int8"]\n'
        'weight_dtypes = ["int8"]\nbias_bits = 32\nactivation_symmetric = true\nweight_symmetric = true\n'
        '[quant.requant]\nmode = "multiplier_shift"\n[hardware]\nclock_mhz = 500\nmacs_per_cycle = 64\n',
        "tiny.toml",
    )
    tiny = load_target(minimal)
    assert tiny.ops == {} and tiny.quant.shift_cut is None and tiny.hardware.clock_mhz == 500.0
    assert tiny.quant.activation_round_mode == "half_even"


@pytest.mark.parametrize(
    ("replace", "fragments"),
    [
        ({"max = 16\n": "mxa = 16\n"}, ["key 'quant.shift_cut.mxa' is not known", "Did you mean 'max'?"]),
        ({"max = 16\n": 'max = "16"\n'}, ["key 'quant.shift_cut.max' must be an integer", "'16'"]),
        ({'name = "dpu-b4096"\n': ""}, ["key 'name' is required"]),
        ({"min = 0\n": ""}, ["key 'quant.shift_cut.min' is required"]),
        (
            {'activation_round_mode = "half_up"': 'activation_round_mode = "half-up"'},
            ["key 'quant.activation_round_mode' must be a rounding mode", "Did you mean 'half_up'?"],
        ),
        (
            {'scale = "power_of_two"': 'scale = "pow2"'},
            ["key 'quant.scale' must be one of 'power_of_two', 'float'"],
        ),
        ({"kernel = [1, 16]": "kernel = [16, 1]"}, ["key 'ops.conv2d.kernel' is a range [low, high]"]),
        (
            {"kernel = [1, 16]": "kernel = [1, 16, 3]"},
            ["key 'ops.conv2d.kernel' must be a list of 2 integers"],
        ),
        ({"concat = true": "concat = 1"}, ["key 'quant.align.concat' must be true or false"]),
        (
            {'lower_to = "conv2d"': 'lower_to = "conv2"'},
            ["'ops.fully-connected.lower_to'", "Did you mean 'conv2d'?"],
        ),
        ({'assumed = ["clock_mhz"': 'assumed = ["clock"'}, ["'hardware.assumed[0]'", "not a hardware key"]),
        ({"[hardware]": "[hardwear]"}, ["key 'hardwear' is not known", "Did you mean 'hardware'?"]),
        (
            {"[quant.shift_cut]": "[quant.shiftcut]"},
            ["key 'quant.shiftcut' is not known", "Did you mean 'shift_cut'?"],
        ),
        ({"denominator = 256": "denominator = 256\ndenominator = 128"}, ["not valid TOML"]),
    ],
)
def test_a_malformed_file_names_the_file_and_the_key(
    tmp_path: Path, replace: dict[str, str], fragments: list[str]
) -> None:
    path = _write(tmp_path, _dpu_text(**replace))
    with pytest.raises(OptionError) as info:
        load_target(path)
    message = str(info.value)
    assert message.startswith(str(path.resolve())), message
    for fragment in fragments:
        assert fragment in message, message


def test_unknown_names_and_missing_files_list_what_exists(tmp_path: Path) -> None:
    with pytest.raises(
        OptionError,
        match=re.escape(
            "unknown target 'dpu-b4069'. Did you mean 'dpu-b4096'? "
            "Known targets: bm1684x, dpu-b4096, zhouyi-x2"
        ),
    ):
        load_target("dpu-b4069")
    with pytest.raises(OptionError, match="no such target file"):
        load_target(tmp_path / "absent.toml")


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ("clock_mhz = 1000.0", "clock_mhz = 0.0"),
        ("clock_mhz = 1000.0", "clock_mhz = -300.0"),
        ("clock_mhz = 1000.0", "clock_mhz = nan"),
        ("macs_per_cycle = 2048", "macs_per_cycle = 0"),
        ("cores = 1", "cores = 0"),
        ("ddr_bandwidth_gbps = 25.6", "ddr_bandwidth_gbps = 0.0"),
        ("onchip_memory_bytes = 4194304", "onchip_memory_bytes = -1"),
        ("accumulator_bits = 48", "accumulator_bits = 200"),
    ],
)
def test_hardware_numbers_out_of_range_are_named(tmp_path: Path, line: str, value: str) -> None:
    """Every [hardware] number is range-checked; the error names the file, the key and the range
    (issue 17, item 6)."""
    text = (TARGETS_DIR / "zhouyi-x2.toml").read_text()
    assert line in text
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace(line, value))
    key = value.split(" =")[0]
    with pytest.raises(OptionError, match=rf"bad.toml.*hardware\.{key}.*must be"):
        load_target(bad)


def test_macs_per_cycle_must_agree_with_the_pe_array(tmp_path: Path) -> None:
    """dpu-b4096 states its PE array (8 x 16 x 16); a macs_per_cycle that disagrees would be ignored by
    the profiler, so it is refused, naming the key and the product (issue 17, item 6)."""
    text = (TARGETS_DIR / "dpu-b4096.toml").read_text()
    assert "macs_per_cycle = 2048" in text
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("macs_per_cycle = 2048", "macs_per_cycle = 4096"))
    with pytest.raises(OptionError, match=r"hardware\.macs_per_cycle.*is 4096.*8 x 16 x 16 = 2048"):
        load_target(bad)
