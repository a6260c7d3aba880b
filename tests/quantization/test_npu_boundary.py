"""A node left float on an NPU target costs only itself: the int8 tensor its NPU producer hands it is
quantized (the boundary), so the producer's group stays on the NPU."""

from __future__ import annotations

import logging

import pytest

import zonnx
from zonnx import zoo
from zonnx.build_npu import target_quantize_kwargs
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.search.scorer import npu_partition
from zonnx.zoo.text_images import rec_samples

SHAPE = (1, 3, 48, 320)


@pytest.fixture(scope="module")
def rec_calib() -> list:
    return [f for _, f in rec_samples(12, seed=5) if f["x"].shape == SHAPE][:4]


def _quantize(rec_calib: list, exclude: list[str]):
    kwargs = target_quantize_kwargs("dpu-b4096")
    kwargs["extra_options"].update(BiasCorrection=False, IncludeCLE=False)  # seconds, not minutes
    kwargs["nodes_to_exclude"] = exclude
    return zonnx.quantize_static(zoo.get("ppocr_rec"), None, ListReader(rec_calib), **kwargs).model


def test_an_offset_add_left_float_keeps_its_convolution_on_the_npu(rec_calib: list, caplog) -> None:
    """PP-OCRv4 rec for dpu-b4096: the first of PP-LCNetV3's offset Adds (``x + d`` after a hard-swish,
    made by fold-conv-affine) left float. dpu-b4096 fuses the hard-swish into its convolution and does not
    quantize it as an op, so the hard-swish output is quantized only as the Add's input; left float, the
    Add still reads it quantized, and only the Add goes to the CPU."""
    with caplog.at_level(logging.ERROR):
        plain = _quantize(rec_calib, [])
        model = _quantize(rec_calib, ["node_Add_0"])
    add = next(n for n in model.graph.node if n.name == "node_Add_0")
    producers = {o: n for n in model.graph.node for o in n.output}
    fix = producers[add.input[0]]
    assert fix.op_type == "FixNeuron" and producers[fix.input[0]].op_type == "HardSwish"
    shapes = {"x": list(SHAPE)}
    part, base = npu_partition(model, "dpu-b4096", shapes), npu_partition(plain, "dpu-b4096", shapes)
    assert "node_Add_0" in part.cpu_nodes and "node_Add_0" not in base.cpu_nodes
    boundary = {fix.name} | {n.name for n in model.graph.node if "val_0" in n.input}  # its quantizers
    assert set(part.cpu_nodes) - set(base.cpu_nodes) <= {"node_Add_0"} | boundary
    assert part.mac_share == pytest.approx(base.mac_share, abs=1e-9)  # the Add has no MACs


def test_the_rule_is_the_targets_only(rec_calib: list) -> None:
    """Without a target nothing is added (ORT's placement); with one, the op types the rule reads are the
    target's: its op table and the activations it fuses (dpu-b4096 runs HardSwish, not Sigmoid)."""
    import onnx_ir as ir

    from zonnx.quantization.annotate_config import annotate_config
    from zonnx.quantization.api import build_config

    model = ir.load(str(zoo.get("ppocr_rec")))
    assert annotate_config(model, build_config(nodes_to_exclude=["p2o.Conv.1"])).npu_ops == frozenset()
    npu = annotate_config(model, build_config(**target_quantize_kwargs("dpu-b4096"))).npu_ops
    assert {"Conv", "HardSwish", "Add"} <= npu and "Sigmoid" not in npu
