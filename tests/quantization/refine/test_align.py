"""Tests for refine-align-concat and refine-align-pool: power-of-two and float-scale targets."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

from tests.quantization.refine import (
    FORMS,
    FeedReader,
    cnn,
    grid_mismatches,
    in_key,
    out_key,
    positions,
    refine_copy,
    run,
    set_positions,
)
from zonnx.ir.io import to_ir
from zonnx.quantization.refine.concat import AlignConcatPass
from zonnx.quantization.refine.pool import AlignPoolPass
from zonnx.quantization.refine.positions import QuantGraph


def _refine(
    pass_cls: type, target: str, model: onnx.ModelProto
) -> tuple[onnx.ModelProto, dict[str, int], list[str]]:
    return refine_copy(pass_cls(target), model)


@pytest.mark.parametrize("form", FORMS)
def test_concat_inputs_and_output_go_to_the_smallest_position(form: str) -> None:
    m = cnn()
    base = m.form(form)
    in0, in1, out = in_key(base, "Concat", 0), in_key(base, "Concat", 1), out_key(base, "Concat")
    model = set_positions(base, {in0: 6, in1: 4, out: 5})
    before = positions(model)
    after, counts, misses = _refine(AlignConcatPass, "dpu-b4096", model)
    assert counts == {"aligned Concat /Concat to pos 4": 2} and misses == []
    assert positions(after) == {**before, in0: 4, out: 4}
    expected = set_positions(model, {in0: 4, out: 4})
    for feeds in m.feeds[:2]:
        assert np.array_equal(run(after, feeds)["y"], run(expected, feeds)["y"])
    assert grid_mismatches(after, m.feeds[0]) == []


@pytest.mark.parametrize("form", FORMS)
def test_pool_input_and_output_share_the_smaller_position(form: str) -> None:
    m = cnn()
    base = m.form(form)
    pool_in, pool_out = in_key(base, "MaxPool"), out_key(base, "MaxPool")
    avg_in, avg_out = in_key(base, "AveragePool"), out_key(base, "AveragePool")
    gap_in, gap_out = in_key(base, "GlobalAveragePool"), out_key(base, "GlobalAveragePool")
    assert positions(base)[pool_in] == 5 and positions(base)[gap_in] == 7
    model = set_positions(base, {pool_out: 3, avg_out: 6, gap_in: 9})
    before = positions(model)
    after, counts, _ = _refine(AlignPoolPass, "dpu-b4096", model)
    assert counts == {
        "aligned MaxPool /pool/MaxPool to pos 3": 1,
        "aligned AveragePool /avg/AveragePool to pos 5": 1,
        "aligned GlobalAveragePool /GlobalAveragePool to pos 7": 1,
    }
    assert positions(after) == {**before, pool_in: 3, avg_out: 5, gap_in: 7}
    assert before[avg_in] == 5 and before[gap_out] == 7
    expected = set_positions(model, {pool_in: 3, avg_out: 5, gap_in: 7})
    assert np.array_equal(run(after, m.feeds[2])["y"], run(expected, m.feeds[2])["y"])
    assert grid_mismatches(after, m.feeds[2]) == []


def test_a_model_that_already_satisfies_the_rules_is_left_bit_identical() -> None:
    m = cnn()
    assert (
        positions(m.fixneuron)[in_key(m.fixneuron, "Concat", 0)] == 6
    )  # ORT's calibration leaves Concat unaligned
    aligned, counts, _ = _refine(AlignConcatPass, "dpu-b4096", m.fixneuron)
    assert counts == {"aligned Concat /Concat to pos 5": 1}
    data = aligned.SerializeToString()
    for cls in (AlignConcatPass, AlignPoolPass):
        after, counts, misses = _refine(cls, "dpu-b4096", aligned)
        assert counts == {} and misses == []
        assert after.SerializeToString() == data


def test_float_symmetric_target_takes_the_largest_scale() -> None:
    m = cnn()
    model = m.ort  # onnxruntime's own scales (not powers of two)
    work = to_ir(onnx.ModelProto.FromString(model.SerializeToString()))
    graph = QuantGraph(work)
    concat = next(n for n in work.graph if n.op_type == "Concat")
    sites = [graph.input_site(v) for v in concat.inputs] + [graph.output_site(concat.outputs[0])]
    scales = [s.params()[0] for s in sites]  # type: ignore[union-attr, index]
    assert scales[0] < scales[1] == scales[2] and all(s.pos is None for s in sites)  # type: ignore[union-attr]
    after, counts, misses = _refine(AlignConcatPass, "bm1684x", model)
    assert counts == {f"aligned Concat /Concat to scale {scales[1]:.6g}": 1} and misses == []
    graph = QuantGraph(to_ir(after))
    concat = next(n for n in graph.graph if n.op_type == "Concat")
    aligned = {graph.input_site(v).params() for v in concat.inputs} | {
        graph.output_site(concat.outputs[0]).params()
    }  # type: ignore[union-attr]
    assert aligned == {(max(scales), 0, -128, 127)}
    keys = [in_key(model, "Concat", 0), in_key(model, "Concat", 1), out_key(model, "Concat")]
    expected = set_positions(model, {k: max(scales) for k in keys})
    assert np.array_equal(run(after, m.feeds[0])["y"], run(expected, m.feeds[0])["y"])
    assert grid_mismatches(after, m.feeds[0]) == []
    # ORT already gives MaxPool its input's scale: BackwardCalibration (bm1684x pool_ops) has nothing to do.
    _, counts, misses = _refine(AlignPoolPass, "bm1684x", m.ort)
    assert counts == {} and misses == []


def test_float_scales_are_refused_by_a_power_of_two_target() -> None:
    m = cnn()
    _, counts, misses = _refine(AlignConcatPass, "dpu-b4096", m.ort)
    assert counts == {}
    assert len(misses) == 1 and misses[0].startswith("/Concat: tensor '/a/a.2/Relu_output_0': scale ")
    assert misses[0].endswith("is not a power of two; quantize with a power-of-two method for this target")


def test_float_power_of_two_model_on_a_float_target_gives_the_vai_result() -> None:
    m = cnn()
    base = m.qdq
    in0, in1, out = in_key(base, "Concat", 0), in_key(base, "Concat", 1), out_key(base, "Concat")
    model = set_positions(base, {in0: 6, in1: 4, out: 5})
    after, counts, _ = _refine(AlignConcatPass, "zhouyi-x2", model)
    assert counts == {"aligned Concat /Concat to pos 4": 2}
    assert {k: positions(after)[k] for k in (in0, in1, out)} == {in0: 4, in1: 4, out: 4}


@pytest.fixture(scope="module")
def asymmetric(tmp_path_factory: pytest.TempPathFactory) -> onnx.ModelProto:
    """onnxruntime's default QDQ: uint8 asymmetric activations (zero points differ per tensor)."""
    m = cnn()
    out = Path(tmp_path_factory.mktemp("asym")) / "asym.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_static(
            str(m.float_path),
            str(out),
            FeedReader(m.feeds),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
    return onnx.load(str(out))


