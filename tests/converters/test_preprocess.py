"""Folded preprocessing: raw uint8 NHWC BGR (and gray) camera images in, checked against the unfolded model
plus the numpy reference, and the numpy reference itself checked against a per-pixel hand computation."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from tests.converters.test_from_torch import SmallCNN
from zonnx.converters.common import ConversionError
from zonnx.converters.from_torch import from_torch
from zonnx.converters.preprocess import (
    Preprocess,
    check_preprocessing,
    fold_preprocessing,
    reference_preprocess,
)
from zonnx.errors import OptionError

MEAN = (123.675, 116.28, 103.53)
SCALE = (0.0171, 0.0175, 0.0174)


@pytest.fixture(scope="module")
def cnn() -> onnx.ModelProto:
    torch.manual_seed(0)
    return from_torch(SmallCNN().eval(), torch.randn(1, 3, 16, 16), dynamic_axes={"image": {0: "N"}}).model


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]


def shape_of(model: onnx.ModelProto) -> list[int | str]:
    return [d.dim_value or d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim]


def test_reference_preprocess_bgr_nhwc_per_pixel() -> None:
    raw = np.random.default_rng(0).integers(0, 256, (1, 2, 3, 3)).astype(np.uint8)
    x = reference_preprocess(raw, mean=MEAN, scale=SCALE, pixel_format="bgr", layout="nhwc")
    assert x.shape == (1, 3, 2, 3) and x.dtype == np.float32
    b, g, r = (float(v) for v in raw[0, 1, 2])
    expected = [(r - MEAN[0]) * SCALE[0], (g - MEAN[1]) * SCALE[1], (b - MEAN[2]) * SCALE[2]]
    np.testing.assert_allclose(x[0, :, 1, 2], expected, rtol=1e-6)


def test_uint8_nhwc_bgr_folded(cnn: onnx.ModelProto) -> None:
    folded = fold_preprocessing(
        cnn, mean=MEAN, scale=SCALE, pixel_format="bgr", layout="nhwc", input_dtype="uint8"
    )
    onnx.checker.check_model(folded, full_check=True)
    assert folded.graph.input[0].name == "image" and shape_of(folded) == ["N", 16, 16, 3]
    assert folded.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8
    assert [n.op_type for n in folded.graph.node[:5]] == ["Cast", "Transpose", "Gather", "Mul", "Add"]
    raw = np.random.default_rng(1).integers(0, 256, (2, 16, 16, 3)).astype(np.uint8)
    want = run(
        cnn, {"image": reference_preprocess(raw, mean=MEAN, scale=SCALE, pixel_format="bgr", layout="nhwc")}
    )
    got = run(folded, {"image": raw})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    checks = check_preprocessing(
        cnn, folded, Preprocess(MEAN, SCALE, "bgr", "nhwc", "uint8"), input_name="image"
    )
    assert checks[0].cosine > 0.9999


def test_gray_input_repeats_one_channel(cnn: onnx.ModelProto) -> None:
    folded = fold_preprocessing(cnn, mean=(127.5,), scale=(1 / 127.5,), pixel_format="gray")
    assert shape_of(folded) == ["N", 1, 16, 16]
    raw = np.random.default_rng(2).integers(0, 256, (1, 1, 16, 16)).astype(np.float32)
    want = run(cnn, {"image": np.repeat((raw - 127.5) / 127.5, 3, axis=1).astype(np.float32)})
    np.testing.assert_allclose(run(folded, {"image": raw}), want, rtol=1e-4, atol=1e-5)


def test_identity_preprocessing_adds_nothing(cnn: onnx.ModelProto) -> None:
    assert len(fold_preprocessing(cnn).graph.node) == len(cnn.graph.node)


def test_wrong_preprocessing_is_caught(cnn: onnx.ModelProto) -> None:
    folded = fold_preprocessing(
        cnn, mean=MEAN, scale=SCALE, pixel_format="rgb", layout="nhwc", input_dtype="uint8"
    )
    with pytest.raises(ConversionError, match="does not match"):  # checked as if the camera gave BGR
        check_preprocessing(cnn, folded, Preprocess(MEAN, SCALE, "bgr", "nhwc", "uint8"), input_name="image")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"mean": (1.0, 2.0)}, "--mean has 2 values; the model's input has 3 channels"),
        ({"pixel_format": "bgra"}, "--pixel-format 'bgra': choose one of rgb, bgr, gray"),
        ({"layout": "hwc"}, "--layout 'hwc'"),
        ({"scale": (0.0,)}, "a scale of 0"),
        ({"input_name": "img"}, "--preprocess-input 'img'"),
    ],
)
def test_bad_options(cnn: onnx.ModelProto, kwargs: dict, fragment: str) -> None:
    with pytest.raises(OptionError) as info:
        fold_preprocessing(cnn, **kwargs)
    assert fragment in str(info.value)


def test_nhwc_model_needs_no_transpose() -> None:
    """A model whose input is NHWC (TensorFlow style): raw NHWC images fold in with Cast/Gather/Mul/Add only."""
    model = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 8, 8, 3] x) => (float[N, 8, 8, 3] y) {
            y = Mul(x, x)
        }
        """
    )
    folded = fold_preprocessing(
        model, mean=MEAN, scale=SCALE, pixel_format="bgr", layout="nhwc", input_dtype="uint8"
    )
    assert [n.op_type for n in folded.graph.node] == ["Cast", "Gather", "Mul", "Add", "Mul"]
    raw = np.random.default_rng(3).integers(0, 256, (2, 8, 8, 3)).astype(np.uint8)
    x = reference_preprocess(
        raw, mean=MEAN, scale=SCALE, pixel_format="bgr", layout="nhwc", model_layout="nhwc"
    )
    assert x.shape == (2, 8, 8, 3)
    np.testing.assert_allclose(run(folded, {"x": raw}), x * x, rtol=1e-5, atol=1e-6)
