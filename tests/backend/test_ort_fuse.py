"""QConvAdd (ort_fuse): a residual add fused into its QConv equals the unfused QConv + RequantU8 bit for bit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.backend.native_support import lowered_session
from tests.backend.test_compiler import _compile, resnet  # noqa: F401  (module fixture)
from zonnx.backend.compiler import TensorInfo
from zonnx.backend.compiler.requant import ROUND_MODES, requantize
from zonnx.backend.native import ISA_ENV
from zonnx.backend.runtime.ort_fuse import fuse_conv_add
from zonnx.backend.runtime.ort_kernels import Storage
from zonnx.backend.runtime.ort_lowering import lower_program, program_to_model
from zonnx.backend.runtime.ort_native import NATIVE_DOMAIN
from zonnx.backend.runtime.ort_values import Val
from zonnx.backend.runtime.reference import run_program

pytestmark = pytest.mark.exactness


@pytest.mark.parametrize(("fmt", "target"), [("qdq", "bm1684x"), ("qdq", "zhouyi-x2"), ("fix", "dpu-b4096")])
def test_resnet18_fused_equals_unfused(resnet: dict, fmt: str, target: str) -> None:  # noqa: F811
    prog, ins, outs = _compile(resnet[fmt], target)
    info = prog.inputs[0]
    q = np.clip(np.rint(resnet["x"] / info.scale[0]) + info.zero_point[0], info.qmin, info.qmax)
    feeds = {ins[0]: q.astype(info.dtype)}
    adds = [op.outputs[0] for op in prog.ops if op.kind == "add"]
    assert len(adds) == 8
    got = {}
    for fuse in (False, True):
        model = program_to_model(prog, name="p", expose=adds, native=True, fuse_add=fuse)
        kinds = [n.op_type for n in model.graph.node]
        assert kinds.count("QConvAdd") == (8 if fuse else 0)
        assert kinds.count("QConv") == (12 if fuse else 20)
        sess = lowered_session(model, True)
        outs_ = sess.run(None, {f"p/{k}": v for k, v in feeds.items()})
        got[fuse] = {o.name[2:]: v for o, v in zip(sess.get_outputs(), outs_, strict=True)}
    ref = run_program(prog, feeds, debug=True)
    for name in [outs[0], *adds]:
        assert np.array_equal(got[True][name], got[False][name]), name
        assert np.array_equal(got[True][name].astype(np.int64), ref[name]), name
    # the default lowering fuses; the pure-ONNX lowering has no native op at all
    assert [n.op_type for n in lower_program(prog, name="q", native=True).nodes].count("QConvAdd") == 8
    assert all(n.domain != NATIVE_DOMAIN for n in lower_program(prog, name="q").nodes)


# -- edge cases: every rounding mode, ties, saturation at both clamp bounds, both term orders, broadcasting ---
_C, _O = 8, 16


def _models(add: dict, term: int, skip_shape: list[int]) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(unfused QConv -> RequantU8 exposing the conv codes, the same fused by fuse_conv_add)."""
    rng = np.random.default_rng(7)
    w = rng.integers(-128, 128, size=(9 * _C, _O)).astype(np.int8)
    conv = helper.make_node(
        "QConv",
        ["x", "w"],
        ["c"],
        name="conv",
        domain=NATIVE_DOMAIN,
        kernel=[3, 3],
        strides=[1, 1],
        pads=[1, 1, 1, 1],
        dilations=[1, 1],
        x_zero_point=3,
        mult=[int(v) for v in rng.integers(1 << 10, 1 << 14, _O)],
        cnst=[int(v) for v in rng.integers(-(1 << 26), 1 << 26, _O)],
        shift=[26] * _O,
        mode=1,
        zs=128,
        lo=0,
        hi=255,
    )
    ins = ["c", "s"] if term == 0 else ["s", "c"]
    req = helper.make_node("RequantU8", ins, ["y"], name="add", domain=NATIVE_DOMAIN, **add)
    graph = helper.make_graph(
        [conv, req],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 6, 7, _C]),
            helper.make_tensor_value_info("s", TensorProto.UINT8, skip_shape),
        ],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        [helper.make_tensor("w", TensorProto.INT8, list(w.shape), w.tobytes(), raw=True)],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(NATIVE_DOMAIN, 1)]
    unfused = helper.make_model(graph, opset_imports=opsets)
    unfused.graph.output.append(helper.make_tensor_value_info("c", TensorProto.UINT8, None))
    st, info = Storage(np.dtype(np.uint8), 0), TensorInfo("t", "uint8", 0, 255, [1.0], [0])
    vals = [Val("c", st, info, nhwc=True), Val("s", st, info, nhwc=True)]
    nodes = fuse_conv_add(list(graph.node), vals, {"y"})
    assert [n.op_type for n in nodes] == ["QConvAdd"]
    fused = helper.make_model(
        helper.make_graph(nodes, "g", graph.input, graph.output, graph.initializer), opset_imports=opsets
    )
    unfused.ir_version = fused.ir_version = 10
    return unfused, fused


