"""QOperator -> QDQ on models ORT's own quantizer writes: a small torch CNN and the digits zoo CNN, per-tensor
and per-channel, uint8 and int8 activations, plus dynamic quantization; codes must match within 1 LSB."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
import pytest
import torch
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quant_pre_process,
    quantize_dynamic,
    quantize_static,
)

from zonnx import zoo
from zonnx.converters.common import ConversionError
from zonnx.converters.qoperator_to_qdq import QOperatorToQDQPass, qoperator_to_qdq
from zonnx.inspection import inspect_model
from zonnx.ir.io import to_ir
from zonnx.verify import check_loadable, ort_session
from zonnx.zoo.digits import digits_data, digits_inputs, evaluate_top1

QOPERATOR_OPS = {"QLinearConv", "QLinearMatMul", "QGemm", "MatMulInteger", "ConvInteger"}
SAMPLES = 24


class SmallCNN(torch.nn.Module):
    """Every op ORT's QOperator format has a kernel for: Conv (+Relu, depthwise), Add, LeakyRelu,
    Sigmoid, Mul, MaxPool, AveragePool, Concat, Flatten, Gemm, MatMul, Softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.c3 = torch.nn.Conv2d(8, 8, 1)
        self.fc = torch.nn.Linear(16 * 2 * 2, 10)
        self.fc2 = torch.nn.Linear(10, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.c1(x))
        z = torch.nn.functional.leaky_relu(self.c2(y) + y, 0.1)
        w = torch.nn.functional.max_pool2d(torch.sigmoid(self.c3(z)) * z, 2)
        u = torch.cat([torch.nn.functional.avg_pool2d(w, 2), torch.nn.functional.max_pool2d(w, 2)], 1)
        v = self.fc(torch.flatten(u, 1))
        return torch.softmax(self.fc2(v), -1), v @ self.fc2.weight.T


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _images(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": (1.5 * rng.standard_normal((1, 3, 8, 8))).astype(np.float32)} for _ in range(n)]


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qop") / "cnn.onnx"
    with warnings.catch_warnings():  # the legacy exporter is the one the issue asks for
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(SmallCNN().eval(), (torch.randn(1, 3, 8, 8),), str(path), dynamo=False,
                          opset_version=13, input_names=["x"], output_names=["p", "q"])  # fmt: skip
    return path


def _quantize(
    src: Path, dst: Path, feeds: list[dict[str, np.ndarray]], per_channel: bool, act: QuantType
) -> onnx.ModelProto:
    quantize_static(str(src), str(dst), _Reader(feeds), quant_format=QuantFormat.QOperator,
                    per_channel=per_channel, activation_type=act, weight_type=QuantType.QInt8)  # fmt: skip
    return onnx.load(str(dst))


def _with_all_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every node output becomes a graph output, so tensors can be compared by name."""
    m = onnx.ModelProto.FromString(model.SerializeToString())
    names = {o.name for o in m.graph.output}
    for node in m.graph.node:
        for out in node.output:
            if out and out not in names:
                m.graph.output.append(onnx.helper.make_empty_tensor_value_info(out))
                names.add(out)
    return m


def _scale_of(model: onnx.ModelProto, output: str) -> float:
    inits = {t.name: t for t in model.graph.initializer}
    node = next(n for n in model.graph.node if n.output[0] == output and n.op_type == "DequantizeLinear")
    return float(onnx.numpy_helper.to_array(inits[node.input[1]]))


def _fed(qdq: onnx.ModelProto, codes: dict[str, np.ndarray]) -> onnx.ModelProto:
    """``qdq`` whose readers of each code tensor read a new graph input ``<name>__fed`` instead, so every
    rewritten op can be given exactly the codes the QOperator model computed (per-op comparison)."""
    m = _with_all_outputs(qdq)
    for node in m.graph.node:
        node.input[:] = [f"{i}__fed" if i in codes else i for i in node.input]
    for name, arr in codes.items():
        elem = onnx.helper.np_dtype_to_tensor_dtype(arr.dtype)
        m.graph.input.append(onnx.helper.make_tensor_value_info(f"{name}__fed", elem, arr.shape))
    return m


def _compare(
    qop: onnx.ModelProto, qdq: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]
) -> tuple[int, int, dict[str, float]]:
    """(max code difference of each rewritten op given the QOperator model's input codes, over every
    8-bit tensor both models name; how many such tensors; end-to-end error of each float graph output
    in units of its output scale, beyond float32's storage error). The QOperator reference runs exactly
    on every host (``ort_session``: ``exact_integer_form``, u8 x u8 weights where u8 x s8 saturates)."""
    a = ort_session(_with_all_outputs(qop), optimize=True)
    a_names = [o.name for o in a.get_outputs()]
    qdq_made = {o for n in qdq.graph.node for o in n.output}
    outputs = [o.name for o in qop.graph.output]
    end_to_end = ort_session(qdq)
    worst, compared, out_lsb, forced = 0, set(), dict.fromkeys(outputs, 0.0), None
    for feed in feeds:
        ra = dict(zip(a_names, a.run(None, feed), strict=True))
        codes = {
            n: v for n, v in ra.items() if n in qdq_made and v.dtype.kind in "iu" and v.dtype.itemsize == 1
        }
        forced = forced or ort_session(_fed(qdq, codes))
        names = [o.name for o in forced.get_outputs()]
        rb = dict(
            zip(names, forced.run(None, {**feed, **{f"{n}__fed": v for n, v in codes.items()}}), strict=True)
        )
        for name, ref in codes.items():
            compared.add(name)
            worst = max(worst, int(np.abs(ref.astype(np.int64) - rb[name].astype(np.int64)).max()))
        for name, got in zip(outputs, end_to_end.run(outputs, feed), strict=True):
            want = ra[name]
            # Both are float32 ((q - zp) * scale rounded once): each is off its exact value by up to half
            # an ulp, so outputs exactly one code apart can differ by a little more than one scale
            # (measured on the digits CNN: 1.0000015 codes for codes -56 vs -55). Only the excess over
            # that storage error counts.
            storage = (np.spacing(np.abs(want)).astype(np.float64) + np.spacing(np.abs(got))) / 2
            err = float(np.maximum(np.abs(want.astype(np.float64) - got) - storage, 0.0).max())
            out_lsb[name] = max(out_lsb[name], err / _scale_of(qop, name))
    return worst, len(compared), out_lsb


def _assert_clean_qdq(qdq: onnx.ModelProto, per_channel: bool, tmp_path: Path) -> None:
    assert not {n.op_type for n in qdq.graph.node} & QOPERATOR_OPS
    assert not any(n.op_type.startswith("QLinear") for n in qdq.graph.node)
    check_loadable(qdq)  # onnx.checker full check + ORT 1.31 session
    path = tmp_path / "qdq.onnx"
    onnx.save(qdq, str(path))
    q = inspect_model(path).quantization
    assert q.format == "QDQ", q.formats
    assert (q.per_channel > 0) == per_channel


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("act", [QuantType.QUInt8, QuantType.QInt8], ids=["uint8", "int8"])
def test_torch_cnn_qoperator_becomes_qdq_within_one_lsb(
    cnn_path: Path, tmp_path: Path, per_channel: bool, act: QuantType
) -> None:
    qop = _quantize(cnn_path, tmp_path / "qop.onnx", _images(16, 1), per_channel, act)
    before = {n.op_type for n in qop.graph.node}
    assert {"QLinearConv", "QGemm", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearConcat",
            "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax", "QLinearAveragePool"} <= before  # fmt: skip
    qdq = qoperator_to_qdq(qop)
    _assert_clean_qdq(qdq, per_channel, tmp_path)
    assert {"Conv", "Gemm", "MatMul", "Add", "Mul", "Concat", "Sigmoid", "LeakyRelu", "Softmax",
            "AveragePool", "MaxPool"} <= {n.op_type for n in qdq.graph.node}  # fmt: skip
    assert [i.name for i in qdq.graph.input] == ["x"] and [o.name for o in qdq.graph.output] == ["p", "q"]
    worst, compared, out_lsb = _compare(qop, qdq, _images(SAMPLES, 7))
    assert compared >= 15  # every QLinear output keeps its name, so the codes are compared tensor by tensor
    assert worst <= 1, worst
    assert max(out_lsb.values()) <= 1.0 + 1e-6, out_lsb


def test_pass_counts_each_rewrite(cnn_path: Path, tmp_path: Path) -> None:
    qop = _quantize(cnn_path, tmp_path / "qop.onnx", _images(8, 1), False, QuantType.QUInt8)
    integer_ops = sum(1 for n in qop.graph.node if n.op_type.startswith("QLinear") or n.op_type == "QGemm")
    latent = sum(1 for n in qop.graph.node if n.op_type in ("MaxPool", "Flatten"))
    result = QOperatorToQDQPass()(to_ir(qop))
    assert result.modified and not result.changes.misses
    assert result.changes.total == integer_ops + latent
    assert "com.microsoft" not in result.model.opset_imports


@pytest.fixture(scope="module")
def digits_prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits zoo CNN with BatchNormalization folded by ORT's quantization pre-processing."""
    path = tmp_path_factory.mktemp("digits") / "digits_pre.onnx"
    quant_pre_process(str(zoo.get("digits_cnn")), str(path), skip_symbolic_shape=True)
    return path


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_digits_cnn_qoperator_becomes_qdq(digits_prepared: Path, tmp_path: Path, per_channel: bool) -> None:
    qop = _quantize(digits_prepared, tmp_path / "qop.onnx", digits_inputs(32), per_channel, QuantType.QUInt8)
    qdq = qoperator_to_qdq(qop)
    _assert_clean_qdq(qdq, per_channel, tmp_path)
    worst, compared, out_lsb = _compare(qop, qdq, digits_inputs(SAMPLES, seed=3))
    assert compared >= 6 and worst <= 1 and max(out_lsb.values()) <= 1.0 + 1e-6, (worst, out_lsb)
    x, y = digits_data("test")
    assert abs(evaluate_top1(qdq, x, y) - evaluate_top1(qop, x, y)) <= 0.005


def test_digits_cnn_with_float_batchnorm_between_quantized_ops(tmp_path: Path) -> None:
    """Without pre-processing BatchNormalization stays float between DQ and Q: only the integer ops change."""
    qop = _quantize(
        Path(zoo.get("digits_cnn")), tmp_path / "qop.onnx", digits_inputs(16), True, QuantType.QUInt8
    )
    qdq = qoperator_to_qdq(qop)
    _assert_clean_qdq(qdq, True, tmp_path)
    assert sum(n.op_type == "BatchNormalization" for n in qdq.graph.node) == sum(
        n.op_type == "BatchNormalization" for n in qop.graph.node
    )
    worst, _, out_lsb = _compare(qop, qdq, digits_inputs(8, seed=5))
    assert worst <= 1 and max(out_lsb.values()) <= 1.0 + 1e-6


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_dynamic_quantization_becomes_dq_float_ops(cnn_path: Path, tmp_path: Path, per_channel: bool) -> None:
    dst = tmp_path / "dyn.onnx"
    quantize_dynamic(str(cnn_path), str(dst), per_channel=per_channel, weight_type=QuantType.QInt8)
    dyn = onnx.load(str(dst))
    assert {"MatMulInteger", "ConvInteger"} <= {n.op_type for n in dyn.graph.node}
    qdq = qoperator_to_qdq(dyn)
    ops = {n.op_type for n in qdq.graph.node}
    assert not ops & QOPERATOR_OPS and "Cast" not in ops and "DynamicQuantizeLinear" in ops
    check_loadable(qdq)
    a, b = ort_session(dyn), ort_session(qdq)
    for feed in _images(8, 2):
        for ref, got in zip(a.run(None, feed), b.run(None, feed), strict=True):
            assert np.abs(ref - got).max() <= 1e-5 * max(1.0, float(np.abs(ref).max()))


def test_old_opset_per_channel_model_is_upgraded_to_13(cnn_path: Path, tmp_path: Path) -> None:
    qop = _quantize(cnn_path, tmp_path / "qop.onnx", _images(8, 1), True, QuantType.QUInt8)
    for imp in qop.opset_import:
        if imp.domain in ("", "ai.onnx"):
            imp.version = 12  # QLinearConv per-channel and uint8 MaxPool are valid at 12; DQ axis is not
    qdq = qoperator_to_qdq(qop)
    assert {i.version for i in qdq.opset_import if i.domain in ("", "ai.onnx")} == {13}
    worst, _, out_lsb = _compare(qop, qdq, _images(8, 4))
    assert worst <= 1 and max(out_lsb.values()) <= 1.0 + 1e-6


def test_unrewritable_op_is_named(tmp_path: Path) -> None:
    """QLinearGlobalAveragePool with channels_last=1 is refused: the error names the node and the reason."""
    init = [onnx.numpy_helper.from_array(np.array(0.1, np.float32), "s"),
            onnx.numpy_helper.from_array(np.array(128, np.uint8), "z")]  # fmt: skip
    nodes = [
        onnx.helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        onnx.helper.make_node(
            "QLinearGlobalAveragePool",
            ["xq", "s", "z", "s", "z"],
            ["yq"],
            name="gap_nhwc",
            domain="com.microsoft",
            channels_last=1,
        ),  # fmt: skip
        onnx.helper.make_node("DequantizeLinear", ["yq", "s", "z"], ["y"]),
    ]
    graph = onnx.helper.make_graph(nodes, "g", [onnx.helper.make_tensor_value_info("x", 1, [1, 4, 4, 3])],
                                   [onnx.helper.make_tensor_value_info("y", 1, [1, 4, 1, 1])], init)  # fmt: skip
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13),
                                                          onnx.helper.make_opsetid("com.microsoft", 1)])  # fmt: skip
    result = QOperatorToQDQPass()(to_ir(model))
    assert result.changes.misses == ["gap_nhwc (QLinearGlobalAveragePool): channels_last=1 is not rewritten"]
    with pytest.raises(ConversionError, match="gap_nhwc .*channels_last=1"):
        qoperator_to_qdq(model)


