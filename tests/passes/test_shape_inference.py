"""Tests for shape-inference: PP-OCR models end fully shaped, symbolic dims stay symbolic, unknowns are listed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import pytest
from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

from tests.helpers import run_pass_and_compare
from zonnx import zoo
from zonnx.errors import OptionError
from zonnx.ir.io import load_proto, to_ir, to_proto
from zonnx.passes.common.shape_inference import ShapeInferencePass, UnknownShape, unknown_shapes
from zonnx.verify import ort_session

BACKEND_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"

#: Generated inputs small enough that each PP-OCR run takes milliseconds.
PPOCR_SHAPES = {"ppocr_det": (1, 3, 64, 64), "ppocr_rec": (1, 3, 48, 64), "ppocr_cls": (1, 3, 48, 64)}
#: Node outputs in each PP-OCR file (all of them start without a type).
PPOCR_VALUES = {"ppocr_det": 671, "ppocr_rec": 859, "ppocr_cls": 565}


def _feeds(shape: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


@pytest.fixture(scope="module")
def ppocr():
    """name -> (original proto, inferred proto, pass result), the pass run once per model."""
    out = {}
    for name, shape in PPOCR_SHAPES.items():
        original = load_proto(zoo.get(name))
        model, result = run_pass_and_compare(ShapeInferencePass(), original, feeds=_feeds(shape))
        out[name] = (original, to_proto(model), result)
    return out


def _dims(proto: onnx.ModelProto, name: str) -> list[int | str]:
    (vi,) = [v for v in [*proto.graph.value_info, *proto.graph.output] if v.name == name]
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]


def _producer(proto: onnx.ModelProto, op_type: str, index: int = 0) -> str:
    return [n for n in proto.graph.node if n.op_type == op_type][index].output[0]


@pytest.mark.parametrize("name", list(PPOCR_SHAPES))
def test_ppocr_fully_shaped(ppocr, name):
    original, inferred, result = ppocr[name]
    assert len(unknown_shapes(to_ir(original))) == PPOCR_VALUES[name] + (name == "ppocr_cls")
    assert unknown_shapes(to_ir(inferred)) == []
    assert result.changes.misses == []
    assert result.changes.counts["typed values"] == PPOCR_VALUES[name]
    assert result.changes.counts["shaped values"] == PPOCR_VALUES[name] + (name == "ppocr_cls")
    # nodes untouched: same protos, same order
    assert [n.SerializeToString() for n in inferred.graph.node] == [
        n.SerializeToString() for n in original.graph.node
    ]
    assert len(inferred.graph.value_info) >= PPOCR_VALUES[name] - len(inferred.graph.output)


def test_ppocr_symbolic_dims(ppocr):
    """Dims that follow the input's symbols are named after them; fixed ones are numbers."""
    _, det, _ = ppocr["ppocr_det"]
    assert _dims(det, _producer(det, "Conv")) == [
        "p2o.DynamicDimension.0", 16, "p2o.DynamicDimension.1/2", "p2o.DynamicDimension.2/2"
    ]  # fmt: skip
    _, rec, _ = ppocr["ppocr_rec"]
    # onnx alone cannot rank the SVTR neck; the ORT runs name the sequence length W/8
    last_add = _producer(rec, "Add", -1)
    assert _dims(rec, last_add) == ["p2o.DynamicDimension.0", "p2o.DynamicDimension.1/8", 6625]
    assert _dims(rec, _producer(rec, "Conv")) == [
        "p2o.DynamicDimension.0",
        16,
        "x_dim2/2",
        "p2o.DynamicDimension.1/2",
    ]
    _, cls, _ = ppocr["ppocr_cls"]
    assert _dims(cls, "softmax_0.tmp_0") == ["x_dim0", 2]
    assert _dims(cls, "save_infer_model/scale_0.tmp_1") == ["x_dim0", 2]  # was [-1, 2]


@pytest.mark.parametrize(
    ("name", "shapes"),
    [
        ("ppocr_det", [(2, 3, 96, 128)]),
        ("ppocr_rec", [(2, 3, 48, 160), (1, 3, 32, 320)]),
        ("ppocr_cls", [(3, 3, 40, 100)]),
    ],
)
def test_ppocr_runs_at_other_sizes_with_optimizations(ppocr, name, shapes):
    """The written shapes hold at sizes the inference never saw, also when ORT optimizes with them."""
    original, inferred, _ = ppocr[name]
    before, after = ort_session(original, optimize=True), ort_session(inferred, optimize=True)
    for shape in shapes:
        feeds = _feeds(shape, seed=1)
        for a, b in zip(before.run(None, feeds), after.run(None, feeds), strict=True):
            assert a.shape == b.shape
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["ppocr_rec", "ppocr_cls"])
def test_ort_symbolic_shape_inference_gives_up_where_we_finish(ppocr, name):
    original, _, _ = ppocr[name]
    with pytest.raises(Exception):  # noqa: B017 - "Incomplete symbolic shape inference" or an assert
        SymbolicShapeInference.infer_shapes(original, auto_merge=False)


