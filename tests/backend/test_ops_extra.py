"""The op kinds mul, lincomb, matmul2, slice, gather, pad (``zonnx.backend.ops``): exact formulas on edge
cases (ties in every rounding mode, negative values, saturation), ORT lowering == numpy reference bit for bit,
and a hand-quantized model of every new ONNX op compiled for each target, against ORT's QDQ execution.

Each kind's formula, reference and ORT lowering live in its op module (``ops.registry``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import zonnx
from bench.bench_npu_fidelity import boundary_codes, layer_diffs, output_scales
from tests.backend.test_zoo_bitexact import assert_bit_exact
from zonnx.backend.compile_api import compile_model
from zonnx.backend.compiler import Op, Program, TensorInfo
from zonnx.backend.compiler.requant import ROUND_MODES
from zonnx.backend.partition import propose
from zonnx.backend.runtime.ort_lowering import program_to_model
from zonnx.backend.runtime.reference import run_program
from zonnx.custom_ops import add_functions, make_node

NPU = ["ZonnxNPUExecutionProvider", "CPUExecutionProvider"]
#: -6/4, -5/4, 5/4, 6/4 rounded in each mode (requant's table): ties at -1.5 and 1.5.
TIES = {
    "half_up": (-1, -1, 1, 2),
    "half_even": (-2, -1, 1, 2),
    "half_away": (-2, -1, 1, 2),
    "half_down": (-2, -1, 1, 1),
    "floor": (-2, -2, 1, 1),
    "ceil": (-1, -1, 2, 2),
    "trunc": (-1, -1, 1, 1),
}


def _info(name: str, dtype: str = "int8", shape: list | None = None) -> TensorInfo:
    lo, hi = (-128, 127) if dtype == "int8" else (0, 255)
    return TensorInfo(name, dtype, lo, hi, [1.0], [0], None, shape)


def _program(kind: str, ins: list[TensorInfo], out: TensorInfo, attrs: dict, params: dict) -> Program:
    op = Op(kind, "op", [t.name for t in ins], [out.name], attrs, params)
    return Program(ins, [out], [op], {t.name: t for t in [*ins, out]}, "test")


def _both(prog: Program, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(reference output, ORT-lowered output) as int64."""
    ref = run_program(prog, feeds)[prog.outputs[0].name]
    sess = ort.InferenceSession(
        program_to_model(prog, name="p").SerializeToString(), providers=["CPUExecutionProvider"]
    )
    got = sess.run(None, {f"p/{k}": v for k, v in feeds.items()})[0]
    assert got.dtype == np.dtype(prog.outputs[0].dtype)
    return ref, got.astype(np.int64)


