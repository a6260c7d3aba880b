"""Gated quantizers and measured sensitivity on the trained digits CNN (real ORT sessions, real quantizer)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest

import zonnx
from tests.helpers import digits_feeds
from zonnx import zoo
from zonnx.quantization.api import build_config
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.search.gated import GatedModel, output_noise
from zonnx.quantization.search.measure import measure_groups, measured_order, measured_outputs
from zonnx.verify import ort_session


@pytest.fixture(scope="module")
def quantized() -> tuple[Path, zonnx.quantization.api.QuantizeResult]:
    src = zoo.get("digits_cnn")
    return src, zonnx.quantize_static(src, None, ListReader(digits_feeds(16)), per_channel=True)


def test_all_gates_on_is_the_quantized_model_and_ratios_rescale_the_grid(quantized) -> None:
    src, result = quantized
    feeds = digits_feeds(4, 100)
    keep = {
        t for pair in result.plan.removed.values() for t in pair
    }  # quantizers that do a removed Relu's job
    gated = GatedModel(result.model, known=list(result.plan.tensors), keep=keep)
    activations = [n for n, tp in result.plan.tensors.items() if tp.role.name == "ACTIVATION"]
    assert set(gated.units) <= set(activations) and len(gated.units) >= 4
    sess = ort_session(result.model)
    written = [list(sess.run(None, f)) for f in feeds]
    on = gated.run(feeds)
    assert all(
        np.array_equal(a, b) for wa, ga in zip(written, on, strict=True) for a, b in zip(wa, ga, strict=True)
    )
    reference = [list(ort_session(src).run(None, f)) for f in feeds]
    off = gated.run(feeds, on=[])  # only the weights quantized: closer to float than the quantized model
    assert output_noise(reference, off) < output_noise(reference, on)
    # a ratio of 64 on every activation makes each grid 64x coarser: far more noise than as written
    coarse = gated.run(feeds, ratios={n: 64.0 for n in gated.units})
    assert output_noise(reference, coarse) > 10 * output_noise(reference, on)


def test_raising_the_measured_top_groups_to_int16_helps_more_than_the_bottom_ones(quantized) -> None:
    src, result = quantized
    feeds = digits_feeds(2, 200)
    sens = measure_groups(
        result.model, result.prepared, result.plan.groups(), result.plan.quantized_nodes, feeds
    )
    assert len(sens) == len(result.plan.groups()) and all(s.noise >= 0 for s in sens)
    assert all(set(s.owners) <= set(result.plan.quantized_nodes) for s in sens)
    ranked = sorted((s for s in sens if s.noise > 0), key=lambda s: -s.noise)
    assert ranked[0].noise > 10 * ranked[-1].noise
    order = measured_order(sens)
    assert order[: len(ranked[0].owners)] == ranked[0].owners

    def noise_with(nodes: list[str]) -> float:
        cfg = dataclasses.replace(
            build_config(per_channel=True), node_overrides={n: {"activation_type": "int16"} for n in nodes}
        )
        model = zonnx.quantize_static(src, None, ListReader(digits_feeds(16)), config=cfg).model
        test = digits_feeds(32, 220)
        ref = [list(ort_session(src).run(None, f)) for f in test]
        return output_noise(ref, [list(ort_session(model).run(None, f)) for f in test])

    top = [n for s in ranked[:2] for n in s.owners]
    bottom = [n for s in ranked[-2:] for n in s.owners]
    assert noise_with(top) < noise_with(bottom)


def test_a_softmax_output_is_measured_on_its_logits() -> None:
    model = onnx.parser.parse_model(
        """<ir_version: 8, opset_import: ["" : 13]>
        g (float[1, 4] x) => (float[1, 4] p) {
            z = Relu(x)
            s = Softmax(z)
            p = Reshape(s, shape)
        }"""
    )
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1, 4], np.int64), "shape"))
    assert measured_outputs(model) == ["z"]


def test_an_unknown_search_order_is_one_clear_error(tmp_path: Path) -> None:
    from zonnx.errors import OptionError
    from zonnx.quantization.search.run import quantize_with_budget

    with pytest.raises(OptionError, match=r"--search-order 'noisiest': use one of report, measured"):
        quantize_with_budget(
            zoo.get("digits_cnn"),
            tmp_path / "q.onnx",
            digits_feeds(8),
            build_config(),
            budget=1,
            order_by="noisiest",
        )
    assert not (tmp_path / "q.onnx").exists()
