"""Level-by-level channel means (``level_runs.LevelRuns``): the same means as a full run of the changed
model, while only the nodes downstream of a change run again; outer-scope reads of subgraphs count."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

import zonnx
from zonnx import zoo
from zonnx.backend.graph_reads import node_reads
from zonnx.build_npu import target_quantize_kwargs
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.recovery.channel_means import ChannelProbe
from zonnx.quantization.recovery.level_runs import LevelRuns, initializer_override


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
    runs = LevelRuns(model, feeds, layers=list(layers))
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
    assert set(node_reads(node)) - {"c"} == {"x", "w", "v"}  # what LevelRuns counts as read


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
    runs = LevelRuns(model, feeds, layers=["a0", "y"])
    runs.means({"a0": 4})
    runs.corrected([], [], ["a0"])  # nothing changed: a0 stays valid and kept for the If
    got = runs.means({"y": 4})
    assert runs.last_nodes == 2  # the If and the second Conv, fed the kept a0
    want, _ = ChannelProbe(model, {"y": 4}).run(feeds, with_outputs=False)
    np.testing.assert_array_equal(got["y"], want["y"])