@pytest.mark.parametrize("isa", [None, "baseline"])
@pytest.mark.parametrize("mode", ROUND_MODES)
@pytest.mark.parametrize(
    ("mult", "shift", "lo", "hi"),
    [
        ([1, 1], 1, 60, 140),  # exact ties on every odd sum
        ([23380, 11444], 14, 40, 160),  # zhouyi-like 15-bit multipliers (float64 form)
        ([1532207547, 749996546], 30, 0, 255),  # bm1684x-like 31-bit multipliers
        ([(1 << 50) + 12345, (1 << 49) - 7], 50, 50, 150),  # beyond the float64 bound: the int64 loops
    ],
)
def test_edge_cases_equal(
    mode: str, mult: list[int], shift: int, lo: int, hi: int, isa: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each GEMM path (the best here; portable: the add's int64 loops too) on every rounding mode."""
    if isa is not None:
        monkeypatch.setenv(ISA_ENV, isa)
    rng = np.random.default_rng(11)
    x = rng.integers(0, 256, size=(1, 6, 7, _C), dtype=np.uint8)
    ncases = 0
    for per_channel, term, skip_shape in [
        (False, 0, [1, 6, 7, _O]),
        (True, 1, [1, 6, 7, _O]),
        (True, 0, [1, 1, 1, _O]),
    ]:
        m = np.array(mult, dtype=np.int64)
        ms = np.repeat(m, _O) + (np.tile(np.arange(_O), 2) if per_channel else 0)
        centre = -(int(m.sum()) * 128)
        k = np.array(
            [centre + j * (1 << max(shift - 3, 0)) * (-1) ** j for j in range(_O if per_channel else 1)]
        )
        add = {
            "terms": 2,
            "mult": [int(v) for v in (ms if per_channel else m)],
            "cnst": [int(v) for v in k],
            "shift": [shift] * len(k),
            "mode": ROUND_MODES.index(mode),
            "zs": 100,
            "lo": lo,
            "hi": hi,
            "caxis_from_end": 0,
            "wide": 0,
        }
        unfused, fused = _models(add, term, skip_shape)
        s = rng.integers(0, 256, size=skip_shape, dtype=np.uint8)
        yu, c = lowered_session(unfused, True).run(["y", "c"], {"x": x, "s": s})
        (yf,) = lowered_session(fused, True).run(["y"], {"x": x, "s": s})
        assert np.array_equal(yf, yu)
        # the add's rule in numpy on the conv codes: the unfused result is the reference's
        mm = np.asarray(add["mult"], dtype=np.int64).reshape(2, -1)
        a, b = (c, s) if term == 0 else (s, c)
        acc = mm[0] * a.astype(np.int64) + mm[1] * b.astype(np.int64) + k
        want = requantize(acc, 1, shift, mode, zero_point=100, lo=lo, hi=hi)
        assert np.array_equal(yu.astype(np.int64), want)
        if hi - lo < 255:  # saturation at both clamp bounds (the [0, 255] case: the uint8 range only)
            assert (want == lo).any() and (want == hi).any()
        ncases += 1
    assert ncases == 3