def test_latent_ops_and_2d_softmax_hand_built() -> None:
    """Pad (its constant is a code), Split and Transpose on codes, and QLinearSoftmax with opset-11
    semantics on a non-last axis: the rewrite matches ORT's integer kernels within 1 LSB."""
    init = [
        onnx.numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        onnx.numpy_helper.from_array(np.array(100, np.uint8), "z"),
        onnx.numpy_helper.from_array(np.array(1 / 256, np.float32), "so"),
        onnx.numpy_helper.from_array(np.array(0, np.uint8), "zo"),
        onnx.numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
        onnx.numpy_helper.from_array(np.array(130, np.uint8), "pad_code"),
    ]
    nodes = [
        onnx.helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        onnx.helper.make_node("Pad", ["xq", "pads", "pad_code"], ["padded"], name="pad"),
        onnx.helper.make_node("Split", ["padded"], ["a", "b"], name="split", axis=1, num_outputs=2),
        onnx.helper.make_node("Transpose", ["b"], ["bt"], name="transpose", perm=[0, 1, 3, 2]),
        onnx.helper.make_node(
            "QLinearSoftmax",
            ["a", "s", "z", "so", "zo"],
            ["sq"],
            name="softmax2d",
            domain="com.microsoft",
            axis=1,
            opset=11,
        ),  # fmt: skip
        onnx.helper.make_node("DequantizeLinear", ["sq", "so", "zo"], ["y"]),
        onnx.helper.make_node("DequantizeLinear", ["bt", "s", "z"], ["t"]),
    ]
    graph = onnx.helper.make_graph(
        nodes, "latent", [onnx.helper.make_tensor_value_info("x", 1, [1, 4, 3, 3])],
        [onnx.helper.make_tensor_value_info("y", 1, [1, 2, 5, 5]), onnx.helper.make_tensor_value_info("t", 1, [1, 2, 5, 5])], init,
    )  # fmt: skip
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18),
                                                          onnx.helper.make_opsetid("com.microsoft", 1)])  # fmt: skip
    onnx.checker.check_model(model)
    qdq = qoperator_to_qdq(model)
    check_loadable(qdq)
    assert {n.op_type for n in qdq.graph.node} == {
        "QuantizeLinear", "DequantizeLinear", "Pad", "Split", "Transpose", "Flatten", "Softmax", "Shape", "Reshape",
    }  # fmt: skip
    a, b = ort_session(model, optimize=True), ort_session(qdq)
    rng = np.random.default_rng(0)
    for _ in range(8):
        feed = {"x": (2 * rng.standard_normal((1, 4, 3, 3))).astype(np.float32)}
        (ya, ta), (yb, tb) = a.run(None, feed), b.run(None, feed)
        assert np.array_equal(ta, tb)  # moving codes is exact
        assert np.abs(ya - yb).max() <= 1 / 256 + 1e-7
