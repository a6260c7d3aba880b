"""Triage on a real quantized model: bisection finds the quantizer that breaks the output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import zonnx
from tests.helpers import digits_feeds, run_cli
from zonnx import zoo
from zonnx.errors import OptionError
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.enums import PowerOfTwoMethod, VitisQuantFormat
from zonnx.quantization.triage import bypass, find_sites, triage
from zonnx.quantization.triage_remedies import site_values, with_16_bits, with_range


@pytest.fixture(scope="module")
def digits() -> Path:
    return zoo.get("digits_cnn")


def _quantized(digits: Path) -> onnx.ModelProto:
    return zonnx.quantize_static(digits, None, ListReader(digits_feeds(16)), per_channel=True).model


def _break_site(model: onnx.ModelProto, tensor: str) -> onnx.ModelProto:
    """Scale one activation quantizer 300x too coarse: its tensor keeps a few levels only."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    q = next(n for n in out.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    scales = {t.name: t for t in out.graph.initializer}
    # tensors that share a scale share its initializer: the broken quantizer gets a private copy
    arr = numpy_helper.to_array(scales[q.input[1]]) * 300
    name = f"{q.input[1]}_broken"
    out.graph.initializer.append(numpy_helper.from_array(arr.astype(np.float32), name))
    for node in out.graph.node:
        if node is q or (node.op_type == "DequantizeLinear" and node.input[0] == q.output[0]):
            node.input[1] = name
    return out


def test_bisection_names_a_broken_quantizer_first(digits: Path) -> None:
    quant = _quantized(digits)
    sites = find_sites(quant)
    assert len(sites) >= 8 and [s.index for s in sites] == list(range(len(sites)))
    victim = sites[len(sites) // 2].tensor
    broken = _break_site(quant, victim)
    result = triage(str(digits), broken, digits_feeds(8, 200), tolerance=0.999)
    assert result.baseline < 0.999
    assert result.first is not None and result.first.tensor == victim
    assert result.recovered >= 0.999 and result.alone[victim] >= 0.999
    # bisection, then per culprit: the recovered score, float alone, and the other two remedies
    assert result.runs <= 2 + 2 * len(sites).bit_length() + len(result.culprits) * 4
    tried = result.remedies[victim]
    assert set(tried) == {"float", "16-bit", "range"} and tried["float"] == result.alone[victim]
    # 16 bits over the same (300x too wide) range keep 256x finer steps; the range searched again on the
    # samples finds the tensor's own span: both bring the output back near float
    assert tried["range"] >= 0.999 and tried["16-bit"] > result.baseline
    assert result.best_remedy(victim) in tried


def test_remedies_on_a_power_of_two_model_change_only_that_site(digits: Path) -> None:
    quant = zonnx.quantize_static(
        digits, None, ListReader(digits_feeds(16)), quant_format=VitisQuantFormat.FixNeuron,
        calibrate_method=PowerOfTwoMethod.MinMSE,
    ).model  # fmt: skip
    site = find_sites(quant)[2]
    wide = with_16_bits(quant, site.nodes)
    fix = {n.name: n for n in wide.graph.node}[site.nodes[0]]
    before = {n.name: n for n in quant.graph.node}[site.nodes[0]]
    pos = {a.name: onnx.helper.get_attribute_value(a) for a in before.attribute}["pos"]
    got = {a.name: onnx.helper.get_attribute_value(a) for a in fix.attribute}
    assert got["bit_width"] == 16 and got["pos"] == pos + 8
    assert len(got) == len(fix.attribute)  # each attribute once
    explicit = onnx.ModelProto()
    explicit.CopyFrom(quant)
    node = {n.name: n for n in explicit.graph.node}[site.nodes[0]]
    if not any(a.name == "bit_width" for a in node.attribute):
        node.attribute.append(onnx.helper.make_attribute("bit_width", 8))
    widened = {n.name: n for n in with_16_bits(explicit, site.nodes).graph.node}[site.nodes[0]]
    assert [a.i for a in widened.attribute if a.name == "bit_width"] == [16]
    assert with_16_bits(wide, site.nodes) is None  # already 16 bits: not applicable
    values = site_values(quant, site.tensor, digits_feeds(4, 200))
    ranged = with_range(quant, site.nodes, values)
    changed = [
        a.SerializeToString() != b.SerializeToString()
        for a, b in zip(quant.graph.node, ranged.graph.node, strict=True)
    ]
    assert sum(changed) <= 1  # only the site's FixNeuron (its position) may change
    new_pos = {
        a.name: onnx.helper.get_attribute_value(a)
        for a in {n.name: n for n in ranged.graph.node}[site.nodes[0]].attribute
    }["pos"]
    assert pos - 1 <= new_pos <= pos + 3


def test_bypassing_every_site_leaves_no_reader_of_a_rounded_activation(digits: Path) -> None:
    quant = _quantized(digits)
    sites = find_sites(quant)
    plain = bypass(quant, sites)
    read = {i for n in plain.graph.node for i in n.input}
    assert not read & {s.output for s in sites}
    assert read >= {s.tensor for s in sites}


def test_a_model_that_meets_the_tolerance_has_no_culprit(digits: Path) -> None:
    result = triage(str(digits), _quantized(digits), digits_feeds(4, 300), tolerance=0.99)
    assert result.culprits == [] and result.baseline >= 0.99 and result.runs == 1


def test_the_cli_reports_the_first_divergent_tensor(digits: Path, tmp_path: Path) -> None:
    quant = _quantized(digits)
    victim = find_sites(quant)[3].tensor
    onnx.save(_break_site(quant, victim), tmp_path / "broken.onnx")
    data = tmp_path / "data.npz"
    np.savez(data, input=np.concatenate([f["input"] for f in digits_feeds(8, 200)]))
    proc = run_cli(
        "triage", str(digits), str(tmp_path / "broken.onnx"), "--data", str(data), "--tolerance", "0.999"
    )
    assert proc.returncode == 0, proc.stderr
    assert f"first divergent tensor: {victim}" in proc.stdout
    assert "best remedy" in proc.stdout and "16-bit" in proc.stdout


def test_a_float_model_has_nothing_to_triage(digits: Path) -> None:
    with pytest.raises(OptionError, match="no activation quantizer"):
        triage(str(digits), onnx.load(digits), digits_feeds(2))
