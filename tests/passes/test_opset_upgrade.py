"""Tests for opset-upgrade: PP-OCR models, small models from ONNX text, ONNX backend test models, refusals."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import pytest

from tests.helpers import op_types, run_pass_and_compare
from zonnx import zoo
from zonnx.errors import OptionError, PassFailedError
from zonnx.ir.io import default_opset, load_proto, to_ir, to_proto
from zonnx.passes.common.opset_upgrade import OpsetUpgradePass
from zonnx.verify import make_inputs, run_ort

BACKEND_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"

#: Generated inputs small enough that each PP-OCR run takes milliseconds.
PPOCR_SHAPES = {"ppocr_det": (1, 3, 64, 64), "ppocr_rec": (1, 3, 48, 64), "ppocr_cls": (1, 3, 48, 64)}


@pytest.fixture(scope="module")
def ppocr() -> dict[str, tuple[onnx.ModelProto, dict[str, np.ndarray]]]:
    rng = np.random.default_rng(0)
    return {
        name: (load_proto(zoo.get(name)), {"x": rng.standard_normal(shape).astype(np.float32)})
        for name, shape in PPOCR_SHAPES.items()
    }


def _upgrade(pass_: OpsetUpgradePass, model: onnx.ModelProto, **kw):
    """Run the pass and check numerics, the target opset, the IR version and onnx's full check."""
    upgraded, result = run_pass_and_compare(pass_, model, **kw)
    proto = to_proto(upgraded)
    assert default_opset(proto) == pass_.target_opset
    assert proto.ir_version >= onnx.helper.find_min_ir_version_for(
        [onnx.helper.make_opsetid("", pass_.target_opset)]
    )
    onnx.checker.check_model(proto, full_check=True)
    return proto, result


# -- PP-OCR ----------------------------------------------------------------------------------------
#: What zonnx's adapters must rewrite in each PP-OCR model (rec is opset 12, det 12, cls 11).
ADAPTED = {
    "ppocr_det": {},
    "ppocr_rec": {
        "rewrote Squeeze axes to input": 7,
        "wrapped Softmax in Flatten/Reshape (axis semantics changed at opset 13)": 3,
    },
    "ppocr_cls": {"wrapped Softmax in Flatten/Reshape (axis semantics changed at opset 13)": 1},
}


@pytest.mark.parametrize("target", [13, 17, 21])
@pytest.mark.parametrize("name", list(PPOCR_SHAPES))
def test_ppocr_adapters(ppocr, name, target):
    model, feeds = ppocr[name]
    # verify=False: run_pass_and_compare checks the numbers; the pass need not check them twice
    _, result = _upgrade(OpsetUpgradePass(target, use_converter=False, verify=False), model, feeds=feeds)
    expected = dict(ADAPTED[name])
    if name == "ppocr_rec" and target >= 18:
        expected["rewrote ReduceMean axes to input"] = 10
    expected[f"opset {default_opset(model)} -> {target}"] = 1
    assert dict(result.changes.counts) == expected
    assert result.changes.misses == []


@pytest.mark.parametrize("target", [13, 17, 21])
@pytest.mark.parametrize("name", list(PPOCR_SHAPES))
def test_ppocr_converter(ppocr, name, target):
    model, feeds = ppocr[name]
    proto, result = _upgrade(OpsetUpgradePass(target), model, feeds=feeds)
    assert result.changes.misses == []  # the converter's result passed every check
    assert result.changes.counts[f"opset {default_opset(model)} -> {target}"] == 1
    assert op_types(proto).count("Conv") == op_types(model).count("Conv")


def test_ppocr_rec_weights_stay_in_constants(ppocr):
    """rec keeps its 420 weight Constants; the 7 Squeeze axes become initializers."""
    model, feeds = ppocr["ppocr_rec"]
    proto, _ = _upgrade(OpsetUpgradePass(17, use_converter=False), model, feeds=feeds)
    assert op_types(proto).count("Constant") == 420
    squeezes = [n for n in proto.graph.node if n.op_type == "Squeeze"]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    assert len(squeezes) == 7 and all(n.input[1] in inits and not n.attribute for n in squeezes)