def _grid(n: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Every int8 code against every int8 code, as two broadcasting tensors."""
    a = np.arange(-128, 128, dtype=np.int8)[:n]
    return a.reshape(-1, 1), a.reshape(1, -1)


# -- mul -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ROUND_MODES)
def test_mul_ties_negatives_saturation(mode: str) -> None:
    a, b = _grid()
    attrs = dict(zp_a=0, zp_b=0, zp_out=0, lo=-128, hi=127, round_mode=mode)
    params = {"multiplier": np.array([1], np.int64), "shift": np.array([2], np.int64)}
    prog = _program("mul", [_info("a"), _info("b")], _info("y"), attrs, params)
    ref, got = _both(prog, {"a": a, "b": b})
    assert np.array_equal(ref, got), int(np.sum(ref != got))
    at = lambda x, y: int(ref[x + 128, y + 128])  # noqa: E731
    assert (at(3, -2), at(5, -1), at(5, 1), at(3, 2)) == TIES[mode]  # -6/4, -5/4, 5/4, 6/4
    assert at(127, 127) == 127 and at(-128, 127) == -128 and at(-128, -128) == 127  # saturation


def test_mul_zero_points_constant_and_relu6_bounds() -> None:
    """uint8 codes with zero points times a per-channel constant, 15-bit multiplier, output clamped to
    a fused Relu6's [Z_y, Q(6)]."""
    x = np.arange(256).reshape(1, 4, 8, 8).astype(np.uint8)
    b = np.array([-128, -1, 0, 127], np.int16).reshape(4, 1, 1)
    attrs = dict(zp_a=131, zp_b=0, zp_out=7, lo=7, hi=200, round_mode="half_up")
    params = {"multiplier": np.array([23170], np.int64), "shift": np.array([19], np.int64), "b": b}
    prog = _program("mul", [_info("x", "uint8")], _info("y", "uint8"), attrs, params)
    ref, got = _both(prog, {"x": x})
    assert np.array_equal(ref, got)
    expect = np.floor((x.astype(np.int64) - 131) * b * 23170 / 2**19 + 0.5) + 7
    assert np.array_equal(ref, np.clip(expect, 7, 200))
    assert ref.min() == 7 and ref.max() == 200  # both bounds reached
    scalar = _program("mul", [_info("x", "uint8")], _info("y", "uint8"), attrs, {**params, "b": b[3:4]})
    ref, got = _both(scalar, {"x": x})  # a scalar constant folds into the multiplier
    expect = np.floor((x.astype(np.int64) - 131) * 127 * 23170 / 2**19 + 0.5) + 7
    assert np.array_equal(ref, got) and np.array_equal(ref, np.clip(expect, 7, 200))


# -- lincomb ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ROUND_MODES)
def test_lincomb_signed_terms_and_constant(mode: str) -> None:
    """Sub with a negative multiplier, plus a constant array term: (2 a - 2 b + 1 k) / 4."""
    a, b = _grid()
    k = np.array([-3, 0, 1, 2] * 64, np.int32).reshape(1, 256)
    attrs = dict(zps=[0, 0], zp_out=0, lo=-100, hi=100, round_mode=mode)
    params = {"multiplier": np.array([2, -2, 1], np.int64), "shift": np.array([2], np.int64), "const": k}
    prog = _program("lincomb", [_info("a"), _info("b")], _info("y"), attrs, params)
    ref, got = _both(prog, {"a": a, "b": b})
    assert np.array_equal(ref, got), int(np.sum(ref != got))
    at = lambda x, y: int(ref[x + 128, y + 128])  # noqa: E731
    # cells with k = 0 (b + 128 = 1 mod 4): (2 a - 2 b) / 4; -6/4 and 6/4 are ties
    assert (at(-2, 1), at(0, -3)) == (TIES[mode][0], TIES[mode][3])
    assert at(127, -127) == 100 and at(-128, 127) == -100  # saturation at the narrowed bounds


@pytest.mark.parametrize("mode", ["half_even", "half_away", "trunc"])
def test_lincomb_one_term_scalar_constant_and_zero_points(mode: str) -> None:
    """Div-like single term with a large multiplier and a scalar constant (folded into the constant)."""
    x = np.arange(256, dtype=np.uint8).reshape(1, 1, 16, 16)
    attrs = dict(zps=[128], zp_out=128, lo=0, hi=255, round_mode=mode)
    params = {
        "multiplier": np.array([-(2**30) - 12345, 1], np.int64),
        "shift": np.array([31], np.int64),
        "const": np.array([7 << 29], np.int64),
    }
    prog = _program("lincomb", [_info("x", "uint8")], _info("y", "uint8"), attrs, params)
    ref, got = _both(prog, {"x": x})
    assert np.array_equal(ref, got)
    assert ref.min() < 128 < ref.max()  # negative multiplier flips the sign around the zero point


# -- matmul2 ---------------------------------------------------------------------------------------
_ROUND = {
    "half_up": lambda v: np.floor(v + 0.5),
    "half_even": np.round,  # numpy rounds ties to even
    "floor": np.floor,
}


@pytest.mark.parametrize("mode", list(_ROUND))
def test_matmul2_exact_with_zero_points(mode: str) -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (2, 3, 5, 33)).astype(np.uint8)
    b = rng.integers(0, 256, (2, 3, 33, 4)).astype(np.uint8)
    a[0, 0, 0, :], b[0, 0, :, 0] = 255, 255  # (255 - 120)(255 - 3) 33 / 1024 = 1096: saturates
    a[1, 0, :2, :] = 120  # rows (a - 120) = +4 e_0 and -4 e_0 against b - 3 = 128: acc = +-512, ties
    a[1, 0, 0, 0], a[1, 0, 1, 0], b[1, 0, 0, 0] = 124, 116, 131
    attrs = dict(zp_a=120, zp_b=3, zp_out=10, lo=0, hi=255, round_mode=mode)
    params = {"multiplier": np.array([1 << 20], np.int64), "shift": np.array([30], np.int64)}
    ins = [_info("a", "uint8", list(a.shape)), _info("b", "uint8", list(b.shape))]
    ref, got = _both(_program("matmul2", ins, _info("y", "uint8"), attrs, params), {"a": a, "b": b})
    assert np.array_equal(ref, got)
    acc = np.matmul(a.astype(np.int64) - 120, b.astype(np.int64) - 3)
    assert np.array_equal(ref, np.clip(_ROUND[mode](acc / 1024) + 10, 0, 255))
    assert ref.min() == 0 and ref.max() == 255  # saturation
    ties = {"half_up": (11, 10), "half_even": (10, 10), "floor": (10, 9)}  # +-0.5, then + Z_y = 10
    assert (acc[1, 0, 0, 0], acc[1, 0, 1, 0]) == (512, -512) and (ref[1, 0, 0, 0], ref[1, 0, 1, 0]) == ties[
        mode
    ]


