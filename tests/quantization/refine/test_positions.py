"""Tests for reading and writing positions and scales in QDQ, FixNeuron and Vitis Q/DQ models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.quantization.refine import (
    FORMS,
    cnn,
    grid_mismatches,
    in_key,
    out_key,
    positions,
    run,
    set_positions,
)
from zonnx.ir.io import to_ir, to_proto
from zonnx.quantization.refine.concat import AlignConcatPass
from zonnx.quantization.refine.positions import QuantGraph, pos_of_scale
from zonnx.verify import check_loadable


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.ModelProto.FromString(model.SerializeToString())


def test_pos_of_scale_accepts_exact_powers_of_two_only() -> None:
    assert [pos_of_scale(s) for s in (1.0, 0.5, 2**-7, 4.0, 2.0**-126)] == [0, 1, 7, -2, 126]
    assert [pos_of_scale(s) for s in (0.1, 0.0, -0.5, float("nan"), 2.0**-130, 2.0**200)] == [None] * 6
    assert pos_of_scale(np.float32(2**-5) * np.float32(1.0000001)) is None


def test_the_three_forms_expose_the_same_sites_and_positions() -> None:
    m = cnn()
    expected = positions(m.qdq)
    assert positions(m.fixneuron) == expected and positions(m.vitis) == expected
    assert len(expected) == 26 and all(p is not None for p in expected.values())
    forms = {}
    for name in FORMS:
        graph = QuantGraph(to_ir(_copy(m.form(name))))
        forms[name] = sorted({q.form for s in graph.sites() for q in s.quantizers})
        weight = graph.input_site(next(n for n in graph.graph if n.op_type == "Conv").inputs[1])
        assert weight is not None and weight.const
        concat = graph.input_site(next(n for n in graph.graph if n.op_type == "Concat").inputs[0])
        assert concat is not None and not concat.const
    assert forms == {"qdq": ["dq", "qdq"], "fixneuron": ["fixneuron"], "vitis": ["vitis_dq", "vitis_qdq"]}
    y = [run(m.form(name), m.feeds[0])["y"] for name in FORMS]
    assert np.array_equal(y[0], y[1]) and np.array_equal(y[0], y[2])  # bit-identical forms


@pytest.mark.parametrize("form", FORMS)
def test_set_pos_rewrites_only_the_site_and_matches_protobuf_surgery(form: str) -> None:
    m = cnn()
    model = m.form(form)
    before = positions(model)
    concat_out, pool_out = out_key(model, "Concat"), out_key(model, "MaxPool")
    weight = in_key(model, "Conv", 1, occurrence=2)  # the residual conv's weight (stored codes in qdq/vitis)
    work = to_ir(_copy(model))
    graph = QuantGraph(work)
    by_key = {s.quantizers[0].outputs[0].name: s for s in graph.sites()}
    assert graph.set_pos(by_key[concat_out], before[concat_out] - 2)
    assert graph.set_pos(by_key[weight], before[weight] - 3)
    assert not graph.set_pos(by_key[pool_out], before[pool_out])  # no change: reports False
    after = positions(work)
    assert after == {**before, concat_out: before[concat_out] - 2, weight: before[weight] - 3}
    # ORT's QDQ model shares the Concat output's scale initializer with the MaxPool output: the pool keeps 5.
    assert after[pool_out] == before[pool_out] == before[concat_out]
    proto = to_proto(work)
    check_loadable(proto, full_check=False)
    expected = set_positions(model, {concat_out: before[concat_out] - 2, weight: before[weight] - 3})
    got, want = run(proto, m.feeds[1]), run(expected, m.feeds[1])
    assert np.array_equal(got["y"], want["y"])
    assert not np.array_equal(got["y"], run(model, m.feeds[1])["y"])
    assert grid_mismatches(proto, m.feeds[1]) == []


def test_stored_codes_are_requantized_and_shared_scales_split() -> None:
    m = cnn()
    work = to_ir(_copy(m.qdq))
    graph = QuantGraph(work)
    res = [n for n in work.graph if n.op_type == "Conv"][2]
    site = graph.input_site(res.inputs[1])
    assert site is not None and site.quantizers[0].form == "dq"
    codes = site.quantizers[0].source.const_value.numpy().copy()
    pos = site.pos
    assert pos is not None
    graph.set_pos(site, pos - 2)
    new_codes = site.quantizers[0].source.const_value.numpy()
    assert np.array_equal(new_codes, np.rint(codes / 4.0).astype(np.int8))  # half to even: 2 -> 0, 6 -> 2
    graph.set_pos(site, pos + 1)
    assert np.array_equal(
        site.quantizers[0].source.const_value.numpy(), np.clip(new_codes.astype(int) * 8, -128, 127)
    )
    # The Concat output and MaxPool output share one scale initializer in ORT's model: moving one gives it its own.
    concat = graph.output_site(next(n for n in work.graph if n.op_type == "Concat").outputs[0])
    pool = graph.output_site(next(n for n in work.graph if n.op_type == "MaxPool").outputs[0])
    assert concat is not None and pool is not None
    shared = concat.quantizers[0].nodes[0].inputs[1]
    assert shared is pool.quantizers[0].nodes[0].inputs[1]
    graph.set_pos(concat, 3)
    assert (
        concat.quantizers[0].nodes[0].inputs[1] is not shared
        and pool.quantizers[0].nodes[0].inputs[1] is shared
    )
    assert all(n.inputs[1] is concat.quantizers[0].nodes[0].inputs[1] for n in concat.quantizers[0].nodes)
    assert (concat.pos, pool.pos) == (3, 5)


def test_float_scales_and_problems_are_reported() -> None:
    m = cnn()
    proto = _copy(m.qdq)
    name = next(n.input[1] for n in proto.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    for t in proto.graph.initializer:
        if t.name == name:
            t.CopyFrom(numpy_helper.from_array(np.asarray(0.03, np.float32), name))
    work = to_ir(proto)
    graph = QuantGraph(work)
    site = graph.site(work.graph.inputs[0])
    assert site is not None and site.pos is None
    assert "0.03 (zero point 0) is not a power of two" in (site.problem(power_of_two=True) or "")
    assert site.problem(power_of_two=False) is None
    assert graph.set_scale(site, 0.05, 3) and site.params() == (np.float32(0.05), 3, -128, 127)
    assert not graph.set_scale(site, 0.05, 3)
    check_loadable(to_proto(work), full_check=False)
    fix = QuantGraph(to_ir(_copy(m.fixneuron)))
    with pytest.raises(ValueError, match="powers of two only"):
        fix.set_scale(fix.sites()[0], 0.03, 0)


def test_codes_read_by_other_nodes_are_not_rewritten() -> None:
    m = cnn()
    proto = _copy(m.qdq)
    q = next(
        n for n in proto.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "/Concat_output_0"
    )
    proto.graph.output.append(onnx.helper.make_tensor_value_info(q.output[0], onnx.TensorProto.INT8, None))
    work = to_ir(proto)
    site = QuantGraph(work).site(next(n for n in work.graph if n.op_type == "Concat").outputs[0])
    assert site is not None and site.pos == 5
    assert site.problem(True) == (
        "tensor '/Concat_output_0': its integer codes are the graph output "
        "'/Concat_output_0_QuantizeLinear_Output'"
    )
    result = AlignConcatPass("dpu-b4096")(work)
    assert result.changes.total == 0 and result.changes.misses == [f"/Concat: {site.problem(True)}"]
