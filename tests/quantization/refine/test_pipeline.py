"""The whole refinement (refine_model) on the test CNN, the zoo digits CNN, PP-OCR cls and zonnx's quantizer output."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

import zonnx
from tests.quantization.refine import (
    FORMS,
    Models,
    cnn,
    grid_mismatches,
    in_key,
    out_key,
    positions,
    quantized_forms,
    run,
    run_all,
    set_positions,
)
from zonnx import zoo
from zonnx.backend.targets import Target, load_target
from zonnx.ir.io import to_ir, to_proto
from zonnx.quantization.refine.avgpool import AvgPoolFactorPass
from zonnx.quantization.refine.leaky_relu import LeakyReluSlopePass
from zonnx.quantization.refine.pipeline import REFINE_PASSES, refine_model, refine_passes
from zonnx.quantization.refine.positions import QuantGraph, Site
from zonnx.verify import check_loadable


def _pos(site: Site | None) -> int:
    assert site is not None and site.pos is not None
    return site.pos


def violations(model: onnx.ModelProto, target: Target) -> Iterator[str]:
    """Every rule of the target checked from the positions (the arithmetic written out independently)."""
    work = to_ir(onnx.ModelProto.FromString(model.SerializeToString()))
    g = QuantGraph(work)
    q = target.quant
    acts = {"Relu", "Clip", "LeakyRelu", "HardSwish", "HardSigmoid"}
    for node in work.graph:
        op, name = node.op_type, node.name
        ins = [g.input_site(v) for v in node.inputs if v is not None]
        if op == "Concat" and all(ins) and g.output_site(node.outputs[0]):
            got = {_pos(s) for s in ins} | {_pos(g.output_site(node.outputs[0]))}
            if len(got) > 1:
                yield f"{name}: concat positions {got}"
        out = g.output_site(node.outputs[0])
        if op in q.align.pool_ops and ins[0] and out and _pos(ins[0]) != _pos(out):
            yield f"{name}: pool positions differ"
        if op in ("Conv", "Gemm") and all(ins):
            ipos, wpos, opos = _pos(ins[0]), _pos(ins[1]), _pos(g.output_site(node.outputs[0], acts))
            if not 0 <= wpos + ipos - opos <= 16:
                yield f"{name}: shift_cut {wpos + ipos - opos}"
            if (
                len(ins) > 2
                and not min(0, -(24 - (8 + wpos + ipos - opos))) <= wpos + ipos - _pos(ins[2]) <= 16
            ):
                yield f"{name}: shift_bias {wpos + ipos - _pos(ins[2])}"
        if op == "Add" and all(ins) and not any(s.const for s in ins):  # type: ignore[union-attr]
            poses = [_pos(s) for s in ins]
            opos = _pos(g.output_site(node.outputs[0], {"Relu"}))
            if max(poses) - min(poses) > 15 or not -15 <= min(poses) - opos <= 15:
                yield f"{name}: shift_read {max(poses) - min(poses)} shift_write {min(poses) - opos}"
        if op == "Sigmoid" and ins[0]:
            ipos, opos = _pos(ins[0]), _pos(g.output_site(node.outputs[0]))
            if not (0 <= ipos <= 15 and opos >= 7 and 0 <= 14 + ipos - opos <= 31):
                yield f"{name}: sigmoid ipos {ipos} opos {opos}"
        if op == "LeakyRelu" and node.attributes.get_float("alpha") != 26 / 256:
            yield f"{name}: alpha {node.attributes.get_float('alpha')}"


def _refine(
    model: onnx.ModelProto, target: str = "dpu-b4096"
) -> tuple[onnx.ModelProto, dict[str, int], list[str]]:
    work = to_ir(onnx.ModelProto.FromString(model.SerializeToString()))
    changes = refine_model(work, target)
    after = to_proto(work)
    check_loadable(after, full_check=False)
    again = refine_model(to_ir(onnx.ModelProto.FromString(after.SerializeToString())), target)
    assert again.total == 0, dict(again.counts)
    return after, dict(changes.counts), changes.misses


def test_the_passes_in_order() -> None:
    assert [cls.name for cls in REFINE_PASSES] == [
        "refine-prelu-slope",
        "refine-unfused-activation",
        "refine-leaky-relu",
        "refine-sigmoid",
        "refine-eltwise",
        "refine-shift-cut",
        "refine-shift-bias",
        "refine-align-concat",
        "refine-align-pool",
        "refine-avgpool-factor",
    ]
    target = load_target("zhouyi-x2")
    assert all(p.target is target for p in refine_passes("zhouyi-x2"))


@pytest.mark.parametrize("form", FORMS)
def test_every_rule_holds_after_refinement(form: str) -> None:
    m = cnn()
    base = m.form(form)
    k = {
        "c0": in_key(base, "Concat", 0),
        "c1": in_key(base, "Concat", 1),
        "pool": out_key(base, "MaxPool"),
        "res_out": out_key(base, "Conv", 2),
        "add_out": out_key(base, "Add"),
        "head_out": out_key(base, "Conv", 3),
        "sig_out": out_key(base, "Sigmoid"),
        "head_b": in_key(base, "Conv", 2, 3),
    }
    perturbed = set_positions(
        base,
        {
            k["c0"]: 7,
            k["c1"]: 3,
            k["pool"]: 6,
            k["res_out"]: -5,
            k["add_out"]: 22,
            k["head_out"]: 17,
            k["sig_out"]: 3,
            k["head_b"]: -5,
        },
    )
    target = load_target("dpu-b4096")
    assert list(violations(perturbed, target)) == [
        "/Concat: concat positions {3, 5, 7}",
        "/pool/MaxPool: pool positions differ",
        "/res/Conv: shift_cut 21",
        "/Add: shift_read 11 shift_write -27",
        "/lrelu/LeakyRelu: alpha 0.10000000149011612",
        "/head/Conv: shift_cut -4",
        "/head/Conv: shift_bias 18",
        "/Sigmoid: sigmoid ipos 17 opos 3",
        "/GlobalAveragePool: pool positions differ",
    ]
    after, counts, misses = _refine(perturbed)
    assert list(violations(after, target)) == [] and misses == []
    # Worked by hand in the passes' order (sigmoid, eltwise, shift_cut, shift_bias, concat, pool); the
    # second round finds shift_bias of /res/Conv at its new lower bound (-3 for shift_cut 13) and stops.
    assert counts == {
        "LeakyRelu alpha 0.1 -> 26/256": 1,
        "Sigmoid /Sigmoid: ipos 17 -> 15": 1,
        "Sigmoid /Sigmoid: opos 3 -> 7": 1,
        "Add /Add: shift_write -27 -> -15 (opos 22 -> 10)": 1,
        "Conv /res/Conv: shift_cut 21 -> 16 (wpos 10 -> 5)": 1,
        "Conv /head/Conv: shift_cut -2 -> 0 (wpos 8 -> 10)": 1,
        "Conv /res/Conv: shift_bias -4 -> 0 (bpos 15 -> 11)": 1,
        "Conv /head/Conv: shift_bias 20 -> 16 (bpos -5 -> -1)": 1,
        "aligned Concat /Concat to pos 3": 2,
        "aligned MaxPool /pool/MaxPool to pos 3": 1,
        "AveragePool /avg/AveragePool 3x3: NPU factor 7/2^6 (mean x 0.984375)": 1,
        "GlobalAveragePool /GlobalAveragePool 6x6: NPU factor 7/2^8 (mean x 0.984375)": 1,
    }
    final = positions(after)
    moved = {key: p for key, p in final.items() if p != positions(perturbed)[key]}
    assert moved == {
        k["c0"]: 3,
        out_key(base, "Concat"): 3,
        k["pool"]: 3,
        k["add_out"]: 10,
        k["head_out"]: 15,
        k["sig_out"]: 7,
        in_key(base, "Conv", 1, 2): 5,
        in_key(base, "Conv", 1, 3): 10,
        in_key(base, "Conv", 2, 2): 11,
        k["head_b"]: -1,
    }
    # Independently: the positions set by protobuf surgery, then the slope and the pool factors.
    expected = to_ir(set_positions(perturbed, moved))
    LeakyReluSlopePass("dpu-b4096")(expected)
    AvgPoolFactorPass("dpu-b4096")(expected)
    for feeds in m.feeds[:3]:
        assert np.array_equal(run(after, feeds)["y"], run(expected, feeds)["y"])
    assert grid_mismatches(after, m.feeds[0]) == []


def test_the_forms_agree_on_positions_after_refinement() -> None:
    m = cnn()
    results = [positions(_refine(m.form(form))[0]) for form in FORMS]
    assert results[0] == results[1] == results[2]


def test_digits_cnn_meets_the_dpu_rules_as_calibrated(tmp_path: Path) -> None:
    feeds = zoo.sample_inputs("digits_cnn", 8)
    models = quantized_forms(zoo.get("digits_cnn"), feeds, tmp_path)
    target = load_target("dpu-b4096")
    for form in FORMS:
        after, counts, misses = _refine(models.form(form))
        assert counts == {} and misses == [] and list(violations(after, target)) == []
    # Off-grid positions are brought back: Concat input, Add output, a conv output (shift_cut).
    base = models.fixneuron
    perturbed = set_positions(
        base, {in_key(base, "Concat", 0): 2, out_key(base, "Add"): 24, out_key(base, "Conv", 0): -6}
    )
    after, counts, _ = _refine(perturbed)
    assert list(violations(after, target)) == []
    assert counts == {
        "Add /Add: shift_write -19 -> -15 (opos 24 -> 20)": 1,
        "Conv /stem/stem.0/Conv: shift_cut 21 -> 16 (wpos 8 -> 3)": 1,
        "aligned Concat /Concat to pos 2": 2,
    }
    assert grid_mismatches(after, feeds[0]) == []


@pytest.fixture(scope="module")
def ppocr_cls(tmp_path_factory: pytest.TempPathFactory) -> Models:
    """PP-OCR mobile cls at its 1x3x48x192 input, optimized at opset 13, quantized by ORT (power of two)."""
    feeds = zoo.sample_inputs("ppocr_cls", 8)
    model = onnx.load(str(zoo.get("ppocr_cls")))
    for dim, size in zip(model.graph.input[0].type.tensor_type.shape.dim, feeds[0]["x"].shape, strict=True):
        dim.ClearField("dim_param")
        dim.dim_value = size
    folder = Path(tmp_path_factory.mktemp("ppocr_cls"))
    onnx.save(zonnx.optimize(model, opset=13), folder / "cls.onnx")
    return quantized_forms(folder / "cls.onnx", feeds, folder)


def test_ppocr_cls_gets_aligned_pools_and_npu_factors(ppocr_cls: Models) -> None:
    target = load_target("dpu-b4096")
    after, counts, misses = _refine(ppocr_cls.fixneuron)
    aligned = {key: n for key, n in counts.items() if key.startswith("aligned GlobalAveragePool")}
    factors = {key.split(" ", 2)[2] for key in counts if " NPU factor " in key}
    assert len(aligned) == 10 and sum(aligned.values()) == 10 and sum(counts.values()) == 20
    assert factors == {
        "12x96: NPU factor 57/2^16 (mean x 1.0019531)",
        "3x96: NPU factor 57/2^14 (mean x 1.0019531)",
        "2x96: NPU factor 85/2^14 (mean x 0.99609375)",
        "1x48: NPU factor 85/2^12 (mean x 0.99609375)",
    }
    assert misses == [
        "MaxPool@0: input is not quantized; left alone"
    ]  # ORT leaves the stem's Relu output float
    assert list(violations(after, target)) == []
    assert grid_mismatches(after, ppocr_cls.feeds[0]) == []
    for old, new in zip(
        run_all(ppocr_cls.fixneuron, ppocr_cls.feeds), run_all(after, ppocr_cls.feeds), strict=True
    ):
        (before,), (now,) = old.values(), new.values()
        assert np.abs(now - before).max() <= 0.125 and now.argmax() == before.argmax()
    qdq_after, qdq_counts, _ = _refine(ppocr_cls.qdq)
    assert qdq_counts == counts and positions(qdq_after) == positions(after)


class _Reader:
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


@pytest.mark.parametrize("fmt", ["FixNeuron", "QDQ"])
def test_zonnx_quantizer_output(fmt: str) -> None:
    feeds = zoo.sample_inputs("digits_cnn", 16)
    result = zonnx.quantize_static(
        str(zoo.get("digits_cnn")),
        None,
        _Reader(feeds),
        quant_format=getattr(zonnx.VitisQuantFormat, fmt),
        calibrate_method=zonnx.PowerOfTwoMethod.NonOverflow,
    )
    model = result.model
    forms = {
        q.form
        for s in QuantGraph(to_ir(onnx.ModelProto.FromString(model.SerializeToString()))).sites()
        for q in s.quantizers
    }
    assert forms == ({"fixneuron"} if fmt == "FixNeuron" else {"vitis_qdq"})
    after, counts, misses = _refine(model)
    assert counts == {} and misses == [] and list(violations(after, load_target("dpu-b4096"))) == []
    assert np.array_equal(run(after, feeds[0])["logits"], run(model, feeds[0])["logits"])
    # The quantizer's positions, moved off the rules, are brought back by the passes.
    p = positions(model)
    add_out, cat_in = out_key(model, "Add", through={"Relu"}), in_key(model, "Concat", 1)
    low = min(p[in_key(model, "Add", i)] for i in (0, 1))
    pool_out = p[out_key(model, "MaxPool")]
    others = [p[in_key(model, "Concat", 0)], p[out_key(model, "Concat")]]
    assert low + 15 > pool_out and min(others) > 2  # what the expected counts below rely on
    perturbed = set_positions(model, {add_out: 23, cat_in: 2})
    after, counts, _ = _refine(perturbed)
    assert list(violations(after, load_target("dpu-b4096"))) == []
    # Add (fused Relu): min(ipos) - 23 < -15 -> opos min(ipos) + 15; the MaxPool reading it then aligns to its output.
    assert counts == {
        f"Add /Add: shift_write {low - 23} -> -15 (opos 23 -> {low + 15})": 1,
        f"aligned MaxPool /pool/MaxPool to pos {pool_out}": 1,
        "aligned Concat /Concat to pos 2": 2,
    }
    assert positions(after)[add_out] == pool_out
    assert grid_mismatches(after, feeds[1]) == []