def test_asymmetric_target_unions_the_ranges(asymmetric: onnx.ModelProto) -> None:
    m = cnn()
    asymmetric = onnx.ModelProto.FromString(asymmetric.SerializeToString())
    first = in_key(asymmetric, "Concat", 0)
    dq = next(n for n in asymmetric.graph.node if n.output[0] == first)
    zp_name = f"{first}_zp30"  # give the first input a zero point of 30 (a range below zero) of its own
    asymmetric.graph.initializer.append(numpy_helper.from_array(np.asarray(30, np.uint8), zp_name))
    q = next(n for n in asymmetric.graph.node if n.output[0] == dq.input[0])
    q.input[2] = dq.input[2] = zp_name
    graph = QuantGraph(to_ir(onnx.ModelProto.FromString(asymmetric.SerializeToString())))
    concat = next(n for n in graph.graph if n.op_type == "Concat")
    sites = [graph.input_site(v) for v in concat.inputs] + [graph.output_site(concat.outputs[0])]
    ranges = [((0 - p[1]) * p[0], (255 - p[1]) * p[0]) for p in (s.params() for s in sites)]  # type: ignore[union-attr]
    assert len({s.params() for s in sites}) == 2  # type: ignore[union-attr]  # the second input and the output share
    after, counts, misses = _refine(AlignConcatPass, "zhouyi-x2", asymmetric)
    assert sum(counts.values()) == 3 and misses == []
    graph = QuantGraph(to_ir(after))
    concat = next(n for n in graph.graph if n.op_type == "Concat")
    aligned = {graph.input_site(v).params() for v in concat.inputs} | {
        graph.output_site(concat.outputs[0]).params()
    }  # type: ignore[union-attr]
    assert len(aligned) == 1
    scale, zp, qmin, qmax = aligned.pop()
    lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
    assert (qmin, qmax) == (0, 255) and zp == round(-lo / ((hi - lo) / 255)) == 20
    assert scale == pytest.approx(hi / (255 - 20), rel=1e-6)  # widened from (hi - lo) / 255 to keep hi
    assert counts == {f"aligned Concat /Concat to scale {scale:.6g} zero point 20": 3}
    assert (0 - zp) * scale <= lo + 1e-6 and (255 - zp) * scale >= hi - 1e-6
    assert grid_mismatches(after, m.feeds[0]) == []
    y_before, y_after = run(asymmetric, m.feeds[0])["y"], run(after, m.feeds[0])["y"]
    assert np.abs(y_after - y_before).max() < 0.1 * np.abs(y_before).max()


def test_a_target_without_the_rule_changes_nothing() -> None:
    m = cnn()
    after, counts, misses = _refine(AlignPoolPass, "zhouyi-x2", m.qdq)
    assert counts == {} and misses == ["target zhouyi-x2: no align.pool_ops rule; nothing to refine"]
    assert positions(after) == positions(m.qdq)
