"""The jackknife comparison of two candidates on the same samples (``zonnx.quantization.search.noise``)."""

from __future__ import annotations

import numpy as np
import pytest

import zonnx
from tests.helpers import digits_feeds
from zonnx import zoo
from zonnx.build_npu import target_quantize_kwargs
from zonnx.metrics.evaluate import FloatReference
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.search.noise import MAX_GROUPS, Z, paired_difference


@pytest.fixture(scope="module")
def digits_pof2():
    """The digits CNN, float and quantized for dpu-b4096 (power-of-two per tensor, no bias correction),
    with the float reference on 30 samples the quantizer did not calibrate on."""
    src = zoo.get("digits_cnn")
    kwargs = target_quantize_kwargs("dpu-b4096")
    kwargs["extra_options"]["BiasCorrection"] = False
    quant = zonnx.quantize_static(src, None, ListReader(digits_feeds(8)), **kwargs).model
    return src, quant


def test_on_one_position_per_sample_the_jackknife_is_the_standard_error_of_the_mean(digits_pof2) -> None:
    """top1 with one position per sample is a mean over samples; leaving one sample out at a time (30
    samples, 30 groups), the jackknife standard error of a mean difference is s / sqrt(n) exactly."""
    src, quant = digits_pof2
    reference = FloatReference(src, digits_feeds(30, 200), "top1", src)
    floats, quants = reference.outputs, reference.run(quant)
    diff = paired_difference(reference, floats, quants)
    per_sample = np.array(
        [float(np.argmax(q[0]) == np.argmax(f[0])) for f, q in zip(floats, quants, strict=True)]
    )
    d = 1.0 - per_sample  # float against itself scores 1 on every sample
    assert diff.groups == 30
    assert diff.difference == pytest.approx(d.mean())
    assert diff.standard_error == pytest.approx(d.std(ddof=1) / np.sqrt(len(d)))
    assert diff.beyond_noise == (d.mean() > Z * d.std(ddof=1) / np.sqrt(len(d)))


def test_identical_outputs_differ_by_nothing_and_not_beyond_noise(digits_pof2) -> None:
    src, quant = digits_pof2
    reference = FloatReference(src, digits_feeds(12, 200), "cosine", src)
    outputs = reference.run(quant)
    diff = paired_difference(reference, outputs, [list(o) for o in outputs])
    assert diff.difference == 0 and diff.standard_error == 0 and not diff.beyond_noise


def test_groups_are_capped_and_a_clear_gap_is_beyond_noise(digits_pof2) -> None:
    """64 samples go into ``MAX_GROUPS`` groups; the float model against the quantized one on cosine (a
    gap every sample shows) is beyond the noise, and the reverse comparison is not."""
    src, quant = digits_pof2
    reference = FloatReference(src, digits_feeds(64, 100), "cosine", src)
    quants = reference.run(quant)
    ahead = paired_difference(reference, reference.outputs, quants)
    assert ahead.groups == MAX_GROUPS and np.isfinite(ahead.standard_error)
    assert ahead.difference > 0 and ahead.beyond_noise
    behind = paired_difference(reference, quants, reference.outputs)
    assert behind.difference == pytest.approx(-ahead.difference) and not behind.beyond_noise


def test_outputs_for_other_samples_are_refused(digits_pof2) -> None:
    src, _ = digits_pof2
    reference = FloatReference(src, digits_feeds(4, 200), "cosine", src)
    with pytest.raises(ValueError, match="outputs for 3"):
        paired_difference(reference, reference.outputs[:3], reference.outputs)