# -- slice / gather / pad ----------------------------------------------------------------------------
def test_slice_onnx_clamping_and_negative_steps() -> None:
    x = np.arange(2 * 3 * 5 * 7, dtype=np.int64).reshape(2, 3, 5, 7) % 251 - 125
    x = x.astype(np.int8)
    big = np.iinfo(np.int64).max
    cases = [
        ({"starts": [-1], "ends": [-1000], "axes": [3], "steps": [-2]}, x[:, :, :, ::-2]),
        ({"starts": [1, 0], "ends": [big, -1], "axes": [1, -1], "steps": None}, x[:, 1:, :, :-1]),
        ({"starts": [10], "ends": [2], "axes": [2], "steps": [-1]}, x[:, :, 4:2:-1]),
        (
            {"starts": [0, 0, 1, 2], "ends": [1, 3, 4, 7], "axes": None, "steps": [1, 2, 2, 3]},
            x[:1, ::2, 1:4:2, 2::3],
        ),
    ]
    for attrs, want in cases:
        prog = _program("slice", [_info("x")], _info("y"), attrs, {})
        ref, got = _both(prog, {"x": x})
        assert np.array_equal(ref, want.astype(np.int64)), attrs
        assert np.array_equal(ref, got), attrs


def test_gather_negative_indices_and_pad_modes() -> None:
    x = (np.arange(1 * 4 * 3 * 3) * 37 % 256 - 128).astype(np.int8).reshape(1, 4, 3, 3)
    prog = _program("gather", [_info("x")], _info("y"), {"axis": 1, "indices": [[0, -1], [2, 1]]}, {})
    ref, got = _both(prog, {"x": x})
    assert np.array_equal(ref, x[:, [[0, 3], [2, 1]]]) and np.array_equal(ref, got)
    for mode, value in (("constant", -128), ("constant", 5), ("edge", 0), ("reflect", 0)):
        attrs = {"pads": [0, 0, 1, 2, 0, 0, 2, 1], "axes": None, "mode": mode, "value": value}
        prog = _program("pad", [_info("x", shape=[1, 4, 3, 3])], _info("y"), attrs, {})
        ref, got = _both(prog, {"x": x})
        width = [(0, 0), (0, 0), (1, 2), (2, 1)]
        kw = {"constant_values": value} if mode == "constant" else {}
        assert np.array_equal(ref, np.pad(x, width, mode=mode, **kw)), mode
        assert np.array_equal(ref, got), mode
    prog = _program(
        "pad",
        [_info("x", shape=[1, 4, 3, 3])],
        _info("y"),
        {"pads": [1, 1], "axes": [-1], "mode": "constant", "value": 3},
        {},
    )
    ref, got = _both(prog, {"x": x})  # opset-18 axes, expanded for the opset-17 lowering
    assert ref.shape == (1, 4, 3, 5) and np.array_equal(ref, got)


