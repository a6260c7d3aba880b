"""Fresh names never reuse a graph input, initializer, node output, subgraph value or node name."""

from __future__ import annotations

import onnx
import onnx_ir as ir

from zonnx.ir.names import NameSource, graph_names

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] w_float, bool c) => (float[2] y) {
    t = Relu (w_float)
    y = If (c) <
        then_branch = g1 () => (float[2] a) { a = Neg (t) },
        else_branch = g2 () => (float[2] b) { b = Abs (t) }
    >
}
"""


def _graph() -> ir.Graph:
    proto = onnx.parser.parse_model(MODEL.replace("", ""))
    proto.graph.node[0].name = "relu_node"
    return ir.serde.deserialize_model(proto).graph


def test_every_kind_of_name_is_taken() -> None:
    names = graph_names(_graph())
    assert {"w_float", "c", "t", "y", "a", "b", "relu_node"} <= names


def test_fresh_names_skip_taken_ones_and_are_remembered() -> None:
    source = NameSource.of(_graph())
    assert source.fresh("w_float") == "w_float_1"  # a graph input: a rewrite must not shadow it
    assert source.fresh("w_float") == "w_float_2"
    assert source.fresh("a") == "a_1"  # a value inside the If's branch
    assert source.fresh("relu_node") == "relu_node_1"
    assert source.fresh("new") == "new" and source.fresh("new") == "new_1"
