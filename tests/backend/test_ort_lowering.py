"""The ORT lowering of NPU programs equals the numpy reference executor bit for bit (whole models and edge cases)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tests.backend.native_support import KERNEL_IDS, KERNELS, lowered_session
from tests.backend.test_compiler import _compile, digits, resnet  # noqa: F401  (module fixtures)
from zonnx.backend.compiler import Op, Program, TensorInfo, quantize_multiplier
from zonnx.backend.compiler.requant import ROUND_MODES, requantize
from zonnx.backend.native import ISA_ENV, conv_isa
from zonnx.backend.runtime.ort_kernels import Builder, KernelError, Term, emit_requant, storage_of
from zonnx.backend.runtime.ort_lowering import lower_program, program_to_model
from zonnx.backend.runtime.reference import run_program
from zonnx.zoo.digits import digits_data

#: Bit-exactness on this CPU: CI also runs these under emulated AVX2 and SSE4.1 CPUs (tools/exactness.sh).
pytestmark = pytest.mark.exactness


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _run_both(
    prog: Program, feeds: dict[str, np.ndarray], native: bool = False, ref: dict | None = None
) -> tuple[dict, dict]:
    """(reference tensors, ORT tensors) for every tensor the program computes (native: the C++ kernels);
    ``ref``: the reference's tensors when the caller already has them for these feeds."""
    ref = run_program(prog, feeds, debug=True) if ref is None else ref
    inner = [t for t in ref if t not in feeds]
    sess = lowered_session(program_to_model(prog, name="p", expose=inner, native=native), native)
    outs = sess.run(None, {f"p/{k}": v for k, v in feeds.items()})
    got = {o.name[2:]: v for o, v in zip(sess.get_outputs(), outs, strict=True)}
    return {t: ref[t] for t in inner}, got


def _assert_exact(
    prog: Program, feeds: dict[str, np.ndarray], native: bool = False, ref: dict | None = None
) -> int:
    ref, got = _run_both(prog, feeds, native, ref)
    for name, r in ref.items():
        g = got[name]
        assert g.dtype == np.dtype(prog.tensors[name].dtype), name
        assert np.array_equal(g.astype(np.int64), r), (name, int(np.sum(g.astype(np.int64) != r)))
    return len(ref)


# -- whole models ------------------------------------------------------------------------------------
def _input_codes(prog: Program, x: np.ndarray) -> np.ndarray:
    """``x`` quantized on the program's input grid (per-tensor)."""
    info = prog.inputs[0]
    q = np.rint(x / info.scale[0]) + info.zero_point[0]
    return np.clip(q, info.qmin, info.qmax).astype(info.dtype)


@pytest.mark.parametrize(("fmt", "target"), [("qdq", "bm1684x"), ("qdq", "zhouyi-x2"), ("fix", "dpu-b4096")])
@pytest.mark.parametrize("native", KERNELS, ids=KERNEL_IDS)
def test_digits_every_tensor_bit_exact(digits: dict, fmt: str, target: str, native: bool) -> None:  # noqa: F811
    prog, ins, _ = _compile(digits[fmt], target)
    x, _ = digits_data("test")
    assert _assert_exact(prog, {ins[0]: _input_codes(prog, x[:64])}, native) >= 10


@pytest.fixture(scope="module")
def resnet_programs(resnet: dict) -> Callable[[str, str], tuple]:  # noqa: F811
    """ResNet-18 compiled for (format, target), with its quantized input and the reference's tensors: each
    made once and shared by both lowerings (compiling costs about 30 s under tools/exactness.sh's qemu)."""
    made: dict[tuple[str, str], tuple] = {}

    def get(fmt: str, target: str) -> tuple:
        if (fmt, target) not in made:
            prog, ins, outs = _compile(resnet[fmt], target)
            feeds = {ins[0]: _input_codes(prog, resnet["x"])}
            made[fmt, target] = prog, feeds, outs, run_program(prog, feeds, debug=True)
        return made[fmt, target]

    return get


