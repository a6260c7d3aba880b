"""Retargeting models quantized by ONNX Runtime (QOperator, QDQ, dynamic) and by torch's QAT."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import zonnx.zoo as zoo
from zonnx import quantize_static
from zonnx.backend.compile_api import compile_model
from zonnx.build_npu import target_quantize_kwargs
from zonnx.errors import OptionError
from zonnx.ir.io import to_ir, to_proto
from zonnx.passes.common.dynamic_to_qdq import DynamicToQDQPass
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.prequant import import_prequantized, quantized_form
from zonnx.verify import ort_session


class _Reader:
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.it, None)


@pytest.fixture(scope="module")
def ort_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """ResNet-18 quantized by onnxruntime.quantization itself: QOperator, QDQ (u8s8 per-channel), dynamic."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic
    from onnxruntime.quantization import quantize_static as ort_quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    d = tmp_path_factory.mktemp("prequant")
    pre = d / "r18_pre.onnx"
    quant_pre_process(str(zoo.get("resnet18-random")), str(pre))
    feeds = zoo.sample_inputs("resnet18-random", 4)
    out = {"float": pre}
    for fmt in ("QOperator", "QDQ"):
        out[fmt] = d / f"r18_{fmt}.onnx"
        ort_quantize_static(str(pre), str(out[fmt]), _Reader(feeds), quant_format=getattr(QuantFormat, fmt),
                            per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
    out["dynamic"] = d / "r18_dyn.onnx"
    quantize_dynamic(str(pre), str(out["dynamic"]), weight_type=QuantType.QInt8)
    return out


def _session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    """ORT with its fusions on the model's exact integer form (``verify.ort_session``: uint8 weights where
    this host's u8 x s8 kernels saturate), so both sides of a comparison sum exactly on every CPU."""
    return ort_session(model, optimize=True)


def _run(model: onnx.ModelProto | Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    return _session(model).run(None, feed)[0]


def test_forms_are_detected(ort_models: dict[str, Path]) -> None:
    forms = {k: quantized_form(onnx.load(str(p))) for k, p in ort_models.items()}
    assert forms == {"float": None, "QOperator": "qoperator", "QDQ": "qdq", "dynamic": "dynamic"}


@pytest.mark.parametrize("form", ["QOperator", "QDQ"])
def test_import_gives_float_model_with_every_grid(ort_models: dict[str, Path], form: str) -> None:
    model = to_ir(onnx.load(str(ort_models[form])))
    imported = import_prequantized(model)
    ops = Counter(n.op_type for n in model.graph)
    # 21 Conv/Gemm weights and 33 activations (input, 20 Conv, 8 Add, pool, Flatten...), no quantizer left;
    # the ReLUs ORT folded into u8 zero-point-0 grids come back (17 in ResNet-18)
    assert len(imported.weights) == 21 and len(imported.activations) == 33 and not imported.dynamic
    assert ops["Relu"] == 17 and ops["QuantizeLinear"] == ops["DequantizeLinear"] == 0
    feed = zoo.sample_inputs("resnet18-random", 2)[1]
    src, got = _run(ort_models[form], feed), _run(to_proto(model), feed)
    cos = float((src * got).sum() / np.linalg.norm(src) / np.linalg.norm(got))
    assert cos > 0.998, cos  # the float model computes what the source does, up to its rounding


def test_qdq_to_zhouyi_keeps_every_grid_and_the_source_outputs(
    ort_models: dict[str, Path], tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """zhouyi-x2 takes ORT's grids as they are: nothing snapped, the output equals the source's (so the
    recipe's bias correction has nothing to correct and is skipped, said)."""
    out = tmp_path / "z.onnx"
    with caplog.at_level(logging.WARNING):
        res = quantize_static(ort_models["QDQ"], out, ListReader(zoo.sample_inputs("resnet18-random", 2)),
                              **target_quantize_kwargs("zhouyi-x2"))  # fmt: skip
    counts = res.prequant.counts()
    assert counts == {"activation kept": 33, "weight kept": 21}, counts
    assert "BiasCorrection skipped: the retarget keeps every grid" in caplog.text
    assert "bias_correction" not in res.recovery
    assert res.prequant.checked and min(r["cosine"] for r in res.prequant.outputs.values()) > 0.99999
    ops = Counter(n.op_type for n in res.model.graph.node)
    # one layer of Q/DQ, not two; zhouyi-x2 cannot fuse Relu into a residual Add, so its refinement adds
    # one quantizer between each of the 8 Adds and its Relu
    assert ops["Add"] == 8 and ops["DequantizeLinear"] == 33 + 21 + 21 + 8 and ops["Conv"] == 20
    assert compile_model(out, "zhouyi-x2").partition.mac_share > 0.95


def test_qoperator_to_bm1684x_without_data(ort_models: dict[str, Path], tmp_path) -> None:
    """No calibration data: the source's ranges are enough; the report says no check was done."""
    res = quantize_static(
        ort_models["QOperator"], tmp_path / "b.onnx", None, **target_quantize_kwargs("bm1684x")
    )
    rep = res.prequant
    assert rep.form == "qoperator" and not rep.checked and "no accuracy check" in rep.summary()
    assert "bias_correction" not in res.recovery  # nothing to measure a correction on
    assert (
        rep.counts()["weight kept"] == 21
    )  # ORT's symmetric per-channel int8 weights fit bm1684x as they are
    # u8 zero-point-0 activations (after a ReLU) are kept: bm1684x takes uint8 for non-negative tensors;
    # the others (input, residual Adds: z != 0) become symmetric int8 holding the same range
    unsigned = [c for c in rep.changes if c.role == "activation" and c.source.endswith(" z=0")]
    assert len(unsigned) >= 17 and all(c.action == "kept" and c.target.startswith("uint8") for c in unsigned)
    snapped = [c for c in rep.changes if c.role == "activation" and c.action == "snapped"]
    assert snapped and all(c.target.startswith("int8") and " z=0" in c.target for c in snapped)
    assert not any(n.op_type.startswith("QLinear") for n in res.model.graph.node)
    assert compile_model(res.model, "bm1684x").partition.mac_share > 0.99


def test_dynamic_needs_calibration_data(ort_models: dict[str, Path], tmp_path) -> None:
    with pytest.raises(OptionError, match="dynamically quantized.*calibration data"):
        quantize_static(ort_models["dynamic"], tmp_path / "d.onnx", None, **target_quantize_kwargs("bm1684x"))
    assert not (tmp_path / "d.onnx").exists()


def test_dynamic_to_bm1684x_with_data(ort_models: dict[str, Path], tmp_path) -> None:
    res = quantize_static(ort_models["dynamic"], tmp_path / "d.onnx", ListReader(zoo.sample_inputs("resnet18-random", 4)),
                          **target_quantize_kwargs("bm1684x"))  # fmt: skip
    rep = res.prequant
    assert rep.form == "dynamic" and rep.counts()["activation calibrated"] == 33
    assert rep.counts()["weight kept"] + rep.counts()["weight snapped"] == 21  # grids follow folded weights
    assert min(r["cosine"] for r in rep.outputs.values()) > 0.99
    ops = {n.op_type for n in res.model.graph.node}
    assert not ops & {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"}
    assert compile_model(res.model, "bm1684x").partition.mac_share > 0.99


def test_dynamic_to_qdq_pass_keeps_each_op_exact(ort_models: dict[str, Path]) -> None:
    """Each ConvInteger/MatMulInteger becomes DQ -> float op on the same dynamic codes."""
    src = onnx.load(str(ort_models["dynamic"]))
    model = to_ir(src)
    result = DynamicToQDQPass()(model)
    assert result.changes.counts == {"ConvInteger -> DequantizeLinear/float op": 20,
                                     "MatMulInteger -> DequantizeLinear/float op": 1}  # fmt: skip
    out = to_proto(model)
    assert not {n.op_type for n in out.graph.node} & {"ConvInteger", "MatMulInteger", "Cast"}
    # the first layer alone (same codes in both): equal to float rounding
    first = next(n for n in src.graph.node if n.op_type == "ConvInteger")
    mul = next(n for n in src.graph.node if n.op_type == "Mul" and any(
        c.output[0] in n.input for c in src.graph.node if c.op_type == "Cast" and first.output[0] in c.input))  # fmt: skip
    feed = zoo.sample_inputs("resnet18-random", 1)[0]
    for m in (src, out):
        m.graph.output.append(onnx.helper.make_tensor_value_info(mul.output[0], onnx.TensorProto.FLOAT, None))
    a = _session(src).run([mul.output[0]], feed)[0]
    b = _session(out).run([mul.output[0]], feed)[0]
    assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
    # the whole network: rounding of later dynamic codes may flip, the output stays close
    a, b = _run(src, feed), _run(out, feed)
    assert np.abs(a - b).max() < 0.02 * np.ptp(a)


def test_requantize_calibrates_from_scratch(ort_models: dict[str, Path], tmp_path) -> None:
    kwargs = target_quantize_kwargs("bm1684x")
    kwargs["extra_options"]["PrequantRequantize"] = True
    # the recipe's bias correction asks for calibration samples first; without it, the ranges do
    with pytest.raises(OptionError, match="BiasCorrection needs calibration samples"):
        quantize_static(ort_models["QDQ"], tmp_path / "r.onnx", None, **kwargs)
    uncorrected = {**kwargs, "extra_options": {**kwargs["extra_options"], "BiasCorrection": False}}
    with pytest.raises(OptionError, match="no range in the pre-quantized model"):
        quantize_static(ort_models["QDQ"], tmp_path / "r.onnx", None, **uncorrected)
    res = quantize_static(
        ort_models["QDQ"], tmp_path / "r.onnx", ListReader(zoo.sample_inputs("resnet18-random", 4)), **kwargs
    )
    counts = res.prequant.counts()
    assert (
        counts["activation calibrated"] == 33
        and "activation kept" not in counts
        and "activation snapped" not in counts
    )
    assert min(r["cosine"] for r in res.prequant.outputs.values()) > 0.99
    # from scratch, the recipe's bias correction is measured against the float model, as for any model
    assert res.recovery["bias_correction"].reference == "float model"