# -- a hand-quantized model of every new ONNX op, per target ----------------------------------------
def _float_ops_model() -> onnx.ModelProto:
    """x, y [1,4,6,6]: Mul(x, y), Mul(c, x), Add(., c[4,1,1]), Add(., c)+Clip(0,6), Sub, Div(., 3), Mul(., 0.5),
    Slice, Split, Gather, Add, Pad, Transpose, MatMul(p, p^T)."""
    rng = np.random.default_rng(0)
    f32 = {"c_sc": [0.75], "c_one": [1.0], "lo": 0.0, "hi": 6.0, "three": [3.0], "half": [0.5]}
    i64 = {
        "st": [1],
        "en": [5],
        "ax": [2],
        "split": [1, 3],
        "idx": [2, 0, 1],
        "pads": [0, 0, 1, 1, 0, 0, 1, 1],
    }
    arrays = {k: np.array(v, np.float32) for k, v in f32.items()} | {
        k: np.array(v, np.int64) for k, v in i64.items()
    }
    arrays["c_ch"] = rng.normal(0, 0.5, (4, 1, 1)).astype(np.float32)
    n = helper.make_node
    nodes = [
        n("Mul", ["x", "y"], ["m1"], name="mul_xy"),
        n("Mul", ["c_sc", "x"], ["m2"], name="mul_c"),
        n("Add", ["m2", "c_ch"], ["a1"], name="add_c"),
        n("Add", ["m1", "c_one"], ["a3"], name="add_one"),
        n("Clip", ["a3", "lo", "hi"], ["r3"], name="relu6"),
        n("Sub", ["a1", "r3"], ["s1"], name="sub"),
        n("Div", ["s1", "three"], ["d1"], name="div"),
        n("Mul", ["d1", "half"], ["h"], name="mul_f"),
        n("Slice", ["h", "st", "en", "ax"], ["sl"], name="slice"),
        n("Split", ["sl", "split"], ["sp0", "sp1"], name="split", axis=1),
        n("Gather", ["sp1", "idx"], ["g"], name="gather", axis=1),
        n("Add", ["g", "sp0"], ["a2"], name="add_b"),
        n("Pad", ["a2", "pads"], ["p"], name="pad", mode="constant"),
        n("Transpose", ["p"], ["pt"], name="tr", perm=[0, 1, 3, 2]),
        n("MatMul", ["p", "pt"], ["out"], name="mm"),
    ]
    vi = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    graph = helper.make_graph(
        nodes,
        "ops",
        [vi("x", [1, 4, 6, 6]), vi("y", [1, 4, 6, 6])],
        [vi("out", [1, 3, 6, 6])],
        [numpy_helper.from_array(v, k) for k, v in arrays.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return onnx.shape_inference.infer_shapes(model)


def _hand_quantize(model: onnx.ModelProto, feeds: list[dict], form: str, skip: set[str]) -> onnx.ModelProto:
    """A quantizer after every float input and op output (not ``skip``), c_sc and c_ch quantized per tensor.

    form: "qdq_sym" (int8, Z = 0), "qdq" (uint8 asymmetric), "fix" (FixNeuron, power-of-two); grids from
    the float values on ``feeds``.
    """
    g = model.graph
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(
        helper.make_value_info(o, onnx.TypeProto()) for n in g.node for o in n.output if o != "out"
    )
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    runs = [dict(zip(names, sess.run(None, f), strict=True)) | f for f in feeds]
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    inits = list(g.initializer)

    def quantizer(src: str, dst: str, v: np.ndarray) -> list[onnx.NodeProto]:
        lo, hi = min(float(v.min()), 0.0), max(float(v.max()), 0.0)
        if form == "fix":
            pos = int(np.floor(np.log2(127.0 / max(-lo, hi, 1e-6))))
            return [make_node("FixNeuron", [src], [dst], name=f"{dst}_fix", pos=pos, bit_width=8, signed=1)]
        if form == "qdq_sym":
            s, z, dt = float(np.float32(max(-lo, hi, 1e-6) / 127)), 0, np.int8
        else:
            s = float(np.float32(max(hi - lo, 1e-6) / 255))
            z, dt = int(np.clip(round(-lo / s), 0, 255)), np.uint8
        inits.extend(
            [
                numpy_helper.from_array(np.array(s, np.float32), f"{dst}_s"),
                numpy_helper.from_array(np.array(z, dt), f"{dst}_z"),
            ]
        )
        return [
            helper.make_node("QuantizeLinear", [src, f"{dst}_s", f"{dst}_z"], [f"{dst}_q"], name=f"{dst}_Q"),
            helper.make_node(
                "DequantizeLinear", [f"{dst}_q", f"{dst}_s", f"{dst}_z"], [dst], name=f"{dst}_DQ"
            ),
        ]

    values = lambda t: np.concatenate([r[t].ravel() for r in runs])  # noqa: E731
    nodes: list[onnx.NodeProto] = []
    rename: dict[str, str] = {}
    for inp in g.input:
        nodes += quantizer(inp.name, f"{inp.name}_dq", values(inp.name))
        rename[inp.name] = f"{inp.name}_dq"
    for c in ("c_sc", "c_ch"):  # c_one stays a float scalar: a parameter of Add on float-scale targets
        if form == "fix":
            nodes += quantizer(c, f"{c}_dq", consts[c])
        else:
            s = float(np.float32(np.abs(consts[c]).max() / 127))
            inits += [
                numpy_helper.from_array(np.rint(consts[c] / s).astype(np.int8), f"{c}_q"),
                numpy_helper.from_array(np.array(s, np.float32), f"{c}_s"),
            ]
            nodes.append(
                helper.make_node("DequantizeLinear", [f"{c}_q", f"{c}_s"], [f"{c}_dq"], name=f"{c}_DQ")
            )
        rename[c] = f"{c}_dq"
    for node in g.node:
        new, after = onnx.NodeProto(), []
        new.CopyFrom(node)
        new.input[:] = [rename.get(i, i) for i in node.input]
        for k, o in enumerate(node.output):
            if o in skip:
                continue
            dst = o if o == "out" else f"{o}_dq"
            new.output[k] = f"{o}_f"
            after += quantizer(f"{o}_f", dst, values(o))
            rename[o] = dst
        nodes += [new, *after]
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(inits)
    del g.value_info[:]
    return add_functions(model) if form == "fix" else model


#: target -> (quantized form, op kinds its programs must contain)
_EXPECT = {
    "bm1684x": ("qdq_sym", {"mul", "lincomb", "slice", "gather", "pad", "transpose", "matmul2", "add"}),
    "zhouyi-x2": ("qdq", {"mul", "lincomb", "slice", "pad", "transpose", "matmul2", "add"}),
    "dpu-b4096": ("fix", {"mul", "lincomb", "slice", "pad", "add"}),
}


@pytest.fixture(scope="module")
def ops_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[dict]]]:
    rng = np.random.default_rng(3)
    feeds = [{k: rng.normal(0, 1, (1, 4, 6, 6)).astype(np.float32) for k in ("x", "y")} for _ in range(3)]
    folder = tmp_path_factory.mktemp("ops_extra")
    out = {}
    for form in ("qdq_sym", "qdq", "fix"):
        path = folder / f"ops_{form}.onnx"
        onnx.save(_hand_quantize(_float_ops_model(), feeds, form, skip={"a3"}), path)
        out[form] = (path, feeds)
    return out


