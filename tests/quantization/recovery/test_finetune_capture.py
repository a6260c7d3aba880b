"""SegmentRunner: tensors of a quantized model computed in stretches equal a full ORT run, weights edited between."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import zonnx
from zonnx import zoo
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.enums import PowerOfTwoMethod, VitisQuantFormat
from zonnx.quantization.recovery.finetune_capture import SegmentRunner


@pytest.fixture(scope="module")
def quantized() -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]:
    feeds = zoo.sample_inputs("digits_cnn", 6, seed=4)
    result = zonnx.quantize_static(
        zoo.get("digits_cnn"),
        None,
        ListReader(feeds),
        quant_format=VitisQuantFormat.FixNeuron,
        calibrate_method=PowerOfTwoMethod.MinMSE,
    )
    return result.model, feeds


def _full_run(model: onnx.ModelProto, names: list[str], feeds: list[dict]) -> dict[str, list[np.ndarray]]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    runs = [sess.run(names, f) for f in feeds]
    return {n: [r[i] for r in runs] for i, n in enumerate(names)}


def test_stretches_equal_one_full_run_and_see_new_weights(quantized) -> None:
    model, feeds = quantized
    layers = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm")]
    assert len(layers) == 6
    names = [n.input[0] for n in layers] + [n.output[0] for n in layers]
    runner = SegmentRunner(model, feeds, [n.input[0] for n in layers] + [layers[-1].output[0]])
    got = {}
    for node in layers:
        got |= runner.fetch([node.input[0]])
        assert len(runner.held) <= 3  # the graph's frontier only, never every activation
    assert runner.segments == 5  # two convolutions read the same tensor
    want = _full_run(model, names, feeds)
    for node in layers:
        for a, b in zip(got[node.input[0]], want[node.input[0]], strict=True):
            np.testing.assert_array_equal(a, b)

    # a weight changed after the stretches before its layer ran is seen by its layer
    runner = SegmentRunner(model, feeds, [layers[2].input[0], layers[-1].output[0]])
    runner.fetch([layers[2].input[0]])
    fix = next(n for n in model.graph.node if n.op_type == "FixNeuron" and n.output[0] == layers[2].input[1])
    edited = onnx.ModelProto()
    edited.CopyFrom(model)
    init = next(t for t in edited.graph.initializer if t.name == fix.input[0])
    init.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(init), init.name))
    runner.set_initializer(init)
    out = runner.fetch([layers[-1].output[0]])[layers[-1].output[0]]
    ref = _full_run(edited, [layers[-1].output[0]], feeds)[layers[-1].output[0]]
    orig = _full_run(model, [layers[-1].output[0]], feeds)[layers[-1].output[0]]
    for a, b, c in zip(out, ref, orig, strict=True):
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)


def test_a_tensor_requested_twice_is_kept_for_the_second_request(quantized) -> None:
    model, feeds = quantized
    layers = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm")]
    first, last = layers[0].input[0], layers[-1].output[0]
    runner = SegmentRunner(model, feeds, [first, last, first])
    runner.fetch([first])
    runner.fetch([last])
    assert len(runner.fetch([first])[first]) == len(feeds)
    with pytest.raises(KeyError, match="dropped"):
        runner.fetch([layers[1].output[0]])
