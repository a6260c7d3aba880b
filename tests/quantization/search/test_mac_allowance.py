"""The float fall-back search keeps its layers within the NPU's share of MACs from the start."""

from __future__ import annotations

import onnx

from zonnx import zoo
from zonnx.inspection.macs import node_macs_by_name
from zonnx.quantization.search.mac_allowance import within_mac_allowance


def test_macs_by_name_count_the_ppocr_recognizer_at_a_fixed_width() -> None:
    model = onnx.load(zoo.get("ppocr_rec"))
    macs = node_macs_by_name(model, {"x": (1, 3, 48, 320)})
    convs = [n.name for n in model.graph.node if n.op_type == "Conv"]
    assert convs and all(macs[c] and macs[c] > 0 for c in convs)
    assert all(macs[n.name] == 0 for n in model.graph.node if n.op_type in ("Add", "Softmax", "HardSwish"))


def test_the_walk_skips_layers_over_the_allowance_and_keeps_cheap_ones_after_them() -> None:
    model = onnx.load(zoo.get("ppocr_rec"))
    macs = node_macs_by_name(model, {"x": (1, 3, 48, 320)})
    total = sum(m for m in macs.values() if m)
    biggest = max(macs, key=lambda n: macs[n] or 0)
    cheap = [n.name for n in model.graph.node if n.op_type == "Add"][:5]
    order = [biggest, *cheap]
    kept = within_mac_allowance(order, macs, 0.9)
    assert macs[biggest] > 0.1 * total  # the largest layer alone holds more than the allowance
    assert kept == cheap  # skipped, and the MAC-free layers behind it still kept
    everything = within_mac_allowance(list(macs), macs, 0.9)
    assert sum(macs[n] or 0 for n in everything) <= 0.1 * total
    assert within_mac_allowance(order, macs, 0.0) == order  # no share asked: nothing left out
    assert within_mac_allowance(["unknown", *cheap], {**macs, "unknown": None}, 0.5) == cheap


def test_the_allowance_counts_what_already_runs_on_the_cpu() -> None:
    """On dpu-b4096 the rec model's 6625-class head (4.6% of MACs) cannot run on the NPU at all: with 90%
    asked, the raised layers may hold 5.4% more, not 10%."""
    model = onnx.load(zoo.get("ppocr_rec"))
    macs = node_macs_by_name(model, {"x": (1, 3, 48, 320)})
    total = sum(m for m in macs.values() if m)
    kept = within_mac_allowance(list(macs), macs, 0.9, npu_share_now=0.954)
    held = sum(macs[n] or 0 for n in kept)
    assert 0.04 * total < held <= 0.054 * total
    assert within_mac_allowance(list(macs), macs, 0.9, npu_share_now=0.85) == [
        n for n in macs if macs[n] == 0
    ]  # already below the share: only MAC-free layers


def test_raising_a_layer_already_on_the_cpu_costs_nothing() -> None:
    """The same head, raised to float, moves no MACs off the NPU: it fits beside layers that hold the
    whole 5.4% allowance, where counting its MACs would leave it out."""
    model = onnx.load(zoo.get("ppocr_rec"))
    macs = node_macs_by_name(model, {"x": (1, 3, 48, 320)})
    total = sum(m for m in macs.values() if m)
    head = max(macs, key=lambda n: macs[n] or 0 if n.startswith("p2o.MatMul") else 0)
    assert 0.04 * total < macs[head] < 0.05 * total
    convs = sorted((n for n in macs if n.startswith("p2o.Conv") and macs[n]), key=lambda n: macs[n])
    small = []
    for name in convs:  # the smallest convolutions, up to 5% of MACs
        if sum(macs[n] for n in small) + macs[name] > 0.05 * total:
            break
        small.append(name)
    order = [*small, head]
    assert within_mac_allowance(order, macs, 0.9, npu_share_now=0.954) == small
    assert within_mac_allowance(order, macs, 0.9, npu_share_now=0.954, off_npu={head}) == order
