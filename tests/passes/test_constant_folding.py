"""Tests for constant-folding: Constant lifting, folding, shape folding, refusals, real and backend models.

The PP-OCR, backend-case and compare helpers here are shared by the other clean-up pass tests.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import numpy_helper
from PIL import Image, ImageDraw, ImageFont

from tests.helpers import op_types, parse, run_pass_and_compare
from zonnx import zoo
from zonnx.ir.io import load_proto, to_ir, to_proto
from zonnx.passes.base import ZonnxPass, ZonnxPassResult
from zonnx.passes.common.constant_folding import ConstantFoldingPass
from zonnx.verify import check_loadable, run_ort

# ---------------------------------------------------------------- shared helpers

#: Small PP-OCR inputs (H, W): det needs multiples of 32; rec is 48 high; cls is 48x192.
PPOCR_HW = {"ppocr_det": (64, 64), "ppocr_rec": (48, 64), "ppocr_cls": (48, 192)}


@functools.cache
def _ppocr_bytes(name: str) -> bytes:
    return load_proto(zoo.get(name)).SerializeToString()


def ppocr_model(name: str, *, static: bool = False) -> onnx.ModelProto:
    """A fresh copy of a PP-OCR model; ``static`` fixes the input to 1x3xHxW (so shapes are known)."""
    model = onnx.ModelProto.FromString(_ppocr_bytes(name))
    if static:
        for dim, size in zip(
            model.graph.input[0].type.tensor_type.shape.dim, (1, 3, *PPOCR_HW[name]), strict=True
        ):
            dim.Clear()
            dim.dim_value = size
    return model


@functools.cache
def _text_image(h: int, w: int) -> np.ndarray:
    img = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(img)
    draw.text((2, h // 2 - 8), "zonnx 42", fill="black", font=ImageFont.truetype("DejaVuSans.ttf", 14))
    return ((np.asarray(img, np.float32) / 255 - 0.5) / 0.5).transpose(2, 0, 1)[None].copy()


def ppocr_feeds(name: str) -> dict[str, np.ndarray]:
    """A rendered text line, normalized as rapidocr does: the outputs then span a real range."""
    return {"x": _text_image(*PPOCR_HW[name])}


#: onnx's node-test generators (the same cases as onnx/backend/test/data/node, which this onnx wheel
#: does not ship): importing a module runs its exports, which register the cases.
_NODE_MODULES = [
    "layernormalization", "groupnormalization", "center_crop_pad", "gelu", "softmax",
    "meanvariancenormalization", "if_", "loop", "dropout", "identity", "reshape", "shape",
]  # fmt: skip


@functools.cache
def _node_cases() -> dict[str, object]:
    import onnx.backend.test.case.node as node_cases

    for module in _NODE_MODULES:
        importlib.import_module(f"onnx.backend.test.case.node.{module}")
    return {case.name: case for case in node_cases._NodeTestCases}


def node_case(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]:
    """Model, inputs by name and reference outputs of an ONNX backend node test."""
    case = _node_cases()[name]
    inputs, outputs = case.data_sets[0]
    feeds = dict(zip([i.name for i in case.model.graph.input], inputs, strict=True))
    return onnx.ModelProto.FromString(case.model.SerializeToString()), feeds, list(outputs)


def shipped_case(folder: str, name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]:
    """A backend test shipped in the wheel (onnx/backend/test/data/<folder>/<name>) with its .pb data."""
    root = Path(onnx.__file__).parent / "backend" / "test" / "data" / folder / name
    model = onnx.load(str(root / "model.onnx"))

    def read(kind: str) -> list[np.ndarray]:
        files = sorted(
            (root / "test_data_set_0").glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.split("_")[1])
        )
        return [numpy_helper.to_array(onnx.load_tensor(str(p))) for p in files]

    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    return model, dict(zip(names, read("input"), strict=True)), read("output")


def check_reference(
    pass_: ZonnxPass,
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    expected: list[np.ndarray],
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> tuple[ir.Model, ZonnxPassResult]:
    """Run the pass; the result must load, keep the output names and match the stored reference outputs."""
    names = [o.name for o in model.graph.output]
    result = pass_(to_ir(onnx.ModelProto.FromString(model.SerializeToString())))
    after = to_proto(result.model)
    check_loadable(after, full_check=False)
    assert [o.name for o in after.graph.output] == names
    got = run_ort(after, feeds)
    for name, ref in zip(names, expected, strict=True):
        np.testing.assert_allclose(got[name], ref, rtol=rtol, atol=atol, err_msg=f"output {name}")
    return result.model, result


# ---------------------------------------------------------------- PP-OCR models


def test_rec_constants_become_initializers():
    """PP-OCRv4 rec keeps all its weights in 420 Constant nodes: afterwards they are initializers."""
    model = ppocr_model("ppocr_rec")
    assert op_types(model).count("Constant") == 420 and not model.graph.initializer
    out, result = run_pass_and_compare(ConstantFoldingPass(), model, feeds=ppocr_feeds("ppocr_rec"))
    assert "Constant" not in op_types(out)
    assert result.changes.counts == {
        "lifted Constant to initializer": 420,
        "folded Cast": 15,
        "removed initializer left unused by folding": 15,
    }
    conv_weights = [n.inputs[1] for n in out.graph if n.op_type == "Conv"]
    assert len(conv_weights) == 38 and all(w.is_initializer() for w in conv_weights)
    assert len(out.graph.initializers) == 420
    assert result.changes.misses == []


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ppocr_det", {"lifted Constant to initializer": 342}),
        (
            "ppocr_cls",
            {
                "lifted Constant to initializer": 308,
                "folded Reshape": 18,
                "folded Cast": 1,
                "removed initializer left unused by folding": 37,
            },
        ),
    ],
)
def test_det_and_cls(name, expected):
    out, result = run_pass_and_compare(ConstantFoldingPass(), ppocr_model(name), feeds=ppocr_feeds(name))
    assert result.changes.counts == expected
    assert "Constant" not in op_types(out)


def test_rec_with_static_input_folds_every_shape_computation():
    """With the input shape fixed, Shape->Cast->Slice->Concat chains all fold (over several rounds)."""
    model = ppocr_model("ppocr_rec", static=True)
    before = op_types(model)
    assert before.count("Shape") == 4 and before.count("Concat") == 7
    out, result = run_pass_and_compare(ConstantFoldingPass(), model, feeds=ppocr_feeds("ppocr_rec"))
    after = op_types(out)
    assert after.count("Shape") == 0 and after.count("Cast") == 0 and after.count("Concat") == 1
    counts = result.changes.counts
    assert counts["folded Shape"] == 4 and counts["folded Cast"] == 23 and counts["folded Concat"] == 6
    assert after.count("Reshape") == 6  # the reshapes stay, now with constant targets
    reshape_targets = [n.inputs[1] for n in out.graph if n.op_type == "Reshape"]
    assert all(t.is_initializer() for t in reshape_targets)


# ---------------------------------------------------------------- small models, one rule each


def test_fold_chain_keeps_graph_output_name():
    model = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[2,3] y, float[3] k) {
            a = Constant<value = float[3] {1.0, 2.0, 3.0}>()
            b = Add(a, a)
            k = Mul(b, two)
            y = Mul(x, k)
        }
        """, ("two", np.float32(2.0)))  # fmt: skip
    out, result = run_pass_and_compare(ConstantFoldingPass(), model)
    assert result.changes.counts == {
        "lifted Constant to initializer": 1,
        "folded Add": 1,
        "folded Mul": 1,
        "removed initializer left unused by folding": 3,  # a, two, and the folded b
    }
    assert op_types(out) == ["Mul"]
    assert [o.name for o in out.graph.outputs] == ["y", "k"]
    np.testing.assert_array_equal(out.graph.initializers["k"].const_value.numpy(), [4.0, 8.0, 12.0])
    assert set(out.graph.initializers) == {"k"}


