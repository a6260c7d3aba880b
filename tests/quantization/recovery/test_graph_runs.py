"""``graph_runs.GraphRuns``: channel means level by level (bias correction) and layer inputs in order (fast
finetune) equal a full run of the model as changed so far, while only what a change reaches runs again;
outer-scope reads of subgraphs count."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import zonnx
from zonnx import zoo
from zonnx.backend.graph_reads import node_reads
from zonnx.build_npu import target_quantize_kwargs
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.enums import PowerOfTwoMethod, VitisQuantFormat
from zonnx.quantization.recovery.channel_means import ChannelProbe, probe_session
from zonnx.quantization.recovery.finetune_capture import segment_session
from zonnx.quantization.recovery.graph_runs import GraphRuns, initializer_override

PROBE = functools.partial(probe_session, providers=["CPUExecutionProvider"], what="quantized model")


def _digits_dpu() -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]:
    src = zoo.get("digits_cnn")
    name = onnx.load(src).graph.input[0].name
    rng = np.random.default_rng(0)
    feeds = [{name: rng.random((1, 1, 8, 8), dtype=np.float32)} for _ in range(6)]
    kwargs = target_quantize_kwargs("dpu-b4096")
    kwargs["extra_options"] = {**kwargs["extra_options"], "BiasCorrection": False}
    model = zonnx.quantize_static(src, None, ListReader(feeds), **kwargs).model
    return model, feeds


def test_means_equal_a_full_run_after_each_change() -> None:
    model, feeds = _digits_dpu()
    convs = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm") and len(n.input) > 2]
    assert len(convs) >= 3
    layers = {n.output[0]: 2 if n.op_type == "Gemm" else 4 for n in convs}
    runs = GraphRuns(model, feeds, PROBE, layers=list(layers))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    total = len(model.graph.node)
    ran = []
    for node in convs:
        tensor = node.output[0]
        before = runs.runs
        got = runs.means({tensor: layers[tensor]})
        assert runs.runs == before + 1
        want, _ = ChannelProbe(runs.model, {tensor: layers[tensor]}).run(feeds, with_outputs=False)
        np.testing.assert_array_equal(got[tensor], want[tensor])
        ran.append(runs.last_nodes)
        # change the layer's bias (the initializer its quantizer reads), as bias correction does
        bias = next(n for n in model.graph.node if node.input[2] in n.output).input[0]
        new = inits[bias] + np.float32(0.25)
        initializer_override(runs.model, {bias: new})
        runs.corrected([bias], [tensor], [tensor])
    # every node runs once, and each layer once more after its correction (not the whole upstream graph
    # per request: a full run to each layer would run about half the graph per layer)
    assert sum(ran) <= total - len(runs.constant) + len(convs)
    assert not runs.kept or all(k in runs.readers for k in runs.kept)


def test_subgraph_reads_of_the_enclosing_graph_are_found() -> None:
    then = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", 1, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["v"], ["u"]), helper.make_node("Neg", ["u"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", 1, None)],
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    assert set(node_reads(node)) - {"c"} == {"x", "w", "v"}  # what GraphRuns counts as read


def test_a_kept_value_a_subgraph_reads_is_fed_to_the_next_run() -> None:
    """An If branch reads a kept tensor from the enclosing graph: the next request feeds it as an input."""
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "w0"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b0"),
        numpy_helper.from_array(rng.standard_normal((2, 4, 1, 1)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(2).astype(np.float32), "b1"),
    ]
    out = helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, None)
    then = helper.make_graph([helper.make_node("Relu", ["a0"], ["t"])], "then", [], [out])
    other = helper.make_graph([helper.make_node("Neg", ["a0"], ["t"])], "else", [], [out])
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w0", "b0"], ["a0"]),
            helper.make_node("If", ["c"], ["r"], then_branch=then, else_branch=other),
            helper.make_node("Conv", ["r", "w1", "b1"], ["y"]),
        ],
        "g",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 4, 4]),
            helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    feeds = [
        {"x": rng.standard_normal((1, 3, 4, 4)).astype(np.float32), "c": np.array(flag)}
        for flag in (True, False)
    ]
    runs = GraphRuns(model, feeds, PROBE, layers=["a0", "y"])
    runs.means({"a0": 4})
    runs.corrected([], [], ["a0"])  # nothing changed: a0 stays valid and kept for the If
    got = runs.means({"y": 4})
    assert runs.last_nodes == 2  # the If and the second Conv, fed the kept a0
    want, _ = ChannelProbe(model, {"y": 4}).run(feeds, with_outputs=False)
    np.testing.assert_array_equal(got["y"], want["y"])


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
    sess = segment_session(m)
    runs = [sess.run(names, f) for f in feeds]
    return {n: [r[i] for r in runs] for i, n in enumerate(names)}


def test_layer_inputs_in_order_equal_one_full_run_and_see_new_weights(quantized) -> None:
    """Fast finetune's use: each layer's input in turn, the graph's frontier held, a weight edited between."""
    model, feeds = quantized
    layers = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm")]
    assert len(layers) == 6
    names = [n.input[0] for n in layers] + [n.output[0] for n in layers]
    runs = GraphRuns(
        model, feeds, segment_session, wanted=[n.input[0] for n in layers] + [layers[-1].output[0]]
    )
    got = {}
    for node in layers:
        got |= runs.tensors([node.input[0]])
        assert len(runs.kept) <= 3  # the graph's frontier only, never every activation
    assert runs.runs == 5  # two convolutions read the same tensor
    assert runs.last_nodes < len(model.graph.node) // 3  # a stretch, not the whole upstream graph
    want = _full_run(model, names, feeds)
    for node in layers:
        for a, b in zip(got[node.input[0]], want[node.input[0]], strict=True):
            np.testing.assert_array_equal(a, b)

    # a weight changed before its layer ran is seen by its layer
    runs = GraphRuns(model, feeds, segment_session, wanted=[layers[2].input[0], layers[-1].output[0]])
    runs.tensors([layers[2].input[0]])
    fix = next(n for n in model.graph.node if n.op_type == "FixNeuron" and n.output[0] == layers[2].input[1])
    edited = onnx.ModelProto()
    edited.CopyFrom(model)
    init = next(t for t in edited.graph.initializer if t.name == fix.input[0])
    init.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(init), init.name))
    runs.set_initializer(init)
    out = runs.tensors([layers[-1].output[0]])[layers[-1].output[0]]
    ref = _full_run(edited, [layers[-1].output[0]], feeds)[layers[-1].output[0]]
    orig = _full_run(model, [layers[-1].output[0]], feeds)[layers[-1].output[0]]
    for a, b, c in zip(out, ref, orig, strict=True):
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)


def test_a_value_requested_twice_is_kept_and_a_dropped_one_is_computed_again(quantized) -> None:
    model, feeds = quantized
    layers = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm")]
    first, last, middle = layers[0].input[0], layers[-1].output[0], layers[1].output[0]
    runs = GraphRuns(model, feeds, segment_session, wanted=[first, last, first])
    runs.tensors([first])
    runs.tensors([last])
    assert middle not in runs.kept
    before = runs.runs
    assert len(runs.tensors([first])[first]) == len(feeds) and runs.runs == before  # kept: nothing runs
    again = runs.tensors([middle])[middle]  # not kept: computed again from the kept and the inputs
    assert runs.runs == before + 1
    for a, b in zip(again, _full_run(model, [middle], feeds)[middle], strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(KeyError, match="constant"):
        runs.tensors([layers[0].input[1]])  # a weight's quantizer output: ORT folds it


def test_a_feed_without_a_model_input_is_named(quantized) -> None:
    model, feeds = quantized
    with pytest.raises(zonnx.errors.VerificationError, match="feed 0 has no input"):
        GraphRuns(model, [{}], segment_session)