# -- small models from ONNX text: one per adapter --------------------------------------------------
def _m(opset: int, ir_version: int, sig: str, body: str) -> str:
    return f'<ir_version: {ir_version}, opset_import: ["" : {opset}]>\ng {sig} {{ {body} }}'


#: name -> (model text, what the adapters must count)
CASES = {
    "clip10": (
        _m(10, 5, "(float[2,5] x) => (float[2,5] y)", "y = Clip<min=-0.5, max=0.7>(x)"),
        "rewrote Clip min/max to inputs",
    ),
    "clip10_min_only": (
        _m(10, 5, "(float[2,5] x) => (float[2,5] y)", "y = Clip<min=0.0>(x)"),
        "rewrote Clip min to input",
    ),
    "pad10_constant": (
        _m(
            10, 5, "(float[1,2,3,3] x) => (float[1,2,5,6] y)", "y = Pad<pads=[0,0,1,2,0,0,1,1], value=1.5>(x)"
        ),
        "rewrote Pad pads/value to inputs",
    ),
    "pad10_reflect": (
        _m(
            10,
            5,
            "(float[1,2,4,4] x) => (float[1,2,6,6] y)",
            'y = Pad<mode="reflect", pads=[0,0,1,1,0,0,1,1]>(x)',
        ),
        "rewrote Pad pads to input",
    ),
    "split12": (
        _m(12, 7, "(float[5,3] x) => (float[2,3] a, float[3,3] b)", "a, b = Split<axis=0, split=[2,3]>(x)"),
        "rewrote Split split to input",
    ),
    "squeeze12": (
        _m(
            12,
            7,
            "(float[1,3,1,2] x) => (float[3,1,2,1] y)",
            "s = Squeeze<axes=[0]>(x) y = Unsqueeze<axes=[3]>(s)",
        ),
        "rewrote Squeeze axes to input",
    ),
    "reducesum11": (
        _m(11, 6, "(float[2,3,4] x) => (float[2,1,4] y)", "y = ReduceSum<axes=[1], keepdims=1>(x)"),
        "rewrote ReduceSum axes to input",
    ),
    "softmax12_axis1_rank3": (
        _m(12, 7, "(float[2,3,4] x) => (float[2,3,4] y)", "y = Softmax<axis=1>(x)"),
        "wrapped Softmax in Flatten/Reshape (axis semantics changed at opset 13)",
    ),
    "logsoftmax12_default_axis": (
        _m(12, 7, "(float[2,3,4] x) => (float[2,3,4] y)", "y = LogSoftmax(x)"),
        "wrapped LogSoftmax in Flatten/Reshape (axis semantics changed at opset 13)",
    ),
    "softmax12_rank2": (
        _m(12, 7, "(float[2,5] x) => (float[2,5] y)", "y = Softmax(x)"),
        "set Softmax axis explicitly",
    ),
    "upsample7_nearest": (
        _m(
            7,
            3,
            "(float[1,1,2,3] x) => (float[1,1,4,9] y)",
            'y = Upsample<mode="nearest", scales=[1.0,1.0,2.0,3.0]>(x)',
        ),
        "rewrote Upsample-7 as Resize",
    ),
    "resize10_nearest_down": (
        _m(
            10,
            5,
            "(float[1,1,5,5] x) => (float[1,1,3,3] y)",
            's = Constant<value=float[4] {1,1,0.6,0.6}>() y = Resize<mode="nearest">(x, s)',
        ),
        "rewrote Resize-10 as Resize",
    ),
    "dropout10": (
        _m(10, 5, "(float[2,3] x) => (float[2,3] y)", "y = Dropout<ratio=0.3>(x)"),
        "rewrote Dropout ratio to input",
    ),
    "batchnorm7": (
        _m(
            7,
            3,
            "(float[1,2,3] x, float[2] s, float[2] b, float[2] m) => (float[1,2,3] y)",
            "v = Constant<value=float[2] {2.0,0.5}>() y = BatchNormalization<spatial=1, epsilon=0.001>(x,s,b,m,v)",
        ),
        "removed BatchNormalization spatial attribute",
    ),
    "slice9": (
        _m(9, 4, "(float[4,6] x) => (float[2,3] y)", "y = Slice<starts=[1,2], ends=[3,5], axes=[0,1]>(x)"),
        "rewrote Slice starts/ends/axes to inputs",
    ),
    "topk9": (
        _m(9, 4, "(float[3,6] x) => (float[3,2] v, int64[3,2] i)", "v, i = TopK<k=2>(x)"),
        "rewrote TopK k to input",
    ),
    "reducemean12_to18": (
        _m(12, 7, "(float[2,3,4] x) => (float[2,4] y)", "y = ReduceMean<axes=[1], keepdims=0>(x)"),
        "rewrote ReduceMean axes to input",
    ),
}