def test_partial_shapes_fold_only_static_entries():
    """Shape of [N,3,8]: the slice [3,8] and its product fold; the batch entry stays dynamic."""
    model = parse("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[N,3,8] x) => (float[N,24] y) {
            s = Shape(x)
            h = Slice(s, one, three)
            p = ReduceProd<keepdims = 1>(h)
            n = Slice(s, zero, one)
            shp = Concat<axis = 0>(n, p)
            y = Reshape(x, shp)
        }
        """, ("zero", np.array([0])), ("one", np.array([1])), ("three", np.array([3])))  # fmt: skip
    out, result = run_pass_and_compare(ConstantFoldingPass(), model, shapes={"x": (2, 3, 8)})
    assert result.changes.counts == {
        "folded Slice": 1,
        "folded ReduceProd": 1,
        "removed initializer left unused by folding": 2,  # 'three' and the folded h; n still uses 'one'
    }
    assert op_types(out) == ["Shape", "Slice", "Concat", "Reshape"]
    np.testing.assert_array_equal(out.graph.initializers["p"].const_value.numpy(), [24])


def test_shape_gather_of_static_dim_folds():
    model = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N,3,8] x) => (float[N,3,8] y) {
            s = Shape(x)
            c = Gather<axis = 0>(s, idx)
            f = Cast<to = 1>(c)
            y = Mul(x, f)
        }
        """, ("idx", np.array(1)))  # fmt: skip
    out, result = run_pass_and_compare(ConstantFoldingPass(), model, shapes={"x": (2, 3, 8)})
    assert result.changes.counts["folded Gather"] == 1 and result.changes.counts["folded Cast"] == 1
    assert op_types(out) == ["Mul"]
    assert out.graph.initializers["f"].const_value.numpy() == np.float32(3.0)


