"""The zonnx function bodies in ORT 1.31, the numpy kernels and ReferenceEvaluator agree bit for bit."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from zonnx.custom_ops import add_functions, make_node, reference_run, run_functions, run_reference
from zonnx.custom_ops.grid import ROUND_MODES, default_storage, dequantize_reference, qrange

POSITIONS = (-127, -8, -3, 0, 1, 5, 8, 13, 24, 126)
BIT_WIDTHS = (4, 8, 16)
#: (signed, narrow)
GRIDS = ((1, 0), (1, 1), (0, 0))
F32 = np.float32


def _bits_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: same dtype bits, or both NaN (the sign and payload of NaN are not specified)."""
    if a.dtype.kind == "f":
        both_nan = np.isnan(a) & np.isnan(b)
        return both_nan | (a.view(np.uint32) == b.view(np.uint32))
    return a == b


def _assert_same(name: str, got: np.ndarray, want: np.ndarray, x: np.ndarray | None = None) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, want.dtype)
    same = _bits_equal(got, want)
    if not same.all():
        i = np.flatnonzero(~same)[:5]
        where = f" x={x.ravel()[i].tolist()}" if x is not None else ""
        raise AssertionError(
            f"{name}: {int((~same).sum())} differ, got {got.ravel()[i]} want {want.ravel()[i]}{where}"
        )


def edge_inputs() -> np.ndarray:
    """Ties, their float32 neighbours, grid boundaries and specials for every pos, plus random tensors."""
    rng = np.random.default_rng(1234)
    tiny = np.array([2.0**-149, 2.0**-140, 2.0**-127, 2.0**-126, 1e-40], np.float64)
    specials = [0.0, -0.0, np.nan, np.inf, -np.inf, np.finfo(F32).max, -np.finfo(F32).max, *tiny, *(-tiny)]
    parts = [np.array(specials, F32)]
    k = np.concatenate([np.arange(-300, 301), rng.integers(-(2**17), 2**17, 400)]).astype(np.float64)
    bounds = np.array(
        [b + d for bw in (4, 8, 16) for g in GRIDS for b in qrange(bw, *g) for d in (-1, -0.5, 0.5, 1)]
    )
    for pos in POSITIONS:
        scale = 2.0**-pos
        for grid_points in (k + 0.5, k, k + 0.25, bounds):
            with np.errstate(over="ignore"):
                t = (grid_points * scale).astype(F32)
            parts += [t, np.nextafter(t, F32(np.inf)), np.nextafter(t, F32(-np.inf))]
    for scale in (1e-3, 1.0, 30.0, 1e4):
        parts.append((rng.standard_normal(3000) * scale).astype(F32))
        parts.append((rng.laplace(size=1000) * scale).astype(F32))
    parts.append((rng.uniform(-1, 1, 3000) * 10.0 ** rng.uniform(-30, 30, 3000)).astype(F32))
    return np.concatenate(parts)


def _cases() -> list[dict]:
    """Every rounding mode x bit width x grid, each with three of POSITIONS (every pos meets every mode)."""
    cases = []
    for i, (mode, bw, (signed, narrow)) in enumerate(itertools.product(ROUND_MODES, BIT_WIDTHS, GRIDS)):
        for j in range(3):
            pos = POSITIONS[(3 * i + j) % len(POSITIONS)]
            cases.append(dict(bit_width=bw, pos=pos, signed=signed, narrow=narrow, round_mode=mode))
    return cases


CASES = _cases()
STORAGE_INPUTS = {
    TensorProto.INT8: np.arange(-128, 128, dtype=np.int8),
    TensorProto.UINT8: np.arange(0, 256, dtype=np.uint8),
    TensorProto.INT16: np.arange(-(2**15), 2**15, dtype=np.int16),
    TensorProto.UINT16: np.arange(0, 2**16, dtype=np.uint16),
    TensorProto.INT32: np.concatenate(
        [
            np.array([-(2**31), 2**31 - 1, 2**24 + 1, -(2**24) - 1, 2**25 + 3, 0], np.int64),
            np.random.default_rng(5).integers(-(2**31), 2**31, 4000),
        ]
    ).astype(np.int32),
}
DQ_POSITIONS = (-127, -8, 0, 7, 24, 126)


