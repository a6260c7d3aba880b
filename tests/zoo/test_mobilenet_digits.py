"""The trained MobileNetV2 zoo entry, checked without training it (training takes minutes: bench/ does it)."""

from __future__ import annotations

import numpy as np

from zonnx import zoo
from zonnx.zoo import mobilenet_digits
from zonnx.zoo.digits import digits_data
from zonnx.zoo.torch_models import IMAGENET_MEAN, IMAGENET_STD


def test_entry_is_registered_as_trained_here():
    entry = zoo.ZOO["mobilenetv2_digits"]
    assert zoo.provenance("mobilenetv2_digits") == "trained here"
    assert entry.builder == "zonnx.zoo.mobilenet_digits:build_mobilenetv2_digits"
    assert "trained here" in entry.description and "1x3x32x32" in entry.description


def test_inputs_are_upscaled_test_digits_in_imagenet_normalization():
    feeds = zoo.sample_inputs("mobilenetv2_digits", 3, seed=2)
    x_te, _ = digits_data("test")
    everyone = mobilenet_digits.upscale(x_te)
    for feed in feeds:
        x = feed["input"]
        assert x.shape == (1, 3, 32, 32) and x.dtype == np.float32
        grey = x[0] * IMAGENET_STD[:, None, None] + IMAGENET_MEAN[:, None, None]  # back to [0, 1] grey
        np.testing.assert_allclose(grey[0], grey[2], atol=1e-6)
        assert grey.min() >= -1e-6 and grey.max() <= 1 + 1e-6
        # the image is one of the 450 test digits, upscaled (the sample is a real held-out image)
        assert (np.abs(everyone - x).reshape(450, -1).max(axis=1) == 0).any()
        # block means of the upscaled image stay close to the 8x8 digit (bilinear blur only)
        small = grey[0].reshape(8, 4, 8, 4).mean(axis=(1, 3))
        assert np.abs(x_te[:, 0] - small).reshape(450, -1).max(axis=1).min() < 0.35


def test_upscale_keeps_blank_pixels_at_the_normalized_zero():
    x = np.zeros((2, 1, 8, 8), dtype=np.float32)
    out = mobilenet_digits.upscale(x)
    assert out.shape == (2, 3, 32, 32)
    np.testing.assert_allclose(out[0, :, 5, 5], -IMAGENET_MEAN / IMAGENET_STD, rtol=1e-6)