def test_random_ops_are_never_folded():
    model = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y) {
            r = RandomNormal<shape = [4], seed = 1.0>()
            y = Add(x, r)
        }
        """)  # fmt: skip
    result = ConstantFoldingPass()(to_ir(model))
    assert op_types(result.model) == ["RandomNormal", "Add"]
    assert not result.modified
    assert result.changes.misses == ["RandomNormal -> 'r': random; not folded"]


def test_size_limit_is_a_miss():
    text = """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1000,1000] x) => (float[1000,1000] y) {
            z = ConstantOfShape<value = float[1] {1.0}>(shp)
            y = Add(x, z)
        }
        """
    model = parse(text, ("shp", np.array([1000, 1000])))
    small = ConstantFoldingPass(size_limit=1 << 20)(to_ir(model))
    assert op_types(small.model) == ["ConstantOfShape", "Add"]
    assert small.changes.total == 0
    assert small.changes.misses == [
        "ConstantOfShape -> 'z': result of about 4000000 bytes is over the folding limit of 1048576; kept"
    ]
    folded = ConstantFoldingPass()(to_ir(parse(text, ("shp", np.array([1000, 1000])))))
    assert op_types(folded.model) == ["Add"] and folded.changes.counts["folded ConstantOfShape"] == 1


def test_subgraphs_fold_inside_but_control_flow_stays():
    model = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[3] x, bool c) => (float[3] y) {
            two = Constant<value = float[3] {2.0, 2.0, 2.0}>()
            y = If(c) <then_branch = t () => (float[3] a) {
                k = Constant<value = float[3] {1.0, 2.0, 3.0}>()
                s = Add(k, two)
                a = Mul(x, s)
            }, else_branch = e () => (float[3] b) {
                b = Sub(x, two)
            }>
        }
        """)  # fmt: skip
    for cond in (True, False):
        feeds = {"x": np.arange(3, dtype=np.float32), "c": np.array(cond)}
        out, result = run_pass_and_compare(ConstantFoldingPass(), model, feeds=feeds)
    assert result.changes.counts == {
        "lifted Constant to initializer": 2,
        "folded Add": 1,
        "removed initializer left unused by folding": 1,
    }
    assert op_types(out) == ["If"]
    then_branch = next(iter(out.graph)).attributes["then_branch"].as_graph()
    np.testing.assert_array_equal(then_branch.initializers["s"].const_value.numpy(), [3.0, 4.0, 5.0])


def test_quantized_weights_and_constant_outputs_are_kept():
    model = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y, float[2] c) {
            w = DequantizeLinear(q, scale)
            y = Mul(x, w)
            c = Constant<value = float[2] {5.0, 6.0}>()
        }
        """, ("q", np.array([1, 2, 3, 4], np.int8)), ("scale", np.float32(0.5)))  # fmt: skip
    out, result = run_pass_and_compare(ConstantFoldingPass(), model)
    assert op_types(out) == ["DequantizeLinear", "Mul", "Constant"]
    assert result.changes.total == 0
    assert result.changes.misses == ["1 constant (De)QuantizeLinear node(s) kept so weights stay quantized"]


def test_initializer_that_is_a_graph_input_is_not_constant():
    """An initializer listed as a graph input can be overridden at run time: never fold it."""
    model = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[3] x, float[3] w) => (float[3] y) {
            v = Neg(w)
            y = Add(x, v)
        }
        """, ("w", np.ones(3, np.float32)))  # fmt: skip
    result = ConstantFoldingPass()(to_ir(model))
    assert op_types(result.model) == ["Neg", "Add"] and result.changes.total == 0


