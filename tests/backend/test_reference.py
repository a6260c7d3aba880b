"""The numpy reference executor: exact against an independent float64/Fraction simulation and against ORT."""

from __future__ import annotations

import struct
from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from zonnx.backend.compiler import Op, Program, ProgramFormatError, TensorInfo
from zonnx.backend.compiler.lower import compile_subgraph, whole_model_subgraph
from zonnx.backend.compiler.requant import quantize_multiplier, round_fraction
from zonnx.backend.runtime import ReferenceError
from zonnx.backend.runtime.reference import run_program


def _info(name: str, dtype: str = "int8") -> TensorInfo:
    lo, hi = (-128, 127) if dtype == "int8" else (0, 255)
    return TensorInfo(name, dtype, lo, hi, [1.0], [0])


def _conv_program(
    w: np.ndarray, b_acc: np.ndarray, zx: int, group: int, mode: str
) -> tuple[Program, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    pairs = [quantize_multiplier(float(r), 32) for r in rng.uniform(1e-4, 3e-3, w.shape[0])]
    m = np.array([p[0] for p in pairs], np.int64)
    s = np.array([p[1] for p in pairs], np.int64)
    folded = b_acc - zx * w.reshape(w.shape[0], -1).sum(axis=1)
    op = Op(
        "conv",
        "c",
        ["x"],
        ["y"],
        {
            "strides": [2, 1],
            "pads": [1, 2, 1, 0],
            "dilations": [1, 2],
            "group": group,
            "pad_value": zx,
            "zp_out": -3,
            "lo": -128,
            "hi": 127,
            "round_mode": mode,
        },
        {"w": w.astype(np.int8), "bias": folded, "multiplier": m, "shift": s},
    )
    return Program([_info("x", "uint8")], [_info("y")], [op]), m, s


@pytest.mark.parametrize(
    ("group", "mode"), [(1, "half_up"), (1, "half_even"), (4, "half_away"), (8, "floor")]
)
def test_conv_matches_float64_fraction_simulation(group: int, mode: str) -> None:
    rng = np.random.default_rng(group)
    zx = 7
    w = rng.integers(-128, 128, size=(8, 8 // group, 3, 3))
    b_acc = rng.integers(-5000, 5000, size=8)
    prog, m, s = _conv_program(w, b_acc, zx, group, mode)
    prog = Program.from_bytes(prog.to_bytes())
    x = rng.integers(0, 256, size=(2, 8, 9, 10))
    got = run_program(prog, {"x": x.astype(np.uint8)})["y"]
    # Independent: float64 conv of (x - zx) padded with zeros (the unfolded formula), then exact rationals.
    acc = torch.nn.functional.conv2d(
        torch.nn.functional.pad(torch.from_numpy((x - zx).astype(np.float64)), (2, 0, 1, 1)),
        torch.from_numpy(w.astype(np.float64)),
        stride=(2, 1),
        dilation=(1, 2),
        groups=group,
    ).numpy()
    acc = acc + b_acc.reshape(1, -1, 1, 1)
    want = np.empty(acc.shape, np.int64)
    for idx in np.ndindex(acc.shape):
        c = idx[1]
        v = round_fraction(Fraction(int(acc[idx]) * int(m[c]), 1 << int(s[c])), mode) - 3
        want[idx] = min(127, max(-128, v))
    assert np.array_equal(got, want)


def test_saturation_and_ties_in_rescale_and_add() -> None:
    ops = [
        Op(
            "rescale",
            "r",
            ["x"],
            ["r"],
            {"zp_in": 0, "zp_out": 0, "lo": -128, "hi": 127, "round_mode": "half_even"},
            {"multiplier": np.array([3]), "shift": np.array([1])},
        ),
        Op(
            "add",
            "a",
            ["x", "r"],
            ["y"],
            {"zp_a": 0, "zp_b": 0, "zp_out": 0, "lo": -128, "hi": 127, "round_mode": "half_away"},
            {"multiplier": np.array([1, 1]), "shift": np.array([1])},
        ),
    ]
    prog = Program([_info("x")], [_info("y")], ops)
    x = np.array([-128, -3, -1, 1, 3, 127], np.int8)
    env = run_program(prog, {"x": x}, debug=True)
    assert env["r"].tolist() == [-128, -4, -2, 2, 4, 127]  # 1.5 * x: -4.5 -> -4, -1.5 -> -2 (even); saturated
    assert env["y"].tolist() == [-128, -4, -2, 2, 4, 127]  # (x + r) / 2: -3.5 -> -4, -1.5 -> -2 (away)


def test_program_blob_errors() -> None:
    prog = Program([_info("x")], [_info("y")], [Op("copy", "c", ["x"], ["y"])])
    blob = prog.to_bytes()
    assert Program.from_bytes(blob).to_bytes() == blob
    with pytest.raises(ProgramFormatError, match="bad magic"):
        Program.from_bytes(b"XXXX" + blob[4:])
    with pytest.raises(ProgramFormatError, match="version 99"):
        Program.from_bytes(blob[:4] + struct.pack("<I", 99) + blob[8:])
    with pytest.raises(ProgramFormatError, match="corrupt"):
        Program.from_bytes(blob[:-30])
    with pytest.raises(ReferenceError, match="integer codes"):
        run_program(prog, {"x": np.zeros(3, np.float32)})
    with pytest.raises(ReferenceError, match="missing"):
        run_program(prog, {})
    info = _info("x", "uint8")
    with pytest.raises(ReferenceError, match="outside"):
        run_program(Program([info], [info], []), {"x": np.array([-1])})


def _qdq_lut_model() -> onnx.ModelProto:
    """x -> Q -> DQ -> {Sigmoid, HardSwish, Tanh, HardSigmoid} -> Q -> DQ -> Concat -> Q -> DQ -> Resize x2 ->
    AveragePool 3x3 -> GlobalAveragePool, every float op between DQ and Q."""
    nodes, inits = [], []

    def qp(name: str, scale: float, zp: int) -> None:
        inits.extend(
            [
                numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
                numpy_helper.from_array(np.array(zp, np.uint8), f"{name}_z"),
            ]
        )

    def qdq(src: str, name: str) -> str:
        nodes.append(
            helper.make_node(
                "QuantizeLinear", [src, f"{name}_s", f"{name}_z"], [f"{name}_q"], name=f"{name}_Q"
            )
        )
        nodes.append(
            helper.make_node(
                "DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"], name=f"{name}_DQ"
            )
        )
        return f"{name}_dq"

    qp("in", 8 / 255, 128)
    x = qdq("x", "in")
    branches = []
    for op, scale, zp in [
        ("Sigmoid", 1 / 255, 0),
        ("HardSwish", 0.03, 20),
        ("Tanh", 2 / 255, 128),
        ("HardSigmoid", 1 / 250, 0),
    ]:
        nodes.append(helper.make_node(op, [x], [f"{op}_y"], name=op))
        qp(op, scale, zp)
        branches.append(qdq(f"{op}_y", op))
    nodes.append(helper.make_node("Concat", branches, ["cat"], name="Concat", axis=1))
    qp("cat", 0.02, 30)
    c = qdq("cat", "cat")
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    nodes.append(helper.make_node("Resize", [c, "", "scales"], ["rs"], name="Resize", mode="nearest"))
    qp("rs", 0.02, 30)
    r = qdq("rs", "rs")
    nodes.append(
        helper.make_node(
            "AveragePool",
            [r],
            ["ap"],
            name="AvgPool",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
            count_include_pad=1,
        )
    )
    qp("ap", 0.011, 40)
    a = qdq("ap", "ap")
    nodes.append(helper.make_node("GlobalAveragePool", [a], ["gap"], name="GAP"))
    qp("gap", 0.005, 50)
    nodes.append(helper.make_node("QuantizeLinear", ["gap", "gap_s", "gap_z"], ["gap_q"], name="gap_Q"))
    nodes.append(helper.make_node("DequantizeLinear", ["gap_q", "gap_s", "gap_z"], ["y"], name="gap_DQ"))
    graph = helper.make_graph(
        nodes,
        "lut",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12, 1, 1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize("target", ["zhouyi-x2", "bm1684x"])
def test_lut_resize_pool_against_ort(target: str) -> None:
    model = _qdq_lut_model()
    names, ins, outs = whole_model_subgraph(model)
    prog = compile_subgraph(model, names, ins, outs, target)
    assert {"lut": 4, "concat": 1, "resize_nearest": 1, "avgpool": 2}.items() <= prog.op_counts().items()
    x = np.random.default_rng(0).uniform(-4, 4, size=(2, 3, 6, 6)).astype(np.float32)
    names_out = [t for t in prog.tensors if t.endswith("_q")]
    for n in names_out:
        model.graph.output.append(helper.make_value_info(n, onnx.TypeProto()))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x}), strict=True))
    got = run_program(prog, {ins[0]: ref[ins[0]]}, debug=True)
    for n in names_out:
        d = np.abs(got[n] - ref[n].astype(np.int64))
        assert d.max() <= 1, (n, d.max())
    # Resize on codes is exact when fed ORT's own input codes.
    resize = next(op for op in prog.ops if op.kind == "resize_nearest")
    from zonnx.backend.runtime.reference import execute_op

    assert np.array_equal(execute_op(resize, [ref["cat_q"].astype(np.int64)]), ref["rs_q"])
