"""ONNX frontend on the PP-OCR models (real models the project did not write): clean-up, fixed and named
dims, subgraph cuts checked against the original's intermediate tensors, and bad names and shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.converters.test_from_torch import assert_valid, cosine
from zonnx import zoo
from zonnx.converters.common import ConversionError
from zonnx.converters.from_onnx import cut_model, from_onnx, set_input_dims
from zonnx.errors import OptionError

#: A depthwise conv in the middle of the PP-OCRv4 detection backbone, and one later in the FPN neck.
MID = "depthwise_conv2d_9.tmp_0"
LATE = "conv2d_490.tmp_0"


@pytest.fixture(scope="module")
def det() -> Path:
    return zoo.get("ppocr_det")


def dims(vi: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]


def run(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], outputs: list[str] | None = None
) -> list[np.ndarray]:
    proto = onnx.ModelProto.FromString(model.SerializeToString())
    present = {o.name for o in proto.graph.output}
    proto.graph.output.extend(
        onnx.helper.make_empty_tensor_value_info(n) for n in outputs or [] if n not in present
    )
    proto.ir_version = min(proto.ir_version, 13)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(outputs, feeds)


def test_ppocr_det_with_named_dims_on_real_images(det: Path) -> None:
    samples = zoo.sample_inputs("ppocr_det", 2)
    result = from_onnx(det, input_shapes={"x": (1, 3, "height", "width")}, check_inputs=samples)
    model = assert_valid(result, ["x"], ["sigmoid_0.tmp_0"])
    assert dims(model.graph.input[0]) == [1, 3, "height", "width"]
    assert result.info.framework == "onnx" and result.info.framework_version.startswith("opset 12")
    assert {i.domain: i.version for i in model.opset_import}[""] == 17
    assert len(model.graph.node) < len(onnx.load(det).graph.node)
    assert result.checks[0].cosine > 0.9999
    feeds = {"x": samples[1]["x"]}
    assert cosine(run(model, feeds)[0], run(onnx.load(det), feeds)[0]) > 0.99999


def test_ppocr_rec_cleaned_and_checked() -> None:
    result = from_onnx(zoo.get("ppocr_rec"), check_inputs=zoo.sample_inputs("ppocr_rec", 2))
    assert_valid(result, ["x"], ["softmax_11.tmp_0"])
    assert result.checks[0].cosine > 0.9999


def test_cut_at_outputs_matches_the_original_intermediate(det: Path) -> None:
    result = from_onnx(det, outputs=[MID], input_shapes={"x": (1, 3, 96, 96)})
    model = assert_valid(result, ["x"], [MID])
    assert dims(model.graph.output[0]) == [1, 192, 6, 6]
    assert len(model.graph.node) < 200
    x = np.random.default_rng(0).standard_normal((1, 3, 96, 96)).astype(np.float32)
    want = run(onnx.load(det), {"x": x}, [MID])[0]
    np.testing.assert_allclose(run(model, {"x": x})[0], want, rtol=1e-4, atol=1e-5)


def test_cut_between_two_tensors(det: Path) -> None:
    result = from_onnx(det, inputs=[MID], outputs=[LATE], input_shapes={"x": (1, 3, 64, 64)})
    model = assert_valid(result, [MID], [LATE])
    assert result.checks[0].cosine > 0.9999
    x = np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype(np.float32)
    mid, late = run(onnx.load(det), {"x": x}, [MID, LATE])
    np.testing.assert_allclose(run(model, {MID: mid})[0], late, rtol=1e-4, atol=1e-4)


def test_set_input_dims_renames_output_symbols() -> None:
    model = onnx.load(zoo.get("ppocr_cls"))
    fixed = set_input_dims(model, {"x": (4, 3, 48, 192)})
    assert dims(fixed.graph.input[0]) == [4, 3, 48, 192]
    with pytest.raises(OptionError, match=r"x:1,1,48,192 does not fit the model's input 'x'"):
        set_input_dims(model, {"x": (1, 1, 48, 192)})
    with pytest.raises(OptionError, match=r"'image'.*inputs are \['x'\]"):
        set_input_dims(model, {"image": (1, 3, 48, 192)})


@pytest.mark.parametrize(
    ("inputs", "outputs", "fragment"),
    [
        (None, ["depthwise_conv2d_9.tmp"], "Did you mean 'depthwise_conv2d_9.tmp_0'"),
        ([LATE], [MID], f"['{LATE}'] are not needed to compute"),
    ],
)
def test_bad_cut_names(det: Path, inputs: list[str] | None, outputs: list[str], fragment: str) -> None:
    with pytest.raises(OptionError) as info:
        cut_model(onnx.load(det), inputs, outputs, shapes={"x": (1, 3, 64, 64)})
    assert fragment in str(info.value)


def test_a_test_input_the_original_cannot_run_is_an_error_not_dropped() -> None:
    """The check never covers fewer --test-input samples than given: one the source fails on is an error."""
    model = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 12] x) => (float[1, 12] y) {
            shape = Constant <value = int64[2] {1, 12}> ()
            y = Reshape (x, shape)
        }
        """
    )
    ok = {"x": np.ones((1, 12), np.float32)}
    assert len(from_onnx(model, check_inputs=[ok, ok]).checks) >= 1
    with pytest.raises(ConversionError, match="does not run on test input 2"):
        from_onnx(model, check_inputs=[ok, {"x": np.ones((2, 12), np.float32)}])