def test_second_run_changes_nothing(ppocr):
    _, inferred, _ = ppocr["ppocr_cls"]
    again = ShapeInferencePass()(to_ir(onnx.ModelProto.FromString(inferred.SerializeToString())))
    assert not again.modified and again.changes.misses == []


# -- small models from ONNX text ------------------------------------------------------------------
def _model(text: str, *inits: tuple[str, np.ndarray]) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(onnx.numpy_helper.from_array(a, n) for n, a in inits)
    return model


CONV = """<ir_version: 8, opset_import: ["" : 17]>
g (float[N,3,H,W] x) => (float[N,8,?,?] y, float[N,?] f) {
  c = Conv<strides=[2,2], pads=[1,1,1,1], kernel_shape=[3,3]>(x, w)
  y = Relu(c)
  f = Flatten(y)
}"""
WEIGHT = ("w", np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32))


def _shape_of(model, name: str) -> list[int | str]:
    (value,) = [v for n in model.graph for v in n.outputs if v.name == name]
    return [d if isinstance(d, int) else d.value for d in value.shape]


def test_symbolic_names_follow_the_inputs():
    model, result = run_pass_and_compare(ShapeInferencePass(), _model(CONV, WEIGHT))
    assert _shape_of(model, "c") == ["N", 8, "H/2", "W/2"]
    assert _shape_of(model, "y") == ["N", 8, "H/2", "W/2"]
    assert _shape_of(model, "f") == ["N", "f_dim1"]  # 8*H/2*W/2 depends on two symbols: a name of its own
    assert result.changes.misses == [] and unknown_shapes(model) == []


def test_without_runs_onnx_placeholders_remain():
    model, _ = run_pass_and_compare(ShapeInferencePass(runtime=False), _model(CONV, WEIGHT))
    assert _shape_of(model, "c")[:2] == ["N", 8] and _shape_of(model, "c")[2].startswith("unk__")