def _model(cases: list[dict], opset: int = 17) -> tuple[onnx.ModelProto, list[tuple[str, str, dict, str]]]:
    """FixNeuron and VitisQuantizeLinear for every case on x, VitisDequantizeLinear on every storage type."""
    nodes, outputs, checks = [], [], []
    for i, case in enumerate(cases):
        for op, prefix in (("FixNeuron", "f"), ("VitisQuantizeLinear", "q")):
            out = f"{prefix}{i}"
            nodes.append(make_node(op, ["x"], [out], name=f"{op}_{i}", **case))
            dtype = (
                TensorProto.FLOAT if op == "FixNeuron" else default_storage(case["bit_width"], case["signed"])
            )
            outputs.append(helper.make_tensor_value_info(out, dtype, [None]))
            checks.append((out, op, case, "x"))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])]
    for dtype in STORAGE_INPUTS:
        name = f"codes_{TensorProto.DataType.Name(dtype).lower()}"
        inputs.append(helper.make_tensor_value_info(name, dtype, [None]))
        signed = int(dtype in (TensorProto.INT8, TensorProto.INT16, TensorProto.INT32))
        bits = {TensorProto.INT8: 8, TensorProto.UINT8: 8, TensorProto.INT16: 16, TensorProto.UINT16: 16}
        for pos in DQ_POSITIONS:
            out = f"d_{name}_{pos}"
            case = dict(pos=pos, bit_width=bits.get(dtype, 24), signed=signed)
            nodes.append(make_node("VitisDequantizeLinear", [name], [out], **case))
            outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, [None]))
            checks.append((out, "VitisDequantizeLinear", case, name))
    graph = helper.make_graph(nodes, "zonnx_ops", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return add_functions(model), checks


def _feeds() -> dict[str, np.ndarray]:
    feeds = {"x": edge_inputs()}
    feeds.update({f"codes_{TensorProto.DataType.Name(t).lower()}": v for t, v in STORAGE_INPUTS.items()})
    return feeds


@pytest.fixture(scope="module")
def built() -> tuple[onnx.ModelProto, list, dict[str, np.ndarray]]:
    model, checks = _model(CASES)
    return model, checks, _feeds()


@pytest.fixture(scope="module")
def expected(built) -> dict[str, np.ndarray]:
    _, checks, feeds = built
    return {out: reference_run(op, feeds[src], **case) for out, op, case, src in checks}


@pytest.fixture(scope="module")
def ort_outputs(built) -> dict[str, np.ndarray]:
    model, _, feeds = built
    return _run_ort(model, feeds, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)


def _run_ort(model: onnx.ModelProto, feeds: dict, level: ort.GraphOptimizationLevel) -> dict[str, np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def _compare(got: dict, expected: dict, checks: list, feeds: dict) -> None:
    for out, op, case, src in checks:
        x = feeds[src]
        want = expected[out]
        if op == "VitisQuantizeLinear" and case["bit_width"] > 16:
            keep = ~np.isnan(x)  # ORT's Cast of NaN to int32 is -2^31 on x86, the reference says 0
            _assert_same(f"{out} {op} {case}", got[out][keep], want[keep], x[keep])
        else:
            _assert_same(f"{out} {op} {case}", got[out], want, x)


def test_ort_matches_numpy_reference_bit_for_bit(built, expected, ort_outputs) -> None:
    model, checks, feeds = built
    assert model.ir_version <= 13
    assert len(checks) == 2 * len(CASES) + len(STORAGE_INPUTS) * len(DQ_POSITIONS)
    _compare(ort_outputs, expected, checks, feeds)


def test_ort_without_graph_optimizations_gives_same_bits() -> None:
    """With ORT_DISABLE_ALL the attribute constants are computed at run time instead of folded at load."""
    model, checks = _model(CASES[::4])
    feeds = _feeds()
    want = {out: reference_run(op, feeds[src], **case) for out, op, case, src in checks}
    _compare(_run_ort(model, feeds, ort.GraphOptimizationLevel.ORT_DISABLE_ALL), want, checks, feeds)


def test_reference_evaluator_runs_function_bodies_to_same_bits(built, expected) -> None:
    model, checks, feeds = built
    _compare(run_functions(model, feeds), expected, checks, feeds)


def test_run_reference_uses_numpy_kernels(built, expected) -> None:
    model, checks, feeds = built
    got = run_reference(model, feeds, outputs=[c[0] for c in checks[:40]])
    for out in got:
        _assert_same(out, got[out], expected[out])


def test_checker_full_check_accepts_model(built) -> None:
    model, _, _ = built
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.output}
    assert types["q0"] == TensorProto.INT8 and types["f0"] == TensorProto.FLOAT
    assert TensorProto.UINT16 in types.values() and TensorProto.INT16 in types.values()


def test_edge_values_hit_every_rounding_difference() -> None:
    """The inputs really exercise ties: every two rounding modes disagree somewhere at every bit width."""
    x = edge_inputs()
    for bw in BIT_WIDTHS:
        codes = {
            m: reference_run("VitisQuantizeLinear", x, pos=5, bit_width=bw, round_mode=m) for m in ROUND_MODES
        }
        for a, b in itertools.combinations(ROUND_MODES, 2):
            assert (codes[a] != codes[b]).any(), (bw, a, b)


def test_nan_inf_and_signed_zero(built) -> None:
    model, _, feeds = built
    x = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, -0.01, 0.01, -1e-40] * 8, F32)
    got = _run_ort(model, {**feeds, "x": x}, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    for i, case in enumerate(CASES):
        f, q = got[f"f{i}"], got[f"q{i}"]
        lo, hi = qrange(case["bit_width"], case["signed"], case["narrow"])
        assert np.isnan(f[0]), case
        assert q[0] == 0 or case["bit_width"] > 16  # ORT's Cast: NaN -> 0 for 8/16-bit storage (x86)
        assert (q[1], q[2], f[1]) == (hi, lo, dequantize_reference(np.array(hi), case["pos"])), case
        assert np.signbit(f[3]) and not np.signbit(f[4]), case  # -0.0 -> -0.0, +0.0 -> +0.0
        if -8 <= case["pos"] < 5:  # -0.01 * 2^pos and -1e-40 * 2^pos give a zero code, or -1 when flooring
            for v in (f[5], f[7]):
                if case["signed"] and case["round_mode"] == "floor":
                    assert v == -(2.0 ** -case["pos"]), case
                else:  # unsigned grids clamp at -0.0
                    assert v == 0 and np.signbit(v), case
            assert f[6] == 0 and not np.signbit(f[6]), case


def test_fixneuron_output_has_the_sign_bit_of_its_input(built, ort_outputs) -> None:
    _, checks, feeds = built
    got = ort_outputs
    x = feeds["x"]
    keep = ~np.isnan(x)
    for out, op, case, _src in checks:
        if op == "FixNeuron":
            assert (np.signbit(got[out][keep]) == np.signbit(x[keep])).all(), case


@pytest.mark.parametrize("opset", [13, 15, 18, 21])
def test_bodies_at_several_opsets(opset) -> None:
    x = edge_inputs()[:20000]
    nodes = [
        make_node("FixNeuron", ["x"], [f"y{i}"], pos=p, bit_width=8, round_mode=m)
        for i, (p, m) in enumerate(zip((3, -2, 0, 9, 24), ROUND_MODES, strict=True))
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [None]) for i in range(5)],
    )
    model = add_functions(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    )
    assert {f.opset_import[0].version for f in model.functions} == {opset}
    onnx.checker.check_model(model, full_check=True)
    got = _run_ort(model, {"x": x}, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    for i, (p, m) in enumerate(zip((3, -2, 0, 9, 24), ROUND_MODES, strict=True)):
        _assert_same(f"y{i}", got[f"y{i}"], reference_run("FixNeuron", x, pos=p, round_mode=m), x)


def test_extreme_bit_widths() -> None:
    """2- and 24-bit grids (all codes exact in float32) with the largest and smallest pos."""
    x = edge_inputs()
    cases = [
        dict(bit_width=bw, pos=p, signed=s, round_mode=m)
        for bw, p, s, m in itertools.product((2, 24), (-127, 0, 20, 126), (0, 1), ("half_up", "half_away"))
    ]
    nodes = [make_node("FixNeuron", ["x"], [f"y{i}"], **c) for i, c in enumerate(cases)]
    outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [None]) for i in range(len(cases))]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])], outs
    )
    model = add_functions(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    )
    got = _run_ort(model, {"x": x}, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    for i, case in enumerate(cases):
        _assert_same(f"y{i} {case}", got[f"y{i}"], reference_run("FixNeuron", x, **case), x)
