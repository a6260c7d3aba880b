"""Tests for the DPU shift rules: shift_cut, shift_bias, eltwise shift_read/shift_write, sigmoid limits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

from tests.quantization.refine import (
    FORMS,
    cnn,
    grid_mismatches,
    in_key,
    out_key,
    positions,
    refine_copy,
    run,
    set_positions,
    user_target,
)
from zonnx.custom_ops import add_functions
from zonnx.ir.io import to_ir
from zonnx.quantization.refine.eltwise import EltwiseShiftPass
from zonnx.quantization.refine.positions import QuantGraph
from zonnx.quantization.refine.shift_bias import ShiftBiasPass
from zonnx.quantization.refine.shift_cut import ShiftCutPass
from zonnx.quantization.refine.sigmoid import SigmoidRangePass

# Positions in the test CNN before any perturbation (ORT's calibration rounded to powers of two):
# res conv: ipos 5, wpos 10, bpos 15, opos 7; head conv: ipos 5, wpos 8, bpos 13, opos 7;
# Add: inputs 7 (res conv) and 5 (max pool), output 5; Sigmoid: input 7, output 7.


def _keys(model: onnx.ModelProto) -> dict[str, str]:
    return {
        "res_in": in_key(model, "Conv", 0, 2),
        "res_w": in_key(model, "Conv", 1, 2),
        "res_b": in_key(model, "Conv", 2, 2),
        "res_out": out_key(model, "Conv", 2),
        "head_w": in_key(model, "Conv", 1, 3),
        "head_b": in_key(model, "Conv", 2, 3),
        "head_out": out_key(model, "Conv", 3),
        "add_in1": in_key(model, "Add", 1),
        "add_out": out_key(model, "Add"),
        "sig_out": out_key(model, "Sigmoid"),
    }


def _check(model: onnx.ModelProto, after: onnx.ModelProto, changed: dict[str, int]) -> None:
    """Exactly ``changed`` moved, and the outputs are those of the model with those positions set by hand."""
    assert positions(after) == {**positions(model), **changed}
    expected = set_positions(model, changed)
    m = cnn()
    for feeds in m.feeds[:2]:
        assert np.array_equal(run(after, feeds)["y"], run(expected, feeds)["y"])
    assert grid_mismatches(after, m.feeds[0]) == []


def test_base_positions() -> None:
    m = cnn()
    k, p = _keys(m.qdq), positions(m.qdq)
    assert [p[k[n]] for n in ("res_in", "res_w", "res_b", "res_out", "head_w", "head_b", "head_out")] == [
        5,
        10,
        15,
        7,
        8,
        13,
        7,
    ]
    assert [p[k[n]] for n in ("add_in1", "add_out", "sig_out")] == [5, 5, 7]
    for target in ("dpu-b4096",):  # the calibrated model already meets every shift rule
        for cls in (ShiftCutPass, ShiftBiasPass, EltwiseShiftPass, SigmoidRangePass):
            _, counts, misses = refine_copy(cls(target), m.fixneuron)
            assert counts == {} and misses == [], cls


@pytest.mark.parametrize("form", FORMS)
def test_shift_cut_moves_the_weight_position(form: str) -> None:
    m = cnn()
    k = _keys(m.form(form))
    model = set_positions(m.form(form), {k["res_out"]: -5, k["head_out"]: 14})  # shift_cut 20 and -1
    after, counts, misses = refine_copy(ShiftCutPass("dpu-b4096"), model)
    assert counts == {
        "Conv /res/Conv: shift_cut 20 -> 16 (wpos 10 -> 6)": 1,
        "Conv /head/Conv: shift_cut -1 -> 0 (wpos 8 -> 9)": 1,
    }
    assert misses == []
    _check(model, after, {k["res_w"]: 6, k["head_w"]: 9})


def test_shift_cut_gives_the_same_numbers_in_every_form() -> None:
    m = cnn()
    outputs = []
    for form in FORMS:
        k = _keys(m.form(form))
        model = set_positions(m.form(form), {k["res_out"]: -5, k["head_out"]: 14})
        outputs.append(run(refine_copy(ShiftCutPass("dpu-b4096"), model)[0], m.feeds[3])["y"])
    assert np.array_equal(outputs[0], outputs[1]) and np.array_equal(outputs[0], outputs[2])


def test_shift_cut_reads_the_output_position_after_a_fused_activation() -> None:
    m = cnn()
    proto = onnx.ModelProto.FromString(m.fixneuron.SerializeToString())
    conv_out = "/a/a.0/Conv_output_0"  # drop the FixNeuron between conv a and its Relu: the NPU fuses them
    fix = next(n for n in proto.graph.node if n.op_type == "FixNeuron" and n.input[0] == conv_out)
    relu = next(n for n in proto.graph.node if n.op_type == "Relu" and n.input[0] == fix.output[0])
    relu.input[0] = conv_out
    proto.graph.node.remove(fix)
    relu_out = out_key(proto, "Relu", 0)
    model = set_positions(proto, {relu_out: -8})  # shift_cut = 8 + 5 + 8 = 21
    after, counts, _ = refine_copy(ShiftCutPass("dpu-b4096"), model)
    assert counts == {"Conv /a/a.0/Conv: shift_cut 21 -> 16 (wpos 8 -> 3)": 1}
    _check(model, after, {in_key(model, "Conv", 1, 0): 3})


@pytest.mark.parametrize("form", FORMS)
def test_shift_bias_moves_the_bias_position(form: str) -> None:
    m = cnn()
    k = _keys(m.form(form))
    # res: shift_cut 16 allows shift_bias in [0, 16] and bpos 16 gives -1; head: bpos -5 gives 18.
    model = set_positions(m.form(form), {k["res_out"]: -1, k["res_b"]: 16, k["head_b"]: -5})
    after, counts, misses = refine_copy(ShiftBiasPass("dpu-b4096"), model)
    assert counts == {
        "Conv /res/Conv: shift_bias -1 -> 0 (bpos 16 -> 15)": 1,
        "Conv /head/Conv: shift_bias 18 -> 16 (bpos -5 -> -3)": 1,
    }
    assert misses == []
    _check(model, after, {k["res_b"]: 15, k["head_b"]: -3})


@pytest.mark.parametrize("form", FORMS)
def test_eltwise_shift_read_and_shift_write(form: str) -> None:
    m = cnn()
    k = _keys(m.form(form))
    model = set_positions(m.form(form), {k["res_out"]: 22, k["add_out"]: 22})  # read 17, write 5 - 22 = -17
    after, counts, _ = refine_copy(EltwiseShiftPass("dpu-b4096"), model)
    assert counts == {
        "Add /Add: shift_read 17 -> 15 (input /res/Conv_output_0 pos 22 -> 20)": 1,
        "Add /Add: shift_write -17 -> -15 (opos 22 -> 20)": 1,
    }
    _check(model, after, {k["res_out"]: 20, k["add_out"]: 20})
    model = set_positions(m.form(form), {k["add_out"]: -12})  # write 5 + 12 = 17
    after, counts, _ = refine_copy(EltwiseShiftPass("dpu-b4096"), model)
    assert counts == {"Add /Add: shift_write 17 -> 15 (opos -12 -> -10)": 1}
    _check(model, after, {k["add_out"]: -10})


@pytest.mark.parametrize("form", FORMS)
def test_sigmoid_input_and_output_limits(form: str) -> None:
    m = cnn()
    k = _keys(m.form(form))
    model = set_positions(m.form(form), {k["head_out"]: 17, k["sig_out"]: 3})
    after, counts, _ = refine_copy(SigmoidRangePass("dpu-b4096"), model)
    assert counts == {"Sigmoid /Sigmoid: ipos 17 -> 15": 1, "Sigmoid /Sigmoid: opos 3 -> 7": 1}
    _check(model, after, {k["head_out"]: 15, k["sig_out"]: 7})
    model = set_positions(m.form(form), {k["head_out"]: -2, k["sig_out"]: 20})  # shift 14 + 0 - 20 < 0
    after, counts, _ = refine_copy(SigmoidRangePass("dpu-b4096"), model)
    assert counts == {"Sigmoid /Sigmoid: ipos -2 -> 0": 1, "Sigmoid /Sigmoid: opos 20 -> 14": 1}
    _check(model, after, {k["head_out"]: 0, k["sig_out"]: 14})


def test_user_targets_change_the_limits(tmp_path: Path) -> None:
    m = cnn()
    k = _keys(m.qdq)
    path = user_target(
        tmp_path,
        "tight",
        {
            "ipos = [0, 15]": "ipos = [0, 5]",
            "opos_min = 7": "opos_min = 9",
            "equal_input_scales = false": "equal_input_scales = true",
            "max = 16\n": "max = 4\n",
        },
    )
    after, counts, _ = refine_copy(SigmoidRangePass(path), m.qdq)
    assert counts == {"Sigmoid /Sigmoid: ipos 7 -> 5": 1, "Sigmoid /Sigmoid: opos 7 -> 9": 1}
    _check(m.qdq, after, {k["head_out"]: 5, k["sig_out"]: 9})
    after, counts, _ = refine_copy(EltwiseShiftPass(path), m.qdq)  # equal input scales: 7 and 5 -> 5
    assert counts == {"aligned Add /Add inputs to pos 5": 1}
    _check(m.qdq, after, {k["res_out"]: 5})
    after, counts, _ = refine_copy(ShiftCutPass(path), m.qdq)  # shift_cut at most 4
    assert counts == {
        "Conv /a/a.0/Conv: shift_cut 7 -> 4 (wpos 8 -> 5)": 1,
        "Conv /b/b.0/Conv: shift_cut 8 -> 4 (wpos 8 -> 4)": 1,
        "Conv /res/Conv: shift_cut 8 -> 4 (wpos 10 -> 6)": 1,
        "Conv /head/Conv: shift_cut 6 -> 4 (wpos 8 -> 6)": 1,
        "Gemm /fc/Gemm: shift_cut 7 -> 4 (wpos 8 -> 5)": 1,
    }


def test_float_targets_and_float_models_are_left_alone() -> None:
    m = cnn()
    for cls in (ShiftCutPass, ShiftBiasPass, SigmoidRangePass):
        _, counts, misses = refine_copy(cls("bm1684x"), m.qdq)
        assert counts == {} and len(misses) == 1 and misses[0].startswith("target bm1684x: no ")
    _, counts, misses = refine_copy(ShiftCutPass("dpu-b4096"), m.ort)
    assert counts == {} and len(misses) == 5
    assert misses[0].startswith("/a/a.0/Conv: tensor 'x': scale ") and "is not a power of two" in misses[0]


def test_a_weight_shared_by_two_convolutions_is_solved_for_both() -> None:
    m = cnn()
    proto = onnx.ModelProto.FromString(m.fixneuron.SerializeToString())
    convs = [n for n in proto.graph.node if n.op_type == "Conv"]
    convs[1].input[1] = convs[0].input[1]  # conv b reads conv a's weight (same shape)
    k = in_key(proto, "Conv", 1, 0)
    work = to_ir(proto)
    assert (
        QuantGraph(work).input_site(next(n for n in work.graph if n.op_type == "Conv").inputs[1]) is not None
    )
    model = set_positions(proto, {out_key(proto, "Conv", 0): -4, out_key(proto, "Conv", 1): -2})
    after, counts, misses = refine_copy(ShiftCutPass("dpu-b4096"), model)  # 8+5+4 = 17 and 8+5+2 = 15
    assert counts == {"Conv /a/a.0/Conv: shift_cut 17 -> 16 (wpos 8 -> 7)": 1} and misses == []
    assert positions(after)[k] == 7


def test_conflicting_requirements_on_a_shared_weight_are_reported() -> None:
    m = cnn()
    proto = onnx.ModelProto.FromString(m.fixneuron.SerializeToString())
    convs = [n for n in proto.graph.node if n.op_type == "Conv"]
    convs[1].input[1] = convs[0].input[1]
    # conv a needs wpos <= 16 - 5 - 4 = 7, conv b needs wpos >= 0 - 5 + 20 = 15: no position meets both.
    model = set_positions(proto, {out_key(proto, "Conv", 0): -4, out_key(proto, "Conv", 1): 20})
    result = ShiftCutPass("dpu-b4096", max_sweeps=4)(to_ir(model))
    assert result.changes.misses == [
        "refine-shift-cut: positions still moved after 4 sweeps (the rule conflicts with itself on shared tensors)"
    ]
    assert result.changes.counts == {
        "Conv /a/a.0/Conv: shift_cut 17 -> 16 (wpos 8 -> 7)": 1,
        "Conv /b/b.0/Conv: shift_cut -8 -> 0 (wpos 7 -> 15)": 4,
        "Conv /a/a.0/Conv: shift_cut 24 -> 16 (wpos 15 -> 7)": 3,
    }


def test_a_user_target_can_put_tanh_under_the_sigmoid_limits(tmp_path: Path) -> None:
    attrs = 'bit_width = 8, signed = 1, narrow = 0, round_mode = "half_up"'
    model = onnx.parser.parse_model(f"""
        <ir_version: 10, opset_import: ["" : 13, "com.zonnx" : 1]>
        g (float[1, 64] x) => (float[1, 64] y) {{
            xq = com.zonnx.FixNeuron <pos = 17, {attrs}> (x)
            t = Tanh (xq)
            y = com.zonnx.FixNeuron <pos = 3, {attrs}> (t)
        }}""")
    add_functions(model)
    path = user_target(tmp_path, "with-tanh", {'ops = ["Sigmoid"]': 'ops = ["Sigmoid", "Tanh"]'})
    after, counts, _ = refine_copy(SigmoidRangePass(path), model)
    assert counts == {"Tanh Tanh->t: ipos 17 -> 15": 1, "Tanh Tanh->t: opos 3 -> 7": 1}
    assert positions(after) == {"xq": 15, "y": 7}
    feeds = {"x": np.linspace(-0.01, 0.01, 64, dtype=np.float32).reshape(1, 64)}
    assert grid_mismatches(after, feeds) == []
    _, counts, _ = refine_copy(SigmoidRangePass("dpu-b4096"), model)  # the DPU rule names Sigmoid only
    assert counts == {}
