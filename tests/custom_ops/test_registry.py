"""make_node, add_functions and the evaluators: attribute checks, function insertion, round trips, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from zonnx.custom_ops import (
    REGISTRY,
    ZONNX_DOMAIN,
    add_functions,
    evaluator_model,
    make_node,
    reference_run,
    run_functions,
    run_reference,
)
from zonnx.errors import OptionError, UnsupportedModelError
from zonnx.ir.io import load_proto, save_model, to_ir, to_proto

X = np.linspace(-3, 3, 97, dtype=np.float32)


def _graph_model(nodes, outputs, opset: int = 17, ir_version: int = 10, inputs=None) -> onnx.ModelProto:
    inputs = inputs or [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])]
    outs = [helper.make_tensor_value_info(name, dtype, [None]) for name, dtype in outputs]
    graph = helper.make_graph(nodes, "g", inputs, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def _ort(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def _identical(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_registry_lists_the_three_ops() -> None:
    assert REGISTRY.names() == ("FixNeuron", "VitisQuantizeLinear", "VitisDequantizeLinear")
    assert "FixNeuron" in REGISTRY and len(REGISTRY) == 3
    with pytest.raises(OptionError, match="Did you mean 'FixNeuron'"):
        REGISTRY["FixNeuorn"]
    fix = REGISTRY["FixNeuron"]
    assert [a.name for a in fix.attributes] == ["bit_width", "pos", "signed", "narrow", "round_mode"]
    assert fix.spec("pos").default is None and fix.spec("bit_width").default == 8
    assert fix.overloads == ("half_even", "half_up", "half_away", "floor", "trunc")
    assert REGISTRY["VitisDequantizeLinear"].overloads == ("",)


def test_make_node_writes_every_attribute_and_the_overload() -> None:
    node = make_node("FixNeuron", ["x"], ["y"], pos=3, round_mode="toward_zero")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"bit_width": 8, "pos": 3, "signed": 1, "narrow": 0, "round_mode": b"trunc"}
    assert (node.domain, node.overload) == (ZONNX_DOMAIN, "trunc")
    q = make_node("VitisQuantizeLinear", ["x"], ["q"], pos=0, bit_width=12, signed=0)
    assert {a.name: helper.get_attribute_value(a) for a in q.attribute}["output_dtype"] == TensorProto.UINT16
    dq = make_node("VitisDequantizeLinear", ["q"], ["y"], pos=2)
    assert dq.overload == "" and len(dq.attribute) == 4


@pytest.mark.parametrize(
    ("op", "attrs", "fragments"),
    [
        (
            "FixNeuron",
            dict(pos=1, bitwidth=8),
            ["'fix1'", "no attribute 'bitwidth'", "Did you mean 'bit_width'"],
        ),
        ("FixNeuron", dict(pos=1, bit_width=40), ["'fix1'", "bit_width=40", "[2, 24]"]),
        ("FixNeuron", dict(pos=1, bit_width=1), ["bit_width=1", "out of range"]),
        ("FixNeuron", dict(pos=127), ["pos=127", "[-127, 126]", "126"]),
        ("FixNeuron", dict(bit_width=8), ["'fix1'", "needs attribute 'pos'"]),
        ("FixNeuron", dict(pos=2.0), ["pos=2.0", "integer"]),
        ("FixNeuron", dict(pos=True), ["pos=True", "integer"]),
        ("FixNeuron", dict(pos=1, round_mode="half_uq"), ["half_uq", "Did you mean 'half_up'"]),
        ("FixNeuron", dict(pos=1, signed=0, narrow=1), ["narrow=1 needs signed=1"]),
        ("FixNeuron", dict(pos=1, signed=2), ["signed=2", "[0, 1]"]),
        ("VitisQuantizeLinear", dict(pos=1, bit_width=16, output_dtype=TensorProto.INT8), ["INT8", "INT16"]),
        ("VitisQuantizeLinear", dict(pos=1, output_dtype=TensorProto.FLOAT), ["FLOAT cannot hold"]),
        ("VitisDequantizeLinear", dict(pos=1, round_mode="half_up"), ["no attribute 'round_mode'"]),
    ],
)
def test_make_node_rejects_bad_attributes(op, attrs, fragments) -> None:
    with pytest.raises(OptionError) as info:
        make_node(op, ["x"], ["y"], name="fix1", **attrs)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_errors_name_the_output_when_the_node_has_no_name() -> None:
    with pytest.raises(OptionError, match="node producing 'act3_fix'"):
        make_node("FixNeuron", ["x"], ["act3_fix"], pos=200)
    with pytest.raises(OptionError, match="reference_run"):
        reference_run("FixNeuron", X, pos=1, bit_width=99)
    with pytest.raises(OptionError, match="not a com.zonnx op"):
        make_node("FixNeurons", ["x"], ["y"], pos=1)


def test_add_functions_inserts_only_what_is_used_once() -> None:
    nodes = [
        make_node("FixNeuron", ["x"], ["a"], pos=2, round_mode="half_up"),
        make_node("FixNeuron", ["x"], ["b"], pos=5, round_mode="half_up", bit_width=4),
        make_node("FixNeuron", ["x"], ["c"], pos=1),
    ]
    model = _graph_model(
        nodes, [("a", TensorProto.FLOAT), ("b", TensorProto.FLOAT), ("c", TensorProto.FLOAT)]
    )
    assert add_functions(model) is model
    add_functions(model, ["FixNeuron"])
    keys = sorted((f.domain, f.name, f.overload) for f in model.functions)
    assert keys == [(ZONNX_DOMAIN, "FixNeuron", "half_even"), (ZONNX_DOMAIN, "FixNeuron", "half_up")]
    assert [(i.domain, i.version) for i in model.opset_import] == [("", 17), (ZONNX_DOMAIN, 1)]
    onnx.checker.check_model(model, full_check=True)
    got = _ort(model, {"x": X})
    assert _identical(got["b"], reference_run("FixNeuron", X, pos=5, round_mode="half_up", bit_width=4))


def test_add_functions_without_zonnx_nodes_changes_nothing() -> None:
    model = _graph_model([helper.make_node("Relu", ["x"], ["y"])], [("y", TensorProto.FLOAT)], ir_version=8)
    before = model.SerializeToString()
    add_functions(model)
    assert model.SerializeToString() == before
    with pytest.raises(OptionError, match="Did you mean 'FixNeuron'"):
        add_functions(model, ["Fixneuron"])


def test_add_functions_normalizes_hand_written_nodes() -> None:
    """A node with only some attributes and no overload gets them filled in, output_dtype included."""
    nodes = [
        helper.make_node("VitisQuantizeLinear", ["x"], ["q"], domain=ZONNX_DOMAIN, pos=4, bit_width=16),
        helper.make_node("VitisDequantizeLinear", ["q"], ["y"], domain=ZONNX_DOMAIN, pos=4),
        helper.make_node("FixNeuron", ["x"], ["f"], domain=ZONNX_DOMAIN, pos=4, round_mode="std_round"),
    ]
    model = _graph_model(
        nodes, [("q", TensorProto.INT16), ("y", TensorProto.FLOAT), ("f", TensorProto.FLOAT)], ir_version=8
    )
    add_functions(model)
    assert model.ir_version == 10
    q, _, f = model.graph.node
    assert q.overload == "half_even" and f.overload == "half_away"
    assert {a.name: helper.get_attribute_value(a) for a in q.attribute}["output_dtype"] == TensorProto.INT16
    got = _ort(model, {"x": X * 1000})
    want = reference_run("VitisQuantizeLinear", X * 1000, pos=4, bit_width=16)
    assert want.dtype == np.int16 and _identical(got["q"], want)
    assert _identical(got["f"], reference_run("FixNeuron", X * 1000, pos=4, round_mode="half_away"))


def test_add_functions_rejects_bad_nodes_and_models() -> None:
    bad = helper.make_node("FixNeuron", ["x"], ["y"], name="fix_7", domain=ZONNX_DOMAIN, pos=3, bit_width=30)
    with pytest.raises(OptionError, match="node 'fix_7'.*bit_width=30"):
        add_functions(_graph_model([bad], [("y", TensorProto.FLOAT)]))
    mismatch = make_node("FixNeuron", ["x"], ["y"], name="fix_8", pos=3, round_mode="floor")
    mismatch.overload = "half_up"
    with pytest.raises(OptionError, match="fix_8.*overload 'half_up'"):
        add_functions(_graph_model([mismatch], [("y", TensorProto.FLOAT)]))
    unknown = helper.make_node("FixNeuronX", ["x"], ["y"], domain=ZONNX_DOMAIN)
    with pytest.raises(OptionError, match="'FixNeuronX' is not a com.zonnx op"):
        add_functions(_graph_model([unknown], [("y", TensorProto.FLOAT)]))
    old = _graph_model([make_node("FixNeuron", ["x"], ["y"], pos=3)], [("y", TensorProto.FLOAT)], opset=11)
    with pytest.raises(UnsupportedModelError, match="opset 11.*opset-upgrade"):
        add_functions(old)
    other = _graph_model([make_node("FixNeuron", ["x"], ["y"], pos=3)], [("y", TensorProto.FLOAT)])
    other.opset_import.append(helper.make_opsetid(ZONNX_DOMAIN, 2))
    with pytest.raises(UnsupportedModelError, match="version 2"):
        add_functions(other)


def test_function_attribute_defaults_apply_in_ort() -> None:
    """Nodes that leave attributes out get the defaults declared in the FunctionProto (ORT 1.31)."""
    node = helper.make_node("FixNeuron", ["x"], ["y"], domain=ZONNX_DOMAIN, pos=2)
    node.overload = "half_even"
    model = _graph_model([node], [("y", TensorProto.FLOAT)])
    model.functions.append(REGISTRY["FixNeuron"].function(17, "half_even"))
    model.opset_import.append(helper.make_opsetid(ZONNX_DOMAIN, 1))
    assert _identical(_ort(model, {"x": X * 100})["y"], reference_run("FixNeuron", X * 100, pos=2))


def test_nodes_in_subgraphs_are_found() -> None:
    branch = lambda name, pos: helper.make_graph(  # noqa: E731
        [make_node("FixNeuron", ["x"], [f"{name}_y"], pos=pos, round_mode="floor")],
        name,
        [],
        [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [None])],
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("t", 1), else_branch=branch("e", 3))
    inputs = [
        helper.make_tensor_value_info("c", TensorProto.BOOL, []),
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [None]),
    ]
    model = add_functions(_graph_model([node], [("y", TensorProto.FLOAT)], inputs=inputs))
    assert [(f.name, f.overload) for f in model.functions] == [("FixNeuron", "floor")]
    onnx.checker.check_model(model, full_check=True)
    got = _ort(model, {"c": np.array(False), "x": X})["y"]
    assert _identical(got, reference_run("FixNeuron", X, pos=3, round_mode="floor"))


def _ir_model() -> ir.Model:
    x = ir.val("x", ir.DataType.FLOAT, [97])
    fix = make_node("FixNeuron", [x], ["fix_out"], name="fix0", pos=3, round_mode="half_up", signed=0)
    quant = make_node("VitisQuantizeLinear", [x], ["codes"], name="q0", pos=5, bit_width=4)
    dequant = make_node("VitisDequantizeLinear", [quant.outputs[0]], ["deq"], name="dq0", pos=5, bit_width=4)
    graph = ir.Graph(
        [x],
        [fix.outputs[0], quant.outputs[0], dequant.outputs[0]],
        nodes=[fix, quant, dequant],
        opset_imports={"": 18},
        name="ir_built",
    )
    return ir.Model(graph, ir_version=8)


def test_ir_model_path() -> None:
    model = _ir_model()
    assert isinstance(model.graph.node(0), ir.Node) and model.graph.node(0).overload == "half_up"
    assert [v.dtype for v in model.graph.outputs] == [ir.DataType.FLOAT, ir.DataType.INT8, ir.DataType.FLOAT]
    assert all(v.shape == ir.Shape([97]) for v in model.graph.outputs)
    assert add_functions(model) is model
    assert sorted(model.functions) == [
        (ZONNX_DOMAIN, "FixNeuron", "half_up"),
        (ZONNX_DOMAIN, "VitisDequantizeLinear", ""),
        (ZONNX_DOMAIN, "VitisQuantizeLinear", "half_even"),
    ]
    proto = to_proto(model)
    assert proto.ir_version == 10 and {i.domain: i.version for i in proto.opset_import}[ZONNX_DOMAIN] == 1
    onnx.checker.check_model(proto, full_check=True)
    got = _ort(proto, {"x": X})
    assert _identical(got["fix_out"], reference_run("FixNeuron", X, pos=3, round_mode="half_up", signed=0))
    codes = reference_run("VitisQuantizeLinear", X, pos=5, bit_width=4)
    assert _identical(got["codes"], codes)
    assert _identical(got["deq"], reference_run("VitisDequantizeLinear", codes, pos=5))


def test_ir_types_are_checked() -> None:
    x = ir.val("x", ir.DataType.FLOAT, [4])
    dequant = make_node("VitisDequantizeLinear", [x], ["y"], name="dq_float", pos=1)
    model = ir.Model(
        ir.Graph([x], [dequant.outputs[0]], nodes=[dequant], opset_imports={"": 17}), ir_version=10
    )
    with pytest.raises(OptionError, match="dq_float.*input 'x' is FLOAT"):
        add_functions(model)
    x = ir.val("x", ir.DataType.FLOAT, [4])
    quant = make_node("VitisQuantizeLinear", [x], ["q"], name="q_typed", pos=1)
    quant.outputs[0].dtype = ir.DataType.UINT8
    model = ir.Model(ir.Graph([x], [quant.outputs[0]], nodes=[quant], opset_imports={"": 17}), ir_version=10)
    with pytest.raises(OptionError, match="q_typed.*typed UINT8 but output_dtype is INT8"):
        add_functions(model)


def test_functions_survive_save_load_and_ir_round_trips(tmp_path: Path) -> None:
    model = add_functions(_ir_model())
    expected = _ort(to_proto(model), {"x": X})
    path = save_model(model, tmp_path / "q.onnx")
    loaded = load_proto(path)
    assert sorted((f.name, f.overload) for f in loaded.functions) == [
        ("FixNeuron", "half_up"),
        ("VitisDequantizeLinear", ""),
        ("VitisQuantizeLinear", "half_even"),
    ]
    fix = next(f for f in loaded.functions if f.name == "FixNeuron")
    assert list(fix.attribute) == ["pos"]
    assert {a.name for a in fix.attribute_proto} == {"bit_width", "signed", "narrow", "round_mode"}
    onnx.checker.check_model(loaded, full_check=True)
    again = to_proto(to_ir(loaded))
    for candidate in (loaded, again):
        got = _ort(candidate, {"x": X})
        assert all(_identical(got[k], expected[k]) for k in expected)


def test_evaluators_on_a_model_with_defaults_left_out() -> None:
    """run_functions fills the defaults ReferenceEvaluator ignores and keeps overloads apart."""
    nodes = [
        helper.make_node("FixNeuron", ["x"], ["a"], domain=ZONNX_DOMAIN, pos=2, round_mode="half_up"),
        helper.make_node("FixNeuron", ["x"], ["b"], domain=ZONNX_DOMAIN, pos=2),
    ]
    model = add_functions(_graph_model(nodes, [("a", TensorProto.FLOAT), ("b", TensorProto.FLOAT)]))
    for node in model.graph.node:  # make it as terse as a hand-written file: only the pos attribute
        keep = [a for a in node.attribute if a.name in ("pos", "round_mode")]
        del node.attribute[:]
        node.attribute.extend(keep)
    renamed = evaluator_model(model)
    assert sorted(n.op_type for n in renamed.graph.node) == ["FixNeuron__half_even", "FixNeuron__half_up"]
    ties = (np.arange(-8, 8) + 0.5).astype(np.float32) / 4
    want_a = reference_run("FixNeuron", ties, pos=2, round_mode="half_up")
    want_b = reference_run("FixNeuron", ties, pos=2)
    assert not np.array_equal(want_a, want_b)
    for run in (run_functions, run_reference):
        got = run(model, {"x": ties})
        assert _identical(got["a"], want_a) and _identical(got["b"], want_b), run.__name__