@pytest.mark.parametrize(("fmt", "target"), [("qdq", "bm1684x"), ("qdq", "zhouyi-x2"), ("fix", "dpu-b4096")])
@pytest.mark.parametrize("native", KERNELS, ids=KERNEL_IDS)
def test_resnet18_every_tensor_bit_exact(
    resnet_programs: Callable[[str, str], tuple],
    fmt: str,
    target: str,
    native: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prog, feeds, outs, ref = resnet_programs(fmt, target)
    assert _assert_exact(prog, feeds, native, ref) >= 30
    if native:  # the 31/15-bit multiplier convs run as one fused QConv each
        kinds = [n.op_type for n in lower_program(prog, name="npu0", native=True).nodes]
        assert target == "dpu-b4096" or (kinds.count("QConv") == 20 and "Im2col" not in kinds)
        assert "Round" not in kinds and "Slice" not in kinds
        # the other GEMM paths this CPU has (the run above took its best): portable on both targets,
        # AVX-VNNI on one (test_native checks every path on every rounding mode)
        seen = {conv_isa()}
        for forced in (
            ("avx-vnni", "baseline") if target == "bm1684x" else ("baseline",) * (target != "dpu-b4096")
        ):
            monkeypatch.setenv(ISA_ENV, forced)
            if conv_isa() not in seen:
                seen.add(conv_isa())
                assert _assert_exact(prog, feeds, native, ref) >= 30
        assert target == "dpu-b4096" or "portable" in seen
        return
    low = lower_program(prog, name="npu0")
    assert all(n.name.startswith("npu0/") for n in low.nodes)
    assert all(i.name.startswith("npu0/") for i in low.initializers)
    assert [v.name for v in low.outputs] == [f"npu0/{outs[0]}"]
    kinds = {n.op_type for n in low.nodes}
    if target == "dpu-b4096":  # power-of-two shifts: QLinearConv is provably exact (qlinear_exact)
        assert "QLinearConv" in kinds and sum(n.op_type == "MatMulInteger" for n in low.nodes) == 1  # the FC
    else:  # 31/15-bit multipliers: MLAS's float32 requantization is not exact, im2col + MatMulInteger
        assert "MatMulInteger" in kinds and "QLinearConv" not in kinds


# -- requantization arithmetic -----------------------------------------------------------------------
def _tie_accs(m: np.ndarray, s: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Per channel accumulators with exact ties (acc M = 2^(s-1) mod 2^s), negatives, and random values."""
    out = rng.integers(-(1 << 20), 1 << 20, size=(2, len(m), n), dtype=np.int64)
    for c, (mc, sc) in enumerate(zip(m.tolist(), s.tolist(), strict=True)):
        odd, tz = int(mc), 0
        while odd and odd % 2 == 0:
            odd, tz = odd >> 1, tz + 1
        if sc - tz < 1 or odd == 0:
            continue
        mod = 1 << (sc - tz)
        base = ((1 << (sc - tz - 1)) * pow(odd, -1, mod)) % mod  # acc * odd = 2^(s-tz-1) mod 2^(s-tz)
        js = rng.integers(-(1 << 24) // mod - 2, (1 << 24) // mod + 2, size=n // 2)
        out[0, c, : n // 2] = base + js * mod
    return out


def _requant_model(
    m: np.ndarray,
    s: np.ndarray,
    bias: np.ndarray,
    mode: str,
    force: str | None,
    out_dtype: str,
    zp: int,
    lo: int,
    hi: int,
) -> onnx.ModelProto:
    b = Builder("r")
    st = storage_of(out_dtype)
    y = emit_requant(
        b,
        [Term("acc", m.astype(object), float(1 << 25))],
        m.astype(object) * bias.astype(object),
        s,
        mode,
        zp,
        lo,
        hi,
        st,
        (-1, 1),
        where="t",
        force=force,
    )
    b.op("Identity", [y], "y")
    g = helper.make_graph(
        b.nodes,
        "g",
        [helper.make_tensor_value_info("acc", TensorProto.INT32, None)],
        [helper.make_tensor_value_info("y", st.onnx_type, None)],
        b.initializers,
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("bits", [15, 31])
@pytest.mark.parametrize("mode", ROUND_MODES)
def test_requant_ties_negatives_saturation(bits: int, mode: str) -> None:
    rng = np.random.default_rng(bits)
    ratios = np.concatenate([rng.uniform(1e-5, 3e-3, 6), [0.5, 1.0]])  # two coarse shifts: many ties
    pairs = [quantize_multiplier(float(r), bits, (0, 63)) for r in ratios]
    m = np.array([p[0] for p in pairs], np.int64)
    s = np.array([p[1] for p in pairs], np.int64)
    assert int(m.max()).bit_length() == bits if bits == 15 else int(m.max()).bit_length() >= 30
    bias = rng.integers(-5000, 5000, size=len(m))
    acc = _tie_accs(m, s, 64, rng).transpose(1, 0, 2).reshape(len(m), -1)
    acc = np.clip(acc, -(1 << 31), (1 << 31) - 1).astype(np.int32)
    for out_dtype, zp, lo, hi in (("int8", -3, -128, 127), ("uint8", 131, 131, 255)):
        want = requantize(
            acc.astype(np.int64) + bias[:, None], m[:, None], s[:, None], mode, zero_point=zp, lo=lo, hi=hi
        )
        assert np.any(want == lo) and np.any(want == hi)  # saturates at both ends
        forces = [None] + (["int64"] if mode in ("floor", "ceil", "half_up", "half_down") else [])
        for force in forces:
            got = _session(_requant_model(m, s, bias, mode, force, out_dtype, zp, lo, hi)).run(
                None, {"acc": acc}
            )[0]
            got = got.astype(np.int64) - storage_of(out_dtype).offset
            assert np.array_equal(got, want), (mode, bits, out_dtype, force, int(np.sum(got != want)))


def test_int64_path_refuses_sign_dependent_modes() -> None:
    m, s = np.array([(1 << 30) + 1]), np.array([31])
    with pytest.raises(KernelError, match="half_even"):
        _requant_model(m, s, np.zeros(1, np.int64), "half_even", "int64", "int8", 0, -128, 127)


# -- single ops ------------------------------------------------------------------------------------
_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535)}


def _info(name: str, dtype: str, zp: int = 0, shape: list | None = None) -> TensorInfo:
    lo, hi = _RANGES[dtype]
    return TensorInfo(name, dtype, lo, hi, [1.0], [zp], None, shape)


def _program(ops: list[Op], infos: list[TensorInfo], n_in: int = 1) -> Program:
    tensors = {t.name: t for t in infos}
    return Program(infos[:n_in], [infos[-1]], ops, tensors, "test")


@pytest.mark.parametrize("mode", ROUND_MODES)
@pytest.mark.parametrize(("dt_in", "dt_out"), [("uint8", "int8"), ("int8", "uint8")])
@pytest.mark.parametrize("native", KERNELS, ids=KERNEL_IDS)
def test_add_and_rescale_every_code(mode: str, dt_in: str, dt_out: str, native: bool) -> None:
    """Every pair of input codes through add (shift 1: half the sums are ties) and rescale (shift 2)."""
    a = np.arange(256).reshape(16, 16) + (-128 if dt_in == "int8" else 0)
    bq = a.T.copy()
    add = Op(
        "add",
        "add",
        ["a", "b"],
        ["s"],
        {
            "zp_a": 3,
            "zp_b": -5 if dt_in == "int8" else 5,
            "zp_out": 1,
            "lo": -100 if dt_out == "int8" else 10,
            "hi": 120,
            "round_mode": mode,
        },
        {"multiplier": np.array([3, 1]), "shift": np.array([1])},
    )
    resc = Op(
        "rescale",
        "rs",
        ["s"],
        ["y"],
        {"zp_in": 1, "zp_out": 2, "lo": 0 if dt_out == "uint8" else -128, "hi": 127, "round_mode": mode},
        {"multiplier": np.array([3]), "shift": np.array([2])},
    )
    prog = _program(
        [add, resc], [_info("a", dt_in), _info("b", dt_in), _info("s", dt_out), _info("y", dt_out)], 2
    )
    assert _assert_exact(prog, {"a": a.astype(dt_in), "b": bq.astype(dt_in)}, native) == 2


@pytest.mark.parametrize(
    ("mode", "bits", "group"),
    [
        ("half_up", 31, 1),
        ("half_away", 31, 2),
        ("half_even", 15, 1),
        ("trunc", 15, 4),
        ("floor", 31, 1),
        ("ceil", 15, 1),
    ],
)
@pytest.mark.parametrize("native", KERNELS, ids=KERNEL_IDS)
def test_conv_and_matmul(mode: str, bits: int, group: int, native: bool) -> None:
    rng = np.random.default_rng(group)
    w = rng.integers(-128, 128, size=(8, 8 // group, 3, 2))
    pairs = [quantize_multiplier(float(r), bits) for r in rng.uniform(1e-4, 3e-3, 8)]
    conv = Op(
        "conv",
        "c",
        ["x"],
        ["h"],
        {
            "strides": [2, 1],
            "pads": [1, 2, 0, 1],
            "dilations": [1, 2],
            "group": group,
            "pad_value": 7,
            "zp_out": -3,
            "lo": -128,
            "hi": 127,
            "round_mode": mode,
        },
        {
            "w": w.astype(np.int8),
            "bias": rng.integers(-20000, 20000, 8),
            "multiplier": np.array([p[0] for p in pairs]),
            "shift": np.array([p[1] for p in pairs]),
        },
    )
    flat = Op("flatten", "f", ["h"], ["hf"], {"axis": 1})
    wm = rng.integers(-128, 128, size=(8 * 4 * 10, 6)).astype(np.int8)
    mm = Op(
        "matmul",
        "m",
        ["hf"],
        ["y"],
        {"zp_out": 100, "lo": 0, "hi": 255, "round_mode": mode},
        {
            "w": wm,
            "bias": rng.integers(-9000, 9000, 6),
            "multiplier": np.full(6, pairs[0][0]),
            "shift": np.full(6, pairs[0][1] + 3),
        },
    )
    infos = [_info("x", "uint8", 7), _info("h", "int8"), _info("hf", "int8"), _info("y", "uint8")]
    x = rng.integers(0, 256, size=(3, 8, 9, 9)).astype(np.uint8)
    x[0] = 255  # saturating accumulators
    assert _assert_exact(_program([conv, flat, mm], infos), {"x": x}, native) == 3


@pytest.mark.parametrize("ceil", [0, 1])
@pytest.mark.parametrize("native", KERNELS, ids=KERNEL_IDS)
def test_pools_lut_resize_concat_clamp(ceil: int, native: bool) -> None:
    rng = np.random.default_rng(ceil)
    shape = [2, 4, 9, 8]
    pool = {"global": 0, "kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 0], "ceil_mode": ceil}
    ops = [
        Op("maxpool", "mp", ["x"], ["a"], dict(pool, dilations=[1, 1], pad_value=-128), {}),
        Op(
            "avgpool",
            "ap",
            ["x"],
            ["b"],
            dict(pool, zp_in=-2, zp_out=5, lo=-128, hi=127, round_mode="half_away"),
            {"multiplier": np.array([7282]), "shift": np.array([16])},
        ),
        Op("concat", "cc", ["a", "b"], ["c"], {"axis": 1, "lo": -100, "hi": 100}, {}),
        Op("lut", "lt", ["c"], ["d"], {"qmin_in": -128}, {"table": (np.arange(256) // 2).astype(np.uint8)}),
        Op(
            "resize_nearest",
            "rz",
            ["d"],
            ["e"],
            {"scales": [1.0, 1.0, 2.0, 1.5], "sizes": None, "ctm": "asymmetric", "nearest_mode": "floor"},
            {},
        ),
        Op("clamp", "cl", ["e"], ["f"], {"lo": 10, "hi": 90}, {}),
        Op(
            "avgpool",
            "gp",
            ["f"],
            ["g"],
            {
                "global": 1,
                "kernel": [0, 0],
                "zp_in": 0,
                "zp_out": 0,
                "lo": 0,
                "hi": 255,
                "round_mode": "half_even",
            },
            {"multiplier": np.array([1]), "shift": np.array([0])},
        ),
        Op("maxpool", "gm", ["f"], ["h"], {"global": 1}, {}),
        Op("transpose", "tr", ["f"], ["i"], {"perm": [0, 2, 3, 1]}, {}),
        Op("reshape", "rs", ["i"], ["j"], {"shape": [0, -1], "allowzero": 0}, {}),
        Op("unsqueeze", "us", ["j"], ["k"], {"axes": [1]}, {}),
        Op("squeeze", "sq", ["k"], ["l"], {"axes": [1]}, {}),
        Op("copy", "cp", ["l"], ["z"], {}, {}),
    ]
    x_dt = "int8"
    infos = (
        [_info("x", x_dt, 0, shape)]
        + [_info(t, x_dt) for t in "abcd"]
        + [_info(t, "uint8") for t in "efghijkl"]
        + [_info("z", "uint8")]
    )
    infos[4] = _info("d", "uint8")
    ops[6].attrs["kernel"] = [18, 12]
    x = rng.integers(-128, 128, size=shape).astype(np.int8)
    assert _assert_exact(_program(ops, infos), {"x": x}, native) == len(ops)


@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_clamp_over_the_whole_code_range_emits_no_clip(dtype: str) -> None:
    """A clamp whose bounds hold the input's whole code range is the identity (no ORT node); a narrower one
    stays a Clip; both equal the reference, also as the program's output."""
    lo, hi = _RANGES[dtype]
    ops = [
        Op("clamp", "whole", ["x"], ["a"], {"lo": lo, "hi": hi}, {}),
        Op("clamp", "narrow", ["a"], ["b"], {"lo": lo + 3, "hi": hi}, {}),
        Op("clamp", "last", ["b"], ["y"], {"lo": lo - 1, "hi": hi}, {}),
    ]
    prog = _program(ops, [_info(t, dtype) for t in "xaby"])
    model = program_to_model(prog, name="p", native=False)
    assert [n.op_type for n in model.graph.node].count("Clip") == 1
    x = np.random.default_rng(0).integers(lo, hi + 1, size=(2, 50)).astype(dtype)
    x[0, :2] = [lo, hi]
    assert _assert_exact(prog, {"x": x}) == 3
