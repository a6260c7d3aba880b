"""Retargeting models quantized by other frameworks: torch eager QAT (via zonnx convert) and TFLite int8."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
import torch

from zonnx.backend.compile_api import compile_model
from zonnx.build_npu import target_quantize_kwargs
from zonnx.converters.from_torch import from_torch
from zonnx.quantization.api import quantize_static
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.prequant import quantized_form


@pytest.mark.parametrize("target", ["bm1684x", "dpu-b4096"])
def test_torch_qat_model_retargets(target: str, tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    from tests.converters.test_from_torch import quantized_net

    module = quantized_net("fbgemm", qat=True)
    conv = from_torch(module, torch.randn(1, 3, 16, 16))
    assert quantized_form(conv.model) == "qdq"
    src = tmp_path / "qat.onnx"
    onnx.save(conv.model, str(src))
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    with caplog.at_level(logging.WARNING):
        res = quantize_static(src, tmp_path / "out.onnx", ListReader(feeds), **target_quantize_kwargs(target))
    # dpu-b4096's recipe equalizes a float model: the QAT grids would no longer fit, so not here
    cle_dropped = "IncludeCLE skipped: the pre-quantized model's own grids are kept" in caplog.text
    assert cle_dropped == (target == "dpu-b4096")
    assert not {"cle", "smooth_quant"} & set(res.recovery)
    # the target snapped grids, so the recipe's bias correction ran, judged against the source (the QAT
    # model the retarget must reproduce), not the float network its weights dequantize to
    # (measured on these 4 samples: bm1684x 32.16 -> 30.34 dB, so undone; dpu-b4096 18.63 -> 20.67 dB, kept)
    record = res.recovery["bias_correction"]
    assert record.reference == "source model" and record.layers == 3, record.summary()
    assert record.undone == (target == "bm1684x"), record.summary()
    assert record.undone or record.sqnr_after > record.sqnr_before + 1.0, record.summary()
    rep = res.prequant
    assert rep.checked and min(r["cosine"] for r in rep.outputs.values()) > 0.98, rep.summary()
    assert rep.counts()["activation calibrated"] == 0  # every range came from the QAT grids
    assert compile_model(res.model, target).partition.mac_share > 0.95


def test_tflite_int8_model_retargets(tmp_path) -> None:
    from tests.converters import tf_models as tm
    from zonnx.converters.from_tflite import from_tflite

    conv = from_tflite(tm.tflite_file("functional", int8=True))
    src = tmp_path / "tfl.onnx"
    onnx.save(conv.model, str(src))
    inp = conv.model.graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)
    feeds = [{inp.name: rng.integers(-128, 127, shape).astype(np.int8)} for _ in range(4)]
    res = quantize_static(
        src, tmp_path / "out.onnx", ListReader(feeds), **target_quantize_kwargs("zhouyi-x2")
    )
    rep = res.prequant
    assert rep.form == "qdq" and rep.counts()["weight kept"] == 4
    assert min(r["cosine"] for r in rep.outputs.values()) > 0.999, rep.summary()
    assert compile_model(res.model, "zhouyi-x2").partition.mac_share > 0.95