def test_data_dependent_dims_get_their_own_name():
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[N,64] x) => (int64[2,?] y) { r = Relu(x) y = NonZero(r) }"""
    model, _ = run_pass_and_compare(ShapeInferencePass(), _model(text))
    assert _shape_of(model, "y") == [2, "y_dim1"]


def test_contrib_op_typed_by_ort():
    """onnx has no schema for com.microsoft.Gelu: its output is typed and shaped from the ORT runs."""
    text = """<ir_version: 8, opset_import: ["" : 17, "com.microsoft": 1]>
    g (float[N,16] x) => (float[N,16] y) { g = com.microsoft.Gelu(x) y = Relu(g) }"""
    onnx_only, _ = run_pass_and_compare(ShapeInferencePass(runtime=False), _model(text))
    assert [u.name for u in unknown_shapes(onnx_only)] == ["g"]
    model, result = run_pass_and_compare(ShapeInferencePass(), _model(text))
    assert _shape_of(model, "g") == ["N", 16]
    (g,) = [v for n in model.graph for v in n.outputs if v.name == "g"]
    assert g.dtype.name == "FLOAT" and result.changes.counts["typed values"] == 1


def test_symbol_that_cannot_vary_makes_constant_dims_untrusted():
    """C only works at 64 (the Add's bias): a dim constant across the runs may still follow C."""
    text = """<ir_version: 8, opset_import: ["" : 17, "com.microsoft": 1]>
    g (float[N,C] x) => (float[N,64] y) { a = Add(x, b) g = com.microsoft.Gelu(a) y = Relu(g) }"""
    bias = ("b", np.ones((1, 64), np.float32))
    model, result = run_pass_and_compare(ShapeInferencePass(), _model(text, bias))
    assert _shape_of(model, "g") == ["N", "g_dim1"]
    assert (
        "input dim C could not be varied (model fails at other sizes); dims kept symbolic"
        in result.changes.misses
    )


def test_data_propagation_option():
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[N,3,4] x) => (float[?,?] y) {
      s = Shape(x) i = Constant<value=int64[1] {1}>() d = Gather<axis=0>(s, i)
      m = Constant<value=int64[1] {-1}>() t = Concat<axis=0>(m, d) y = Reshape(x, t)
    }"""
    with_prop, _ = run_pass_and_compare(ShapeInferencePass(runtime=False), _model(text))
    assert _shape_of(with_prop, "y")[1] == 3
    without, _ = run_pass_and_compare(ShapeInferencePass(data_prop=False, runtime=False), _model(text))
    assert str(_shape_of(without, "y")[1]).startswith("unk__")
    observed, _ = run_pass_and_compare(ShapeInferencePass(data_prop=False), _model(text))
    assert _shape_of(observed, "y") == ["N*4", 3]


def test_unknowns_are_listed_with_their_node():
    """A subgraph value onnx cannot type and an op ORT does not know stay unknown, and say so."""
    text = """<ir_version: 8, opset_import: ["" : 17, "com.microsoft": 1, "my.ops": 1]>
    g (float[N,4] x, bool c) => (float[N,4] y, float[N,4] z) {
      y = If(c) <then_branch = t () => (float[N,4] a) { gl = com.microsoft.Gelu(x) a = Identity(gl) },
                 else_branch = e () => (float[N,4] b) { b = Neg(x) }>
      f = my.ops.Foo(x)
      z = Relu(f)
    }"""
    proto = _model(text)
    proto.graph.node[1].name = "foo_node"
    model = to_ir(proto)
    result = ShapeInferencePass()(model)
    unknown = unknown_shapes(model)
    assert unknown == [
        UnknownShape("gl", "Gelu", "(unnamed)", "no type"),
        UnknownShape("f", "Foo", "foo_node", "no type"),
    ]
    assert result.changes.misses[0].startswith("ORT runs skipped: onnxruntime cannot load the model")
    assert result.changes.misses[1:] == [
        "gl (output of Gelu node (unnamed)): no type",
        "f (output of Foo node foo_node): no type",
    ]


def test_user_shapes_pick_the_base_size():
    model, _ = run_pass_and_compare(
        ShapeInferencePass(shapes={"x": (2, 3, 40, 40)}), _model(CONV, WEIGHT), feeds=_feeds((2, 3, 40, 40))
    )
    assert _shape_of(model, "c") == ["N", 8, "H/2", "W/2"]


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ({"y": (1, 3, 8, 8)}, r"shapes given for \['y'\] but the model's inputs are \['x'\]"),
        ({"x": (1, 3, 8)}, r"shapes\['x'\]=\(1, 3, 8\) has 3 dims but the input has 4"),
    ],
)
def test_bad_shapes_option(shapes, message):
    with pytest.raises(OptionError, match=message):
        ShapeInferencePass(shapes=shapes)(to_ir(_model(CONV, WEIGHT)))


# -- ONNX backend test models shipped in the onnx wheel ---------------------------------------------
@pytest.mark.parametrize(
    "rel",
    [
        "pytorch-operator/test_operator_chunk",
        "pytorch-operator/test_operator_index",
        "pytorch-operator/test_operator_pad",
        "pytorch-converted/test_GLU_dim",
        "pytorch-converted/test_softmax_functional_dim3",
        "pytorch-converted/test_MaxPool2d_stride_padding_dilation",
        "simple/test_sequence_model1",
    ],
)
def test_backend_models(rel):
    """Every value gets a shape; the graph outputs' shapes equal the reference outputs' shapes."""
    folder = BACKEND_DATA / rel
    model = onnx.load(str(folder / "model.onnx"))
    expected = [
        onnx.numpy_helper.to_array(onnx.load_tensor(str(p)))
        for p in sorted((folder / "test_data_set_0").glob("output_*.pb"))
    ]
    ir_model = to_ir(model)
    result = ShapeInferencePass()(ir_model)
    assert unknown_shapes(ir_model) == [] and result.changes.misses == []
    for value, ref in zip(ir_model.graph.outputs, expected, strict=True):
        assert tuple(value.shape) == ref.shape
    assert [n.SerializeToString() for n in to_proto(ir_model).graph.node] == [
        n.SerializeToString() for n in model.graph.node
    ]


def test_big_weights_are_stubbed_and_put_back():
    """Weights over 1 KiB reach onnx's inference as typed stubs: the shapes are those onnx infers with the
    data, and every initializer holds the same tensor object (and bytes) after the pass."""
    model = to_ir(zoo.get("resnet18-random"))
    for value in model.graph:  # forget what the export knew, so the pass has to infer it
        for out in value.outputs:
            out.shape, out.type = None, None
    before = {name: v.const_value for name, v in model.graph.initializers.items()}
    data = {name: t.numpy().copy() for name, t in before.items()}
    assert sum(t.nbytes > 1024 for t in before.values()) >= 20  # the stubbed path is taken
    ShapeInferencePass(runtime=False)(model)
    for name, value in model.graph.initializers.items():
        assert value.const_value is before[name]
        np.testing.assert_array_equal(value.const_value.numpy(), data[name])
    full = onnx.shape_inference.infer_shapes(to_proto(zoo.get("resnet18-random")), data_prop=True)
    inferred = to_ir(full)
    expected = {
        v.name: (v.dtype, str(v.shape)) for n in inferred.graph for v in n.outputs if v.shape is not None
    }
    got = {v.name: (v.dtype, str(v.shape)) for n in model.graph for v in n.outputs if v.name in expected}
    assert len(got) == len(expected) > 40
    assert got == expected
