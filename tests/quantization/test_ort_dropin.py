"""Drop-in behaviour against ORT's quantize_static (issue 11, items 1-9): each test quantizes a small model
with zonnx, runs it in ONNX Runtime and checks the numbers or the graph ORT's call would give."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

import zonnx
from zonnx.errors import OptionError
from zonnx.quantization.calibration.readers import ListReader
from zonnx.verify import ort_session

RNG = np.random.default_rng(0)


def _conv_model(
    path: Path, relu: bool = False, bias: float | None = 0.1, dtype: int = TensorProto.FLOAT
) -> Path:
    """x[1,2,6,6] -> Conv(W[4,2,3,3], B) [-> Relu] -> y."""
    np_t = helper.tensor_dtype_to_np_dtype(dtype)
    w = RNG.uniform(-1, 1, (4, 2, 3, 3)).astype(np_t)
    inits = [numpy_helper.from_array(w, "W")]
    ins = ["x", "W"]
    if bias is not None:
        inits.append(numpy_helper.from_array(np.full(4, bias, np_t), "B"))
        ins.append("B")
    nodes = [helper.make_node("Conv", ins, ["c" if relu else "y"], name="conv")]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"], name="relu"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", dtype, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("y", dtype, None)],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21 if dtype != TensorProto.FLOAT else 13)]
    )
    model.ir_version = 10
    onnx.save(model, path)
    return path


def _save(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10  # the pinned onnx writes IR 14 by default, which ORT 1.31 does not load
    onnx.save(model, path)


def _reader(
    n: int = 4, dtype=np.float32, name: str = "x", shape=(1, 2, 6, 6), low: float = -1.0
) -> ListReader:
    return ListReader([{name: RNG.uniform(low, 1, shape).astype(dtype)} for _ in range(n)])


def _inits(path: Path) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}


def _run(path: Path, feed: dict[str, np.ndarray], optimize: bool = True) -> np.ndarray:
    """Run in ORT (its default optimizations unless ``optimize`` is False), in the model's exact integer form.

    ORT fuses the QDQ groups into u8 x s8 kernels, which saturate on x86 without VNNI (``zonnx.hostcpu``);
    ``ort_session`` re-encodes the int8 weights as uint8 + 128 there (the same numbers), and elsewhere runs
    the model as written.
    """
    return ort_session(path, optimize=optimize).run(None, feed)[0]


def test_tensor_quant_overrides_type_and_fixed_scale(tmp_path):
    """Item 1: the issue's example: int4 weights, x at scale 0.5 / zero point 3, both as given."""
    model = _conv_model(tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    zonnx.quantize_static(
        model, out, _reader(), activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
        extra_options={"TensorQuantOverrides": {
            "W": [{"quant_type": QuantType.QInt4}],
            "x": [{"scale": np.float32(0.5), "zero_point": np.uint8(3)}],
        }},
    )  # fmt: skip
    q = onnx.load(out)
    inits = {i.name: i for i in q.graph.initializer}
    assert inits["W_quantized"].data_type == TensorProto.INT4
    assert float(numpy_helper.to_array(inits["x_scale"])) == 0.5
    assert int(numpy_helper.to_array(inits["x_zero_point"])) == 3
    # int4 symmetric keeps ORT's full range [-8, 7]: scale = 2 * absmax / 15
    w = numpy_helper.to_array(onnx.load(model).graph.initializer[0])
    assert float(numpy_helper.to_array(inits["W_scale"])) == pytest.approx(2 * np.abs(w).max() / 15, rel=1e-6)


def test_tensor_quant_overrides_convert_and_errors(tmp_path):
    """Item 1: 'convert' re-quantizes for the named reader; bad overrides are ValueErrors naming the tensor."""
    model = _conv_model(tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    zonnx.quantize_static(
        model, out, _reader(), activation_type=QuantType.QUInt8,
        extra_options={"TensorQuantOverrides": {"x": [{"convert": {"quant_type": QuantType.QUInt16}}]}},
    )  # fmt: skip
    q = onnx.load(out)
    types = {i.name: i.data_type for i in q.graph.initializer}
    assert types["x_zero_point"] == TensorProto.UINT8 and types["x_zero_point_convert"] == TensorProto.UINT16
    assert [n.op_type for n in q.graph.node].count("QuantizeLinear") == 3  # x (u8), x (u16), y
    for bad, words in [
        ({"nope": [{"symmetric": True}]}, "is not present in the model"),
        ({"x": [{"scale": 0.1}]}, "Must provide both 'scale' and 'zero_point'"),
        ({"x": [{"scale": 0.1, "zero_point": 0, "rmax": 1.0}]}, "[rmax] are invalid with 'scale'"),
    ]:
        with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
            zonnx.quantize_static(
                model, tmp_path / "bad.onnx", _reader(), extra_options={"TensorQuantOverrides": bad}
            )


def test_restricted_asymmetric_contrib_ops_and_refusals(tmp_path):
    """Item 1: ActivationRestrictedAsymmetric snaps the uint8 zero point; UseQDQContribOps writes
    com.microsoft Q/DQ without raising the opset for 16 bits; DedicatedQDQPair/EnableSubgraph are refused."""
    model = _conv_model(tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    zonnx.quantize_static(model, out, _reader(low=0.1), activation_type=QuantType.QUInt8,
                          extra_options={"ActivationRestrictedAsymmetric": True})  # fmt: skip
    inits = _inits(out)
    assert int(inits["x_zero_point"]) == 0  # positive range: zero point at qmin
    assert int(inits["y_zero_point"]) in (0, 128)  # snapped: qmin or the middle code
    zonnx.quantize_static(model, out, _reader(), activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8,
                          extra_options={"UseQDQContribOps": True})  # fmt: skip
    q = onnx.load(out)
    assert {n.domain for n in q.graph.node if "Quantize" in n.op_type} == {"com.microsoft"}
    assert next(o.version for o in q.opset_import if o.domain == "") == 13
    assert _run(out, {"x": np.zeros((1, 2, 6, 6), np.float32)}).shape == (1, 4, 4, 4)
    for key in ("DedicatedQDQPair", "EnableSubgraph"):
        with pytest.raises(OptionError, match=key):
            zonnx.quantize_static(model, out, _reader(), extra_options={key: True})


def test_quantize_bias_block_size_and_type_ints(tmp_path):
    """Items 2-3: QuantizeBias=False keeps the bias float; BlockSize writes opset-21 blocks (rank 4
    refused); activation/weight types as onnx.TensorProto ints; WeightSymmetric=None is ORT's rule."""
    model = _conv_model(tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    zonnx.quantize_static(model, out, _reader(), activation_type=TensorProto.UINT8, weight_type=TensorProto.UINT8,
                          extra_options={"QuantizeBias": False, "WeightSymmetric": None})  # fmt: skip
    inits = _inits(out)
    assert "B" in inits and inits["B"].dtype == np.float32 and "B_quantized" not in inits
    assert inits["W_quantized"].dtype == np.uint8 and int(inits["W_zero_point"]) != 128  # asymmetric uint8
    with pytest.raises(NotImplementedError, match="BlockSize"):
        zonnx.quantize_static(model, out, _reader(), extra_options={"BlockSize": 4})
    k, n = 64, 8
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "B"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(RNG.uniform(-1, 1, (k, n)).astype(np.float32), "B")],
    )  # fmt: skip
    mm = tmp_path / "mm.onnx"
    _save(graph, mm)
    zonnx.quantize_static(mm, out, _reader(name="a", shape=(1, k)), extra_options={"BlockSize": 32})
    q = onnx.load(out)
    dq = next(n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "B_quantized")
    assert {a.name: a.i for a in dq.attribute}["block_size"] == 32
    assert _inits(out)["B_scale"].shape == (2, n)
    feed = {"a": RNG.uniform(-1, 1, (1, k)).astype(np.float32)}
    # ORT 1.31's optimizer turns a blocked DQ -> MatMul into a QLinearMatMul it cannot run (ORT's own
    # output too): run the graph as written
    assert np.abs(_run(out, feed, optimize=False) - _run(mm, feed)).max() < 0.1


def test_get_qdq_config_and_quantize_entry(tmp_path):
    """Item 3: zonnx.quantize(model, out, get_qdq_config(...)) works (get_qdq_config sets WeightSymmetric=None)."""
    model = _conv_model(tmp_path / "m.onnx")
    config = zonnx.get_qdq_config(onnx.load(model), _reader(), activation_type=QuantType.QUInt8)
    assert config.extra_options.get("WeightSymmetric", "absent") is None
    out = tmp_path / "q.onnx"
    zonnx.quantize(model, out, config)
    feed = {"x": RNG.uniform(-1, 1, (1, 2, 6, 6)).astype(np.float32)}
    assert np.abs(_run(out, feed) - _run(model, feed)).max() < 0.1


def test_reduce_range_grid(tmp_path):
    """Item 4: reduce_range uses ORT's grids: int8 symmetric weights reach +-64, uint8 weights code 128."""
    model = _conv_model(tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    zonnx.quantize_static(model, out, _reader(), reduce_range=True, weight_type=QuantType.QInt8)
    codes = _inits(out)["W_quantized"].astype(int)
    assert codes.max() == 64 or codes.min() == -64
    w = np.full((4, 2, 3, 3), 1.0, np.float32)
    w[0, 0, 0, 0] = -1.0
    graph = helper.make_graph([helper.make_node("Conv", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W")])  # fmt: skip
    _save(graph, tmp_path / "w.onnx")
    zonnx.quantize_static(tmp_path / "w.onnx", out, _reader(), reduce_range=True, activation_type=QuantType.QUInt8,
                          weight_type=QuantType.QUInt8, quant_format=QuantFormat.QOperator)  # fmt: skip
    # scale 2/127, zero point 64: 1.0 rounds to code 128, one past the 7-bit grid, as ORT keeps it
    assert _inits(out)["W_quantized"].max() == 128


def test_float16_model(tmp_path):
    """Item 5: a float16 model gets float16 scales and runs in ORT close to float."""
    model = _conv_model(tmp_path / "m.onnx", dtype=TensorProto.FLOAT16)
    out = tmp_path / "q.onnx"
    zonnx.quantize_static(model, out, _reader(dtype=np.float16), activation_type=QuantType.QUInt8)
    assert _inits(out)["x_scale"].dtype == np.float16
    feed = {"x": RNG.uniform(-1, 1, (1, 2, 6, 6)).astype(np.float16)}
    diff = np.abs(_run(out, feed).astype(np.float32) - _run(model, feed).astype(np.float32)).max()
    assert diff < 0.1


def test_nothing_to_quantize_writes_model(tmp_path, caplog):
    """Item 6: a TopK-only model (nothing selected) is written unchanged, with a warning saying why."""
    graph = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("i", TensorProto.INT64, None)],
        [numpy_helper.from_array(np.array([2], np.int64), "k")],
    )  # fmt: skip
    model = tmp_path / "m.onnx"
    _save(graph, model)
    out = tmp_path / "q.onnx"
    with caplog.at_level(logging.WARNING):
        zonnx.quantize_static(model, out, _reader(name="x", shape=(1, 8)))
    assert "nothing to quantize" in caplog.text
    assert [n.op_type for n in onnx.load(out).graph.node] == ["TopK"]


def test_calibration_cache_and_external_data(tmp_path):
    """Item 7: calibration_cache_path is written in ORT's JSON on the first call and read on the second
    (no reader); use_external_data_format on a small model writes a loadable model."""
    model = _conv_model(tmp_path / "m.onnx")
    cache = tmp_path / "cache.json"
    first, second = tmp_path / "a.onnx", tmp_path / "b.onnx"
    zonnx.quantize_static(model, first, _reader(), calibration_cache_path=cache)
    assert json.loads(cache.read_text())["smooth_quant"] is False
    zonnx.quantize_static(model, second, None, calibration_cache_path=cache)
    assert _inits(first)["x_scale"] == _inits(second)["x_scale"]
    with pytest.raises(ValueError, match="calibrate_method"):
        zonnx.quantize_static(
            model, second, None, calibration_cache_path=cache, calibrate_method=CalibrationMethod.Entropy
        )
    ext = tmp_path / "ext.onnx"
    zonnx.quantize_static(model, ext, _reader(), use_external_data_format=True)
    assert _run(ext, {"x": np.zeros((1, 2, 6, 6), np.float32)}).shape == (1, 4, 4, 4)


def test_qdq_loss_debug_reads_zonnx_output(tmp_path):
    """Item 8: ORT's qdq_loss_debug matches weights and graph-output activations of a zonnx model."""
    from onnxruntime.quantization.qdq_loss_debug import create_weight_matching

    model = _conv_model(tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    zonnx.quantize_static(model, out, _reader())
    matched = create_weight_matching(str(model), str(out))
    assert set(matched) >= {"W", "B"}
    assert np.abs(matched["W"]["float"] - matched["W"]["dequantized"]).max() < 0.01
    assert "y_QuantizeLinear_Input" in {n.input[0] for n in onnx.load(out).graph.node}


def test_removable_relu_and_prequantized_weight(tmp_path):
    """Item 9: with asymmetric activations Conv->Relu loses the Relu (its quantization clips, ORT then fuses
    QLinearConv); with symmetric ones the Relu stays between two quantized tensors (ORT's layout). A weight already behind a
    DequantizeLinear keeps its parameters."""
    model = _conv_model(tmp_path / "m.onnx", relu=True)
    out = tmp_path / "q.onnx"
    # a feed from the calibration set: the bound below is the grid's rounding, not clipping of an
    # out-of-range sample (the module's shared RNG would make that depend on test order)
    feeds = [
        {"x": np.random.default_rng(i).uniform(-1, 1, (1, 2, 6, 6)).astype(np.float32)} for i in range(4)
    ]
    feed = feeds[0]
    zonnx.quantize_static(model, out, ListReader(feeds), activation_type=QuantType.QUInt8)
    ops = [n.op_type for n in onnx.load(out).graph.node]
    assert "Relu" not in ops and ops.count("QuantizeLinear") == 2
    assert np.abs(_run(out, feed) - _run(model, feed)).max() < 0.1
    assert _run(out, feed).min() >= 0.0
    zonnx.quantize_static(model, out, _reader(), extra_options={"ActivationSymmetric": True})
    ops = [n.op_type for n in onnx.load(out).graph.node]
    # symmetric (ORT's layout): the Relu stays, its input and output each quantized
    assert "Relu" in ops and ops.count("QuantizeLinear") == 3
    # pre-quantized weight
    codes = RNG.integers(-127, 128, (4, 2, 3, 3)).astype(np.int8)
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["Wq", "Ws", "Wz"], ["W"], name="dq"),
         helper.make_node("Conv", ["x", "W", "B"], ["y"], name="conv")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(codes, "Wq"), numpy_helper.from_array(np.float32(0.01), "Ws"),
         numpy_helper.from_array(np.int8(0), "Wz"), numpy_helper.from_array(np.full(4, 0.5, np.float32), "B")],
    )  # fmt: skip
    pre = tmp_path / "pre.onnx"
    _save(graph, pre)
    zonnx.quantize_static(pre, out, _reader())
    inits = _inits(out)
    assert float(inits["Ws"]) == np.float32(0.01) and "B_quantized" in inits
    assert float(inits["B_scale"]) == pytest.approx(float(inits["x_scale"]) * 0.01, rel=1e-6)
