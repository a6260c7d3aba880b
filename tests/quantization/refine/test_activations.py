"""Tests for refine-leaky-relu (slope 26/256) and refine-avgpool-factor (the NPU's multiply+shift mean)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from tests.quantization.refine import (
    FORMS,
    SmallCNN,
    cnn,
    export,
    grid_mismatches,
    in_key,
    node_of,
    out_key,
    positions,
    quantized_forms,
    refine_copy,
    run,
    set_positions,
)
from zonnx.ir.io import to_ir
from zonnx.quantization.refine.avgpool import FACTOR_KEY, AvgPoolFactorPass
from zonnx.quantization.refine.leaky_relu import ORIGINAL_ALPHA, LeakyReluSlopePass
from zonnx.quantization.refine.pool import AlignPoolPass


@pytest.mark.parametrize("form", FORMS)
def test_leaky_relu_alpha_becomes_26_over_256(form: str) -> None:
    m = cnn()
    model = m.form(form)
    after, counts, misses = refine_copy(LeakyReluSlopePass("dpu-b4096"), model)
    assert counts == {"LeakyRelu alpha 0.1 -> 26/256": 1} and misses == []
    node = node_of(after, "LeakyRelu")
    assert (
        node.attributes.get_float("alpha") == 0.1015625
        and node.metadata_props[ORIGINAL_ALPHA] == "0.10000000149011612"
    )
    assert positions(after) == positions(model)
    x_name, y_name = node.inputs[0].name, node.outputs[0].name
    values = run(after, m.feeds[0], [x_name, y_name])
    x = values[x_name]
    assert (x < 0).sum() > 100
    assert np.array_equal(values[y_name], np.where(x < 0, x * np.float32(0.1015625), x))
    expected = onnx.ModelProto.FromString(model.SerializeToString())
    for n in expected.graph.node:
        if n.op_type == "LeakyRelu":
            n.attribute[0].f = 0.1015625
    assert np.array_equal(run(after, m.feeds[1])["y"], run(expected, m.feeds[1])["y"])
    assert grid_mismatches(after, m.feeds[1]) == []


def test_other_slopes_stay_and_are_reported(tmp_path) -> None:
    models = quantized_forms(
        export(SmallCNN(alpha=0.2), torch.randn(1, 3, 16, 16), tmp_path / "a02.onnx"), cnn().feeds, tmp_path
    )
    after, counts, misses = refine_copy(LeakyReluSlopePass("dpu-b4096"), models.fixneuron)
    assert counts == {}
    assert misses == [
        "/lrelu/LeakyRelu: alpha 0.2 is not a hardware slope (26/256); left alone (it will not run on the NPU)"
    ]
    assert node_of(after, "LeakyRelu").attributes.get_float("alpha") == pytest.approx(0.2)
    _, counts, misses = refine_copy(LeakyReluSlopePass("bm1684x"), cnn().fixneuron)
    assert counts == {} and misses == ["target bm1684x: no leaky_relu rule; nothing to refine"]


@pytest.mark.parametrize("form", FORMS)
def test_average_pools_get_the_npu_factor(form: str) -> None:
    m = cnn()
    model = m.form(form)
    after, counts, misses = refine_copy(AvgPoolFactorPass("dpu-b4096"), model)
    assert counts == {
        "AveragePool /avg/AveragePool 3x3: NPU factor 7/2^6 (mean x 0.984375)": 1,
        "GlobalAveragePool /GlobalAveragePool 6x6: NPU factor 7/2^8 (mean x 0.984375)": 1,
    }
    assert misses == []
    work = to_ir(onnx.ModelProto.FromString(after.SerializeToString()))
    for op in ("AveragePool", "GlobalAveragePool"):
        pool = node_of(work, op)
        (mul,) = pool.outputs[0].consumers()
        assert mul.op_type == "Mul" and mul.metadata_props["zonnx.refine"] == "avgpool_factor"
        assert pool.metadata_props[FACTOR_KEY] == {"AveragePool": "7/2^6", "GlobalAveragePool": "7/2^8"}[op]
        assert mul.inputs[1].const_value.numpy() == np.float32(0.984375)
        values = run(after, m.feeds[0], [pool.outputs[0].name, mul.outputs[0].name])
        assert np.array_equal(
            values[mul.outputs[0].name], values[pool.outputs[0].name] * np.float32(0.984375)
        )
    assert positions(after) == positions(model)
    assert grid_mismatches(after, m.feeds[0]) == []
    y_before, y_after = run(model, m.feeds[0])["y"], run(after, m.feeds[0])["y"]
    assert not np.array_equal(y_before, y_after) and np.abs(y_after - y_before).max() < 0.05


def test_pool_alignment_sees_through_the_factor() -> None:
    m = cnn()
    avg_out = out_key(m.qdq, "AveragePool")
    model = set_positions(m.qdq, {avg_out: 7})
    scaled, _, _ = refine_copy(AvgPoolFactorPass("dpu-b4096"), model)
    after, counts, _ = refine_copy(AlignPoolPass("dpu-b4096"), scaled)
    assert counts == {"aligned AveragePool /avg/AveragePool to pos 5": 1}
    assert positions(after)[avg_out] == positions(after)[in_key(m.qdq, "AveragePool")] == 5


def test_global_pool_without_shapes_is_reported() -> None:
    proto = onnx.ModelProto.FromString(cnn().fixneuron.SerializeToString())
    del proto.graph.value_info[:]
    _, counts, misses = refine_copy(AvgPoolFactorPass("dpu-b4096"), proto)
    assert list(counts) == ["AveragePool /avg/AveragePool 3x3: NPU factor 7/2^6 (mean x 0.984375)"]
    assert misses == [
        "/GlobalAveragePool: input '/Sigmoid_output_0_DequantizeLinear_Output' has no static 4-D shape "
        "(None); run shape-inference first"
    ]
