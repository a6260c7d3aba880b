"""Tests for GetCapability: QDQ groups, the op table limits and the quantization rules, on real models."""

from __future__ import annotations

from pathlib import Path

import pytest

import zonnx.zoo
from tests.backend.partition_models import Models, diamond_model
from zonnx.backend.partition import propose
from zonnx.ir.io import load_model

TARGETS = ("dpu-b4096", "zhouyi-x2", "bm1684x")


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return Models(tmp_path_factory.mktemp("partition_models"))


@pytest.fixture(scope="session")
def diamond(models: Models) -> Path:
    return diamond_model(models.folder / "diamond_fix.onnx")


def test_digits_fixneuron_groups_on_dpu(models: Models) -> None:
    model = load_model(models.get("digits_cnn", "fix"))
    cap = propose(model, "dpu-b4096")
    assert cap.quantized and not cap.rejected
    conv = cap.nodes["/stem/stem.0/Conv"]
    assert (conv.role, conv.kind, conv.group, conv.macs) == ("op", "conv2d", "/stem/stem.0/Conv", 9216)
    assert cap.groups["/stem/stem.0/Conv"] == [
        "/stem/stem.0/Conv",
        "/stem/stem.2/Relu",
        "/stem/stem.2/Relu_output_0_FixNeuron",
    ]
    assert cap.nodes["/stem/stem.2/Relu"].role == "activation"
    assert cap.nodes["input_FixNeuron"].role == "dequantize"  # on a graph input: copied into its readers
    assert cap.nodes["/Add"].reason == "dpu-b4096 eltwise + Relu"
    assert cap.nodes["/fc/Gemm"].kind == "fully-connected"
    assert len(cap.groups) == 10  # 15 ops less the 5 Relu fused into their Conv or Add


def test_zhouyi_eltwise_fuses_no_activation(models: Models) -> None:
    cap = propose(load_model(models.get("digits_cnn", "fix")), "zhouyi-x2")
    add = cap.nodes["/Add"]
    assert not add.supported and add.rule == "activation"
    assert "Relu '/Relu' cannot be fused into zhouyi-x2's eltwise" in add.reason
    assert cap.nodes["/Relu"].rule == "not_quantized"
    assert cap.rules() == {"not_quantized": 2, "activation": 1}


def test_float_scales_need_multiplier_targets(models: Models) -> None:
    model = load_model(models.get("digits_cnn", "qdq"))
    dpu = propose(model, "dpu-b4096")
    conv = dpu.nodes["/stem/stem.0/Conv"]
    assert conv.rule == "scale" and "not a power of two" in conv.reason and "0.00" in conv.reason
    assert dpu.nodes["input_QuantizeLinear"].rule == "boundary"
    bm = propose(model, "bm1684x")
    assert not bm.rejected.keys() - {"input_QuantizeLinear"}


def test_asymmetric_activations_on_symmetric_target(models: Models) -> None:
    model = load_model(models.get("digits_cnn", "qdq_asym"))
    bm = propose(model, "bm1684x")
    conv = bm.nodes["/res/res.0/Conv"]
    assert conv.rule == "zero_point" and "bm1684x activations are symmetric" in conv.reason
    zhouyi = propose(model, "zhouyi-x2")  # asymmetric activations allowed
    assert zhouyi.nodes["/res/res.0/Conv"].supported


def test_float_model_is_not_quantized() -> None:
    model = load_model(zonnx.zoo.get("digits_cnn"))
    for target in TARGETS:
        cap = propose(model, target)
        assert not cap.quantized and not cap.supported
        assert set(cap.rules()) == {"not_quantized"} and sum(cap.rules().values()) == len(model.graph)
        assert all(v.reason.startswith("not quantized") for v in cap.nodes.values())


def test_unsupported_op_and_kernel_limit(diamond: Path) -> None:
    model = load_model(diamond)
    dpu = propose(model, "dpu-b4096")
    assert dpu.nodes["B"].rule == "op_type"
    assert dpu.nodes["B"].reason == "op type Softmax is not in dpu-b4096's operator table"
    e = dpu.nodes["E"]
    assert e.rule == "kernel" and "kernel 17x17 is outside [1, 16]" in e.reason and "conv2d" in e.reason
    assert dpu.nodes["A"].supported and dpu.nodes["C"].supported and dpu.nodes["D"].supported
    zhouyi = propose(model, "zhouyi-x2")  # no kernel limits; its Softmax has no exact lowering yet
    assert all(zhouyi.nodes[n].supported for n in "ACDE") and zhouyi.nodes["B"].rule == "no_lowering"


def test_resnet18_every_layer_fits_dpu(models: Models) -> None:
    model = load_model(models.get("resnet18-random", "fix"))
    cap = propose(model, "dpu-b4096")
    assert not cap.rejected
    assert sum(v.macs or 0 for v in cap.nodes.values()) == 1_814_073_344
    # the refinement pass's average-pool factor is part of the pool operation
    assert cap.nodes["/pool/GlobalAveragePool_npu_factor_Mul"].role == "activation"


def test_dynamic_shapes_need_input_shapes(models: Models) -> None:
    model = load_model(models.get("ppocr_cls", "qdq"))
    loose = propose(model, "bm1684x")
    first = loose.nodes["Conv@0"]
    assert first.rule == "dynamic_shape" and "static shapes" in first.reason
    fixed = propose(model, "bm1684x", input_shapes={"x": (1, 3, 48, 192)})
    assert fixed.nodes["Conv@0"].rule is None or fixed.nodes["Conv@0"].supported
    assert "input x[3] ('?') set to 192 (shape)" in fixed.notes
    assert fixed.nodes["Slice@0"].rule == "dtype"  # shape arithmetic on int64
