"""exact-int-weights: QOperator and integer ops with int8 weights run exactly after it, on every CPU.

Every case multiplies 255 by 127 (or 255 x -128), where ORT's u8 x s8 kernels saturate without VNNI.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from zonnx.hostcpu import host_int, probe_u8s8_exact
from zonnx.passes.common.exact_int_weights import ExactIntWeightsPass, has_integer_weight_ops
from zonnx.verify import exact_integer_form, run_ort

pytestmark = pytest.mark.exactness
_MS = "com.microsoft"


def _model(
    node: onnx.NodeProto, x: np.ndarray, out_type: int, inits: dict[str, np.ndarray]
) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape))],
        [helper.make_tensor_value_info("y", out_type, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(_MS, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


K = 64
A = np.full((4, K), 255, np.uint8)
B = np.full((K, 8), 127, np.int8)
B[:, 1] = -128
ACC = A.astype(np.int64) @ B.astype(np.int64)  # 2,072,640 and -2,088,960: pairs overflow int16
X4 = np.full((1, 16, 5, 5), 255, np.uint8)
W4 = np.full((4, 16, 3, 3), 127, np.int8)
ACC4 = 16 * 9 * 255 * 127  # an interior output of the 3x3 convolution


def _cases() -> dict[str, tuple[onnx.ModelProto, np.ndarray, object]]:
    one, u0, s0 = np.float32(1.0), np.uint8(0), np.int8(0)
    qs = np.float32(2.0**-13)
    return {
        "MatMulInteger": (
            _model(helper.make_node("MatMulInteger", ["x", "b", "az"], ["y"]), A, TensorProto.INT32,
                   {"b": B, "az": u0}),
            A, ACC,
        ),
        "QLinearMatMul": (
            _model(helper.make_node("QLinearMatMul", ["x", "s", "az", "b", "bs", "bz", "s", "az"], ["y"]),
                   A, TensorProto.UINT8, {"s": one, "az": u0, "b": np.abs(B), "bs": qs, "bz": s0}),
            A, np.clip(np.rint((A.astype(np.int64) @ np.abs(B).astype(np.int64)) * 2.0**-13), 0, 255),
        ),
        "QLinearConv": (
            _model(helper.make_node("QLinearConv", ["x", "s", "az", "w", "ws", "wz", "s", "az"], ["y"],
                                    pads=[1, 1, 1, 1]),
                   X4, TensorProto.UINT8, {"s": one, "az": u0, "w": W4, "ws": np.float32(2.0**-15), "wz": s0}),
            X4, np.rint(ACC4 * 2.0**-15),
        ),
        "MatMulIntegerToFloat": (
            _model(helper.make_node("MatMulIntegerToFloat", ["x", "b", "s", "s", "az", "bz"], ["y"], domain=_MS),
                   A, TensorProto.FLOAT, {"b": B, "s": one, "az": u0, "bz": s0}),
            A, ACC.astype(np.float32),
        ),
        "QGemm": (
            _model(helper.make_node("QGemm", ["x", "s", "az", "b", "s", "bz"], ["y"], domain=_MS),
                   A, TensorProto.FLOAT, {"s": one, "az": u0, "b": B, "bz": s0}),
            A, ACC.astype(np.float32),
        ),
    }  # fmt: skip


@pytest.mark.parametrize("case", list(_cases()))
def test_rewritten_ops_are_exact_on_this_host(case: str) -> None:
    model, x, want = _cases()[case]
    assert has_integer_weight_ops(model)
    ir_model = ir.serde.deserialize_model(model)
    changes = ExactIntWeightsPass().apply(ir_model)
    assert changes.total == 1, changes
    fixed = ir.serde.serialize_model(ir_model)
    assert not [i for i in fixed.graph.initializer if i.data_type == TensorProto.INT8]
    sess = ort.InferenceSession(fixed.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": x})[0]
    region = (slice(None), slice(None), slice(1, -1), slice(1, -1)) if got.ndim == 4 else ...
    np.testing.assert_array_equal(got[region].astype(np.float64), np.broadcast_to(want, got[region].shape))
    # zonnx's own ORT runs take the exact form wherever u8 x s8 is not exact here
    np.testing.assert_array_equal(run_ort(model, {"x": x})["y"], got)
    # and the plain model shows why: it is exact exactly where ORT's u8 x s8 probe is
    plain = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    same = np.array_equal(plain.run(None, {"x": x})[0], got)
    assert same or not probe_u8s8_exact()
    if host_int().isa in ("avx2", "avx512bw"):
        assert not same


def test_leaves_int8_activations_and_float_models_alone() -> None:
    x = np.full((4, K), 127, np.int8)
    node = helper.make_node("MatMulInteger", ["x", "b", "az"], ["y"])
    model = _model(node, x, TensorProto.INT32, {"b": B, "az": np.int8(0)})
    ir_model = ir.serde.deserialize_model(model)
    assert ExactIntWeightsPass().apply(ir_model).total == 0  # s8 x s8 is exact; ORT has no s8 x u8 kernel
    flt = _model(helper.make_node("Relu", ["x"], ["y"]), np.zeros((2,), np.float32), TensorProto.FLOAT, {})
    assert not has_integer_weight_ops(flt)
    assert exact_integer_form(flt) is flt


def test_shared_weights_get_one_copy() -> None:
    nodes = [
        helper.make_node("MatMulInteger", ["x", "b", "az"], ["m1"]),
        helper.make_node("MatMulInteger", ["x", "b", "az", "bz"], ["m2"]),
        helper.make_node("Add", ["m1", "m2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [4, K])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(B, "b"), numpy_helper.from_array(np.array(0, np.uint8), "az"),
         numpy_helper.from_array(np.array(3, np.int8), "bz")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    ir_model = ir.serde.deserialize_model(model)
    assert ExactIntWeightsPass().apply(ir_model).total == 2
    fixed = ir.serde.serialize_model(ir_model)
    names = [i.name for i in fixed.graph.initializer]
    assert names.count("b_u8") == 1 and "b" not in names
    y = ort.InferenceSession(fixed.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": A}
    )[0]
    np.testing.assert_array_equal(y, 2 * ACC - 255 * K * 3)


def _qdq_conv(w: np.ndarray) -> onnx.ModelProto:
    """x -> Q(u8) -> DQ -> Conv(., DQ(w int8)) -> Q(u8) -> DQ: ORT fuses it into one QLinearConv."""
    xs, ws, ys = np.float32(2.0**-8), np.float32(2.0**-6), np.float32(8.0)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
        helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "ys", "xz"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "ys", "xz"], ["y"]),
    ]
    inits = {"xs": xs, "xz": np.uint8(0), "w": w, "ws": ws, "wz": np.int8(0), "ys": ys}
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X4.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_qdq_groups_orts_optimizer_fuses_are_exact() -> None:
    """QDQ with uint8 activations and int8 weights (ORT fuses it into u8 x s8 QLinearConv when optimizing)."""
    model = _qdq_conv(W4)
    x = X4.astype(np.float32) * np.float32(2.0**-8)
    want = np.rint(ACC4 * 2.0**-14 / 8.0) * 8.0  # products 255 x 127 at scale 2^-14, output step 8
    ir_model = ir.serde.deserialize_model(model)
    assert ExactIntWeightsPass().apply(ir_model).total == 1
    fixed = ir.serde.serialize_model(ir_model)
    types = {i.name: i.data_type for i in fixed.graph.initializer}
    assert types["w_u8"] == TensorProto.UINT8 and "w" not in types and "wz" not in types
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        opts = ort.SessionOptions()
        opts.graph_optimization_level = level
        sess = ort.InferenceSession(fixed.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        got = sess.run(None, {"x": x})[0]
        np.testing.assert_array_equal(got[:, :, 1:-1, 1:-1], want, err_msg=str(level))
    plain = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    same = np.array_equal(plain.run(None, {"x": x})[0][:, :, 1:-1, 1:-1], np.broadcast_to(want, (1, 4, 3, 3)))
    assert same or not probe_u8s8_exact()  # ORT's fused u8 x s8 kernel: exact only where the probe is
    if host_int().isa in ("avx2", "avx512bw"):
        assert not same


def test_qdq_weights_with_int8_activations_too() -> None:
    """int8 activations in QDQ: ORT moves them to uint8 on x86 and fuses a u8 x s8 kernel, so the weights
    are re-encoded too; the result is the exact value."""
    model = _qdq_conv(W4)
    for init in model.graph.initializer:
        if init.name == "xz":
            init.CopyFrom(numpy_helper.from_array(np.array(0, np.int8), "xz"))
    x = np.full(X4.shape, 127 * 2.0**-8, np.float32)  # int8 codes 127
    ir_model = ir.serde.deserialize_model(model)
    assert ExactIntWeightsPass().apply(ir_model).total == 1
    fixed = ir.serde.serialize_model(ir_model)
    want = np.float32(np.rint(16 * 9 * 127 * 127 * 2.0**-14 / 8.0) * 8.0)
    sess = ort.InferenceSession(fixed.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": x})[0][:, :, 1:-1, 1:-1]
    np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape))
