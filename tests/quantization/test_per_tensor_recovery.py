"""dpu-b4096's recipe equalizes before quantizing per-tensor weights (``build_npu.PER_TENSOR_WEIGHT_RECOVERY``),
and SmoothQuant on top of it lifts the weakest weights of the PP-OCRv4 rec model of the rapidocr wheel."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import zonnx
from zonnx import zoo
from zonnx.build_npu import PER_TENSOR_WEIGHT_RECOVERY, target_quantize_kwargs
from zonnx.quantization.api import QuantizeResult
from zonnx.quantization.calibration.readers import ListReader
from zonnx.zoo.text_images import rec_samples

_SHAPE = (1, 3, 48, 320)


def _feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    return [f for _, f in rec_samples(3 * n, seed=seed) if f["x"].shape == _SHAPE][:n]


def _quantize(calib: list, recovery: bool, smooth: bool = False) -> QuantizeResult:
    kwargs = target_quantize_kwargs("dpu-b4096")
    if not recovery:
        kwargs["extra_options"] = {
            k: v for k, v in kwargs["extra_options"].items() if k not in PER_TENSOR_WEIGHT_RECOVERY
        }
    if smooth:
        kwargs["extra_options"].update(SmoothQuant=True, SmoothQuantAlpha=0.5)
    return zonnx.quantize_static(zoo.get("ppocr_rec"), None, ListReader(calib), **kwargs)


def _frame_agreement(model: onnx.ModelProto, feeds: list, float_outputs: list[np.ndarray]) -> float:
    """Share of CTC frames whose most likely class is float's."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    same = [
        sess.run(None, f)[0].argmax(-1) == ref.argmax(-1) for f, ref in zip(feeds, float_outputs, strict=True)
    ]
    return float(np.mean(np.concatenate([s.ravel() for s in same])))


def _weight_sqnr(model: onnx.ModelProto, conv: str) -> float:
    """SQNR (dB) of a FixNeuron-quantized Conv weight at the position the model gives it."""
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    fix = {n.output[0]: n for n in model.graph.node if n.op_type == "FixNeuron"}
    node = next(n for n in model.graph.node if n.name == conv)
    neuron = fix[node.input[1]]
    w = weights[neuron.input[0]].astype(np.float64)
    pos = next(a.i for a in neuron.attribute if a.name == "pos")
    q = np.clip(np.round(w * 2.0**pos), -128, 127) / 2.0**pos
    return float(10 * np.log10((w**2).sum() / ((w - q) ** 2).sum()))


@pytest.fixture(scope="module")
def runs() -> dict[str, QuantizeResult]:
    calib = _feeds(16, seed=11)
    return {
        "plain": _quantize(calib, recovery=False),
        "recipe": _quantize(calib, recovery=True),
        "smoothed": _quantize(calib, recovery=True, smooth=True),
    }


def test_recipe_equalizes_and_says_so(runs) -> None:
    recovery = runs["recipe"].recovery
    assert "cle" in recovery and "smooth_quant" not in recovery
    assert "cle" not in runs["plain"].recovery
    assert "cle" in runs["smoothed"].recovery and "smooth_quant" in runs["smoothed"].recovery


def test_smooth_quant_lifts_the_weakest_pointwise_weights_and_the_output(runs) -> None:
    # the two 480x480 pointwise convolutions whose channel maxima run from 0 to 58 (HardSwish before
    # them: CLE cannot reach them, SmoothQuant can)
    for conv in ("p2o.Conv.28", "p2o.Conv.32"):
        before, after = _weight_sqnr(runs["recipe"].model, conv), _weight_sqnr(runs["smoothed"].model, conv)
        assert after > before + 6, (conv, before, after)  # measured: 13.9 -> 26.0 dB for Conv.28
    test = _feeds(24, seed=12)
    float_sess = ort.InferenceSession(str(zoo.get("ppocr_rec")), providers=["CPUExecutionProvider"])
    float_outputs = [float_sess.run(None, f)[0] for f in test]
    recipe = _frame_agreement(runs["recipe"].model, test, float_outputs)
    smoothed = _frame_agreement(runs["smoothed"].model, test, float_outputs)
    assert smoothed > recipe + 0.03, (recipe, smoothed)
