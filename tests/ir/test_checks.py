"""Corrupt tensors and attributes are refused where a model enters zonnx, naming the tensor or node
(issue 17: the fuzzer found them as tracebacks deep in the backend)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import assert_one_line_error, run_cli
from zonnx.errors import ModelLoadError
from zonnx.ir.checks import check_attributes, check_structure, check_tensors, check_wiring
from zonnx.ir.io import load_proto


def _conv_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w")
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [conv],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_a_valid_model_passes_every_check() -> None:
    check_structure(_conv_model(), "m", order=True)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.dims.append(3), "needs 864 bytes of data but holds 288"),
        (lambda t: setattr(t, "data_type", TensorProto.DOUBLE), "needs 576 bytes of data but holds 288"),
        (lambda t: setattr(t, "data_type", TensorProto.UNDEFINED), "is not an ONNX type"),
        (lambda t: setattr(t, "data_type", TensorProto.STRING), "needs 72 string_data entries but holds 0"),
        (lambda t: t.dims.__setitem__(0, -4), "negative dimension"),
    ],
)
def test_an_initializer_whose_data_does_not_fill_its_shape_is_refused(edit, message: str) -> None:
    model = _conv_model()
    edit(model.graph.initializer[0])
    with pytest.raises(ModelLoadError, match=message):
        check_tensors(model, "m.onnx")


def test_typed_data_fields_are_counted_too() -> None:
    model = _conv_model()
    model.graph.initializer[0].CopyFrom(helper.make_tensor("w", TensorProto.FLOAT, [4, 2, 3, 3], [1.0] * 72))
    del model.graph.initializer[0].float_data[-1]
    with pytest.raises(ModelLoadError, match="needs 72 float_data entries but holds 71"):
        check_tensors(model, "m.onnx")


def test_an_attribute_of_the_wrong_type_names_the_node() -> None:
    model = _conv_model()
    pads = model.graph.node[0].attribute[0]
    pads.type = onnx.AttributeProto.FLOAT
    with pytest.raises(
        ModelLoadError, match="node 'conv' \\(Conv\\): attribute 'pads' is of type FLOAT, but Conv takes INTS"
    ):
        check_attributes(model, "m.onnx")


def test_a_zonnx_op_attribute_is_checked_against_its_own_schema() -> None:
    from zonnx.custom_ops.registry import make_node

    node = make_node("FixNeuron", ["x"], ["y"], pos=4)
    node.attribute[[a.name for a in node.attribute].index("pos")].type = onnx.AttributeProto.STRING
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.zonnx", 1)]
    )
    with pytest.raises(ModelLoadError, match="attribute 'pos' is of type STRING, but FixNeuron takes INT"):
        check_attributes(model, "m.onnx")


def test_reads_of_tensors_nobody_writes_are_refused_sorted_or_not() -> None:
    model = _conv_model()
    model.graph.node[0].input[1] = "missing"
    with pytest.raises(ModelLoadError, match="reads 'missing', which no node"):
        check_wiring(model, "m.onnx", order=False)


def test_corrupt_initializer_through_the_cli_is_one_line(tmp_path: Path) -> None:
    model = _conv_model()
    model.graph.initializer[0].data_type = TensorProto.INT64
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelLoadError):
        load_proto(path)
    for args in (["compile", str(path), "-o", str(tmp_path / "c.onnx")], ["profile", str(path)]):
        assert_one_line_error(run_cli(*args), str(path), "initializer 'w'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_node_with_the_wrong_number_of_inputs_is_refused() -> None:
    model = _conv_model()
    model.graph.node[0].input.append("w")
    model.graph.node[0].input.append("w")
    with pytest.raises(ModelLoadError, match="node 'conv' \\(Conv\\) has 4 inputs, but Conv takes 2 to 3"):
        check_attributes(model, "m.onnx")


def test_names_inside_functions_and_subgraphs_are_checked() -> None:
    from zonnx.ir.checks import check_names

    body = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["bbbbAA"], name="inner")],
        "then",
        [],
        [helper.make_tensor_value_info("bbbbAA", TensorProto.FLOAT, [2])],
    )
    if_node = helper.make_node("If", ["c"], ["y"], name="branch", then_branch=body, else_branch=body)
    fn = helper.make_function(
        "custom.d",
        "Fn",
        ["a"],
        ["ffffAA"],
        [helper.make_node("Relu", ["a"], ["ffffAA"])],
        [helper.make_opsetid("", 17)],
    )
    graph = helper.make_graph(
        [if_node],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], functions=[fn])
    data = model.SerializeToString()
    for text, where in (
        (b"bbbbAA", "node 'branch': attribute '(then|else)_branch': graph output"),
        (b"ffffAA", "function custom.d.Fn: input, output or attribute name"),
    ):
        bad = onnx.ModelProto.FromString(data.replace(text, text[:4] + b"\xff\xfe"))
        with pytest.raises(ModelLoadError, match=where):
            check_names(bad, "m.onnx")


def test_a_node_overload_that_is_not_text_is_refused() -> None:
    """The fuzzer's last find: NodeProto.overload is a string field too."""
    from zonnx.ir.checks import check_names

    model = _conv_model()
    model.graph.node[0].overload = "oooooo"
    bad = onnx.ModelProto.FromString(model.SerializeToString().replace(b"oooooo", b"oooo\xff\xfe"))
    with pytest.raises(ModelLoadError, match=r"node #0 \(overload\)"):
        check_names(bad, "m.onnx")