@pytest.mark.parametrize("use_converter", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_small_models(case, use_converter):
    text, label = CASES[case]
    model = onnx.parser.parse_model(text)
    target = 18 if case.endswith("to18") else 17
    _, result = _upgrade(OpsetUpgradePass(target, use_converter=use_converter), model)
    if not use_converter:
        assert result.changes.counts[label] == 1


@pytest.mark.parametrize("case", ["upsample9_linear", "resize10_linear"])
def test_converter_result_with_wrong_numbers_is_rejected(case):
    """onnx's converter keeps Resize's default half_pixel coordinates: outputs change, so the adapters run."""
    op = "Upsample" if case.startswith("upsample") else "Resize"
    opset = 9 if op == "Upsample" else 10
    text = _m(
        opset,
        5,
        "(float[1,1,3,3] x) => (float[1,1,6,6] y)",
        f's = Constant<value=float[4] {{1,1,2,2}}>() y = {op}<mode="linear">(x, s)',
    )
    proto, result = _upgrade(OpsetUpgradePass(17), onnx.parser.parse_model(text))
    (miss,) = result.changes.misses
    assert miss.startswith("onnx version converter: output 'y' differs from the original")
    assert f"rewrote {op}-{opset} as Resize x1" in miss
    (resize,) = proto.graph.node[1:]
    attrs = {a.name: a.s.decode() for a in resize.attribute}
    assert attrs == {"mode": "linear", "coordinate_transformation_mode": "asymmetric"}


FUNCTION_MODEL = """<ir_version: 8, opset_import: ["" : 12, "local": 1]>
g (float[1,3,4] x, bool c) => (float[3,4] y, float[3,4] z) {
  y = local.F(x)
  z = If(c) <then_branch = t () => (float[3,4] a) { a = Squeeze<axes=[0]>(x) },
             else_branch = e () => (float[3,4] b) { n = Neg(x) b = Squeeze<axes=[0]>(n) }>
}
<domain: "local", opset_import: ["" : 12]>
F (a) => (b) { s = Squeeze<axes=[0]>(a) b = Softmax<axis=0>(s) }"""


def test_functions_and_subgraphs():
    """The converter drops local functions (ORT cannot load its result); the adapters rewrite them."""
    proto, result = _upgrade(OpsetUpgradePass(17), onnx.parser.parse_model(FUNCTION_MODEL))
    (miss,) = result.changes.misses
    assert "onnx version converter" in miss and "local:F" in miss
    assert result.changes.counts["rewrote Squeeze axes to input"] == 3
    (func,) = proto.functions
    assert [o.version for o in func.opset_import if o.domain == ""] == [17]
    assert [n.op_type for n in func.node] == ["Constant", "Squeeze", "Flatten", "Softmax", "Shape", "Reshape"]


# -- ONNX backend test models (files shipped in the onnx wheel, with reference outputs) --------------
BACKEND_CASES = [
    "pytorch-operator/test_operator_pad",
    "pytorch-operator/test_operator_clip",
    "pytorch-operator/test_operator_chunk",
    "pytorch-operator/test_operator_index",
    "pytorch-operator/test_operator_reduced_sum_keepdim",
    "pytorch-operator/test_operator_reduced_mean",
    "pytorch-converted/test_ConstantPad2d",
    "pytorch-converted/test_ReflectionPad2d",
    "pytorch-converted/test_log_softmax_dim3",
    "pytorch-converted/test_softmax_functional_dim3",
    "pytorch-converted/test_MaxPool2d_stride_padding_dilation",
]


def _backend_case(rel: str) -> tuple[onnx.ModelProto, list[np.ndarray], list[np.ndarray]]:
    folder = BACKEND_DATA / rel
    data = folder / "test_data_set_0"
    read = lambda kind: [  # noqa: E731
        onnx.numpy_helper.to_array(onnx.load_tensor(str(p))) for p in sorted(data.glob(f"{kind}_*.pb"))
    ]
    return onnx.load(str(folder / "model.onnx")), read("input"), read("output")


def _assert_reference(model: onnx.ModelProto, inputs, outputs) -> None:
    names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    got = run_ort(model, dict(zip(names, inputs, strict=True)))
    for (name, actual), expected in zip(got.items(), outputs, strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-3, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("use_converter", [False, True])
@pytest.mark.parametrize("rel", BACKEND_CASES)
def test_backend_models(rel, use_converter):
    model, inputs, outputs = _backend_case(rel)
    pass_ = OpsetUpgradePass(17, use_converter=use_converter)
    result = pass_(to_ir(model))
    proto = to_proto(result.model)
    assert default_opset(proto) == 17
    onnx.checker.check_model(proto, full_check=True)
    _assert_reference(proto, inputs, outputs)


#: Node tests the onnx package builds in memory at a low opset (the node/ data folder is not shipped).
NODE_CASES = ["test_upsample_nearest", "test_scatter_with_axis", "test_scatter_without_axis",
              "test_dropout_default_old", "test_scan9_sum", "test_loop11"]  # fmt: skip


@pytest.fixture(scope="module")
def node_cases():
    import onnx.backend.test.case.node as cases

    for module in ("upsample", "scatter", "dropout", "scan", "loop"):
        importlib.import_module(f"onnx.backend.test.case.node.{module}")
    return {c.name: c for c in cases._NodeTestCases}


@pytest.mark.parametrize("use_converter", [False, True])
@pytest.mark.parametrize("name", NODE_CASES)
def test_backend_node_cases(node_cases, name, use_converter):
    case = node_cases[name]
    assert default_opset(case.model) < 13
    result = OpsetUpgradePass(13, use_converter=use_converter)(to_ir(case.model))
    proto = to_proto(result.model)
    assert default_opset(proto) == 13
    (inputs, outputs), *_ = case.data_sets
    _assert_reference(proto, inputs, outputs)


# -- refusals ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", [7, 12, 24, "17"])
def test_target_out_of_range(target):
    with pytest.raises(OptionError, match=r"target_opset=.* give an opset from 13 to 23"):
        OpsetUpgradePass(target)


def test_bad_shapes_option_is_an_error():
    text, _ = CASES["clip10"]
    with pytest.raises(OptionError, match="opset-upgrade: input shape x:2,7 does not fit"):
        OpsetUpgradePass(17, shapes={"x": (2, 7)})(to_ir(onnx.parser.parse_model(text)))


def test_model_at_or_above_target_is_left_alone(ppocr):
    model, _ = ppocr["ppocr_cls"]
    ir_model = to_ir(onnx.ModelProto.FromString(model.SerializeToString()))
    assert OpsetUpgradePass(17)(ir_model).modified
    for target, misses in [(17, []),
                           (13, ["model is at opset 17, above the target 13; left unchanged (no downgrade)"])]:  # fmt: skip
        result = OpsetUpgradePass(target)(ir_model)
        assert not result.modified and result.changes.misses == misses
        assert default_opset(ir_model) == 17


REFUSED = {
    "scan8": (None, "test_scan_sum", "Scan-8 (batched, with sequence_lens) has no adapter"),
    "batchnorm_spatial0": (
        _m(7, 3, "(float[1,2,3] x, float[2,3] s, float[2,3] b, float[2,3] m, float[2,3] v) => (float[1,2,3] y)",
           "y = BatchNormalization<spatial=0>(x,s,b,m,v)"),
        None,
        "spatial=0 (per-activation statistics) has no equivalent from opset 9 on",
    ),
    "dropout_mask_used": (
        _m(7, 3, "(float[2,3] x) => (float[2,3] y, float[2,3] mask)", "y, mask = Dropout<ratio=0.5>(x)"),
        None,
        "its mask output is used and changes type from the data type to bool at opset 10",
    ),
    "resize10_dynamic_nearest": (
        _m(10, 5, "(float[1,1,4,4] x, float[4] s) => (float[1,1,8,8] y)", 'y = Resize<mode="nearest">(x, s)'),
        None,
        "nearest mode with non-constant scales",
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("case", "use_converter"),
    [(c, False) for c in REFUSED] + [(c, True) for c in REFUSED if c != "resize10_dynamic_nearest"],
)
def test_refusals_leave_the_model_unchanged(node_cases, case, use_converter):
    text, node_case, reason = REFUSED[case]
    model = onnx.parser.parse_model(text) if text else node_cases[node_case].model
    ir_model = to_ir(onnx.ModelProto.FromString(model.SerializeToString()))
    before = to_proto(ir_model).SerializeToString()
    with pytest.raises(PassFailedError, match="cannot upgrade opset") as info:
        OpsetUpgradePass(17, use_converter=use_converter)(ir_model)
    assert reason in str(info.value) and "node (unnamed)" in str(info.value)
    if use_converter:
        assert "onnx version converter:" in str(info.value)
    assert to_proto(ir_model).SerializeToString() == before


def test_opset6_op_changed_at_7_needs_the_converter():
    """PRelu changed at opset 7: the adapters refuse it and the converter's result fails in ORT."""
    model, _, _ = _backend_case("pytorch-converted/test_PReLU_1d_multiparam")
    with pytest.raises(PassFailedError) as info:
        OpsetUpgradePass(17)(to_ir(model))
    message = str(info.value)
    assert "onnx version converter: onnxruntime failed to run the model" in message
    assert "PRelu changed at opset 7 and zonnx's adapters start at opset 7" in message


def test_verification_uses_the_reference_evaluator_for_ops_ort_lacks():
    """ORT cannot load BatchNormalization-6; the reference evaluator checks the converter's result."""
    model, inputs, outputs = _backend_case("pytorch-converted/test_BatchNorm2d_eval")
    with pytest.raises(Exception, match="onnxruntime cannot load"):
        run_ort(model, make_inputs(model))
    result = OpsetUpgradePass(17)(to_ir(model))
    assert result.changes.misses == []
    _assert_reference(to_proto(result.model), inputs, outputs)


def test_unverifiable_converter_result_is_reported():
    """Random scales make the original fail in ORT: the converter's result is taken, with a note."""
    text, _, _ = REFUSED["resize10_dynamic_nearest"]
    result = OpsetUpgradePass(17)(to_ir(onnx.parser.parse_model(text)))
    (miss,) = result.changes.misses
    assert miss.startswith("outputs not compared: the original fails on generated inputs")
    assert default_opset(result.model) == 17