@pytest.mark.parametrize("target", list(_EXPECT))
def test_every_new_op_compiles_bit_exact_and_close_to_qdq(ops_models, tmp_path: Path, target: str) -> None:
    form, kinds = _EXPECT[target]
    path, feeds = ops_models[form]
    cm = compile_model(path, target, min_nodes=1)
    made = {op.kind for p in cm.programs for op in p.ops}
    assert kinds <= made, kinds - made
    if target == "bm1684x":  # Add(x, 1.0) + Clip(0, 6) fused (TPU-MLIR relu_limit): one lincomb, clamped at 0
        op = next(op for p in cm.programs for op in p.ops if "relu6" in op.sources)
        assert op.kind == "lincomb" and op.sources[:2] == ["add_one", "relu6"] and op.attrs["lo"] == 0
        assert op.params["multiplier"][-1] == 1 and op.params["const"].size == 1  # the float constant term
    for feed in feeds[:2]:
        assert assert_bit_exact(path, cm, feed)[0] >= len(cm.programs)  # ORT lowering == reference
        worst, _, total = layer_diffs(
            cm.programs, boundary_codes(path, [t for p in cm.programs for t in p.tensors], feed)
        )
        assert total > 0 and worst <= 1  # each op on the QDQ model's own codes: at most one LSB off
    npu = zonnx.InferenceSession(
        cm.model.SerializeToString(),
        providers=NPU,
        provider_options=[{"target": target, "cache_dir": str(tmp_path), "executor": "ort"}, {}],
    )
    qdq = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    step = output_scales(path)["out"]
    for feed in feeds:
        a, b = npu.run(None, feed)[0], qdq.run(None, feed)[0]
        assert a.shape == b.shape == (1, 3, 6, 6)
        lsb = np.abs(np.rint(a / step) - np.rint(b / step))
        assert lsb.max() <= 2  # measured: 0 (bm1684x, zhouyi-x2), 1 (dpu-b4096, round half up vs half even)


def test_partition_rules_for_unlowerable_and_constant_operands(ops_models) -> None:
    """Softmax is refused with rule no_lowering; a float scalar divisor is a parameter on float-scale
    targets but must be quantized on the DPU (power of two)."""
    model = ir.serde.deserialize_model(onnx.load(ops_models["qdq_sym"][0]))
    d1 = next(v for n in model.graph for v in n.outputs if v.name == "d1_dq")
    model.graph.append(ir.node("Softmax", [d1], attributes={"axis": -1}, name="soft"))
    bm = propose(model, "bm1684x")
    assert (
        bm.nodes["soft"].rule == "no_lowering"
        and "no integer lowering for Softmax" in bm.nodes["soft"].reason
    )
    assert bm.nodes["div"].supported and bm.nodes["mul_f"].supported and bm.nodes["gather"].supported
    dpu = propose(ir.serde.deserialize_model(onnx.load(ops_models["fix"][0])), "dpu-b4096")
    assert dpu.nodes["mul_xy"].supported and dpu.nodes["mul_c"].supported and dpu.nodes["add_c"].supported
    assert dpu.nodes["mul_f"].rule == "not_quantized"  # 0.5 is a float constant: not a DPU parameter
    assert dpu.nodes["div"].rule == "op_type"