def test_ort_evaluates_conv():
    """Conv runs in ORT (the reference evaluator is slow at it); the folded weights match exactly."""
    rng = np.random.default_rng(0)
    model = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,4,6,6] x) => (float[1,4,6,6] y) {
            k = Conv<pads = [1, 1, 1, 1]>(a, b)
            y = Add(x, k)
        }
        """, ("a", rng.standard_normal((1, 3, 6, 6)).astype(np.float32)),
        ("b", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)))  # fmt: skip
    out, result = run_pass_and_compare(ConstantFoldingPass(), model)
    assert op_types(out) == ["Add"] and result.changes.counts["folded Conv"] == 1


# ---------------------------------------------------------------- ONNX backend tests


_LIFT = "lifted Constant to initializer"
_DROP = "removed initializer left unused by folding"


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "test_layer_normalization_4d_axis1_expanded",
            {_LIFT: 3, "folded Cast": 1, "folded Shape": 1, "folded Size": 1, "folded Slice": 1,
             "folded Sub": 1, "folded ConstantOfShape": 1, "folded Concat": 1, _DROP: 7},
        ),
        (
            "test_group_normalization_example_expanded",
            {_LIFT: 5, "folded Cast": 1, "folded Shape": 4, "folded Div": 1, "folded Concat": 1, _DROP: 6},
        ),
        # the crop size is a graph input: only the input's own shape folds, the rest stays
        ("test_center_crop_pad_crop_axes_hwc_expanded", {_LIFT: 2, "folded Shape": 1, "folded Gather": 1, _DROP: 1}),
        # CastLike(constant, x) folds because x's type is known
        ("test_gelu_tanh_1_expanded", {_LIFT: 5, "folded CastLike": 5, "folded Sqrt": 1, _DROP: 6}),
        ("test_shape_start_1", {"folded Shape": 1}),  # the graph output becomes an initializer
        ("test_if", {}),
        ("test_loop11", {_LIFT: 2}),  # Constants inside the Loop body
    ],
)  # fmt: skip
def test_backend_node_cases(case, expected):
    model, feeds, reference = node_case(case)
    out, result = check_reference(ConstantFoldingPass(), model, feeds, reference)
    assert result.changes.counts == expected
    assert "Constant" not in op_types(out) and result.changes.misses == []


@pytest.mark.parametrize(
    ("folder", "case", "ops"),
    [
        ("pytorch-operator", "test_operator_repeat_dim_overflow", ["Reshape", "Tile"]),
        ("pytorch-converted", "test_PixelShuffle", ["Reshape", "Transpose", "Reshape"]),
        ("simple", "test_expand_shape_model1", ["Expand"]),
    ],
)
def test_backend_shipped_cases(folder, case, ops):
    model, feeds, expected = shipped_case(folder, case)
    ir_version = model.ir_version
    out, result = check_reference(ConstantFoldingPass(), model, feeds, expected)
    assert op_types(out) == ops
    if ir_version < 4 and result.changes.total:  # IR 3 needs initializers among the inputs: raised to 4
        assert out.ir_version == 4


def test_scalar_from_shape_gather_stays_scalar() -> None:
    """Shape -> Gather(scalar index) folds to a 0-d scalar, so a following Unsqueeze gives rank 1."""
    from tests.helpers import parse, run_pass_and_compare

    model = parse(
        """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 96] x) => (float[2, 96] y) {
    s = Shape(x)
    i = Constant<value = int64 {1}>()
    d = Gather<axis = 0>(s, i)
    zero = Constant<value = int64[1] {0}>()
    u = Unsqueeze(d, zero)
    two = Constant<value = int64[1] {2}>()
    shape = Concat<axis = 0>(two, u)
    y = Reshape(x, shape)
}
"""
    )
    folded, result = run_pass_and_compare(ConstantFoldingPass(), model)
    assert [n.op_type for n in folded.graph] == ["Reshape"]
    shape = next(iter(folded.graph)).inputs[1].const_value.numpy()
    assert shape.shape == (2,) and shape.tolist() == [2, 96]
