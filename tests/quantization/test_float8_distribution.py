"""float8 (E4M3FN), CalibrationMethod.Distribution, ORT's Entropy default and ORT's symmetric layout
(issue 11, items 4, 5 and 9): zonnx against ONNX Runtime's own quantize_static on the same small models."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime.quantization as ortq
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

import zonnx
from zonnx.errors import OptionError
from zonnx.quantization.calibration.readers import ListReader

RNG = np.random.default_rng(7)
FEEDS = [{"x": RNG.normal(0, 1, (5, 10)).astype(np.float32)} for _ in range(3)]


def _mlp(path: Path, act: str = "Relu", pool: bool = False) -> Path:
    """x[5,10] -> MatMul(W1[10,16]) -> act -> Gemm(W2[16,4], B2) -> y, optionally -> MaxPool over y."""
    w1 = RNG.normal(0, 0.3, (10, 16)).astype(np.float32)
    w2 = RNG.normal(0, 0.3, (4, 16)).astype(np.float32)
    b2 = RNG.normal(0, 0.1, 4).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm"),
        helper.make_node(act, ["h"], ["a"], name="act"),
        helper.make_node("Gemm", ["a", "W2", "B2"], ["g"], name="gemm", transB=1),
    ]
    out = "g"
    if pool:
        nodes += [
            helper.make_node("Unsqueeze", ["g", "axes"], ["g3"], name="unsq"),
            helper.make_node("MaxPool", ["g3"], ["y"], name="pool", kernel_shape=[2]),
        ]
        out = "y"
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "W1"), (w2, "W2"), (b2, "B2"))]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "axes"))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 10])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10  # the pinned onnx writes IR 14 by default, which ORT 1.31 does not load
    onnx.save(model, path)
    return path


def _inits(path: Path) -> dict[str, onnx.TensorProto]:
    return {i.name: i for i in onnx.load(path).graph.initializer}


def _run(path: Path, feed: dict[str, np.ndarray], optimize: bool = True) -> np.ndarray:
    opts = ort.SessionOptions()
    if not optimize:  # ORT's CPU fusion makes float8 QLinearMatMul, which it cannot run (ORT's models too)
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, feed)[0]


def _ops(path: Path) -> Counter[str]:
    return Counter(n.op_type for n in onnx.load(path).graph.node)


def _f8_spread() -> float:
    v = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return float(np.std(v[np.isfinite(v)]))


def test_float8_qdq_runs_in_ort_with_orts_scales(tmp_path):
    """float8 weights and activations: E4M3FN initializers, scale = std / std_f8 (input: the calibration
    data's std; weight: its own), outputs within float8's precision; MaxPool stays float (ORT's rule)."""
    model = _mlp(tmp_path / "m.onnx", act="Sigmoid", pool=True)
    out = tmp_path / "q.onnx"
    kw = dict(activation_type=QuantType.QFLOAT8E4M3FN, weight_type=QuantType.QFLOAT8E4M3FN)
    zonnx.quantize_static(
        model, out, ListReader(FEEDS), calibrate_method=CalibrationMethod.Distribution, **kw
    )
    inits = _inits(out)
    assert inits["W1_quantized"].data_type == TensorProto.FLOAT8E4M3FN
    assert inits["x_zero_point"].data_type == TensorProto.FLOAT8E4M3FN
    x_all = np.concatenate([f["x"].ravel() for f in FEEDS])
    assert float(numpy_helper.to_array(inits["x_scale"])) == pytest.approx(
        np.std(x_all) / _f8_spread(), rel=1e-4
    )
    w1 = numpy_helper.to_array(onnx.load(model).graph.initializer[0])
    assert float(numpy_helper.to_array(inits["W1_scale"])) == pytest.approx(
        np.std(w1) / _f8_spread(), rel=1e-5
    )
    assert "B2" in inits and inits["B2"].data_type == TensorProto.FLOAT  # float8 kernels take a float bias
    q = onnx.load(out)
    pool = next(n for n in q.graph.node if n.op_type == "MaxPool")
    producers = {o: n.op_type for n in q.graph.node for o in n.output}
    assert producers[pool.input[0]] != "QuantizeLinear"
    theirs = tmp_path / "o.onnx"  # ORT's own float8 model of the same data: the same numbers
    ortq.quantize_static(
        str(model), str(theirs), ListReader(FEEDS), calibrate_method=CalibrationMethod.Distribution, **kw
    )
    for feed in FEEDS:
        got, ref, want = _run(out, feed, False), _run(theirs, feed, False), _run(model, feed)
        assert np.abs(got - ref).max() < 1e-3  # measured 2.5e-5 (ORT's std comes from bin centers)
        assert 0 < np.abs(got - want).max() <= np.abs(ref - want).max() + 1e-3


def test_float8_p3_scenario_and_orts_rules(tmp_path, caplog):
    """scenario "p3": ORT's quantize_static never passes it to its calibrator, so the scales are the
    "same" ones in both (said in a warning); ORT's float8 rules are refused loudly."""
    model = _mlp(tmp_path / "m.onnx", act="Sigmoid")
    out, theirs = tmp_path / "q.onnx", tmp_path / "o.onnx"
    kw = dict(activation_type=QuantType.QFLOAT8E4M3FN, weight_type=QuantType.QFLOAT8E4M3FN)
    method = CalibrationMethod.Distribution
    p3 = {"scenario": "p3"}
    zonnx.quantize_static(model, out, ListReader(FEEDS), calibrate_method=method, extra_options=p3, **kw)
    assert "does not pass this key" in caplog.text
    ortq.quantize_static(
        str(model), str(theirs), ListReader(FEEDS), calibrate_method=method, extra_options=p3, **kw
    )
    want = _inits(theirs)
    for name, t in _inits(out).items():
        if name.endswith("_scale"):
            got = float(numpy_helper.to_array(t))
            assert got == pytest.approx(float(numpy_helper.to_array(want[name])), rel=0.02), name
    with pytest.raises(OptionError, match="Distribution only") as err:
        zonnx.quantize_static(model, out, ListReader(FEEDS), **kw)
    assert isinstance(err.value, ValueError)
    with pytest.raises(OptionError, match="needs both"):
        zonnx.quantize_static(
            model, out, ListReader(FEEDS), calibrate_method=method, activation_type=QuantType.QFLOAT8E4M3FN
        )
    with pytest.raises(OptionError, match="per_channel"):
        zonnx.quantize_static(model, out, ListReader(FEEDS), calibrate_method=method, per_channel=True, **kw)
    with pytest.raises(OptionError, match="scenario"):
        zonnx.quantize_static(
            model, out, ListReader(FEEDS), calibrate_method=method, extra_options={"scenario": "p2"}, **kw
        )


def _scales(path: Path) -> dict[str, float]:
    return {
        n: float(numpy_helper.to_array(t).ravel()[0])
        for n, t in _inits(path).items()
        if n.endswith("_scale") and not n.startswith(("W", "B"))
    }


@pytest.mark.parametrize(
    "method, extra",
    [
        (CalibrationMethod.Distribution, {}),
        (CalibrationMethod.Entropy, {}),
        (CalibrationMethod.Entropy, {"ActivationSymmetric": True}),
    ],
)
def test_int8_ranges_equal_orts(tmp_path, method, extra):
    """Distribution (int8: the histogram's span +-max|x|) and Entropy with ORT's defaults (128 bins: the
    full [min, max]) give ORT's activation scales on the same data (one calibration batch)."""
    model = _mlp(tmp_path / "m.onnx", act="Sigmoid")
    feeds = FEEDS[:1]
    ours, theirs = tmp_path / "z.onnx", tmp_path / "o.onnx"
    kw = dict(calibrate_method=method, extra_options=extra)
    zonnx.quantize_static(model, ours, ListReader(feeds), **kw)
    ortq.quantize_static(str(model), str(theirs), ListReader(feeds), **kw)
    want = _scales(theirs)
    got = _scales(ours)
    assert want.keys() <= got.keys() and len(want) >= 3
    for name, scale in want.items():
        assert got[name] == pytest.approx(scale, rel=1e-5), name


@pytest.mark.parametrize("fmt", [QuantFormat.QDQ, QuantFormat.QOperator])
def test_symmetric_relu_layout_is_orts(tmp_path, fmt):
    """ActivationSymmetric: a Relu after MatMul stays, with its input and output each quantized, as ORT
    writes it (same op counts as ORT's call, QDQ and QOperator), and the outputs agree with ORT's model."""
    model = _mlp(tmp_path / "m.onnx", act="Relu")
    ours, theirs = tmp_path / "z.onnx", tmp_path / "o.onnx"
    kw = dict(quant_format=fmt, extra_options={"ActivationSymmetric": True})
    zonnx.quantize_static(model, ours, ListReader(FEEDS), **kw)
    ortq.quantize_static(str(model), str(theirs), ListReader(FEEDS), **kw)
    assert _ops(ours) == _ops(theirs)
    assert _ops(ours)["Relu"] == 1
    for feed in FEEDS:
        np.testing.assert_allclose(_run(ours, feed), _run(theirs, feed), atol=2e-2)
