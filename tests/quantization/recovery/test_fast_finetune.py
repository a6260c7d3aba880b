"""Fast finetune (IncludeFastFT): AdaRound and AdaQuant on real quantized models, grids and ranges kept."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import zonnx
from tests.helpers import parse
from zonnx import zoo
from zonnx.build_npu import PER_TENSOR_WEIGHT_RECOVERY, target_quantize_kwargs
from zonnx.errors import OptionError
from zonnx.quantization.calibration.readers import CalibrationError, ListReader
from zonnx.quantization.enums import PowerOfTwoMethod, QuantFormat, VitisQuantFormat
from zonnx.quantization.options import parse_extra_options

_RNG = np.random.default_rng(7)
_W = (_RNG.normal(0, 0.25, (8, 4, 3, 3))).astype(np.float32)
_B = (_RNG.normal(0, 0.1, (8,))).astype(np.float32)
_CONV = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 4, 12, 12] x) => (float[N, 8, 12, 12] y) {
    c = Conv <pads = [1, 1, 1, 1]> (x, W, B)
    y = Relu (c)
}
"""


def _feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    # smooth-ish inputs with a channel offset, so the layer sees structured data
    base = rng.normal(0, 1, (n, 4, 6, 6)).astype(np.float32).repeat(2, axis=2).repeat(2, axis=3)
    x = (
        base
        + 0.3 * rng.normal(0, 1, base.shape).astype(np.float32)
        + np.arange(4, dtype=np.float32)[:, None, None] / 4
    )
    return [{"x": x[i : i + 1]} for i in range(n)]


@pytest.fixture(scope="module")
def conv_model() -> onnx.ModelProto:
    return parse(_CONV, ("W", _W), ("B", _B))


def _run(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, f)[0] for f in feeds]).astype(np.float64)


def _mse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean((a - b) ** 2))


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref**2) / np.sum((ref - got) ** 2)))


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _fix_attrs(model: onnx.ModelProto) -> dict[str, dict]:
    return {
        n.name: {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        for n in model.graph.node
        if n.op_type == "FixNeuron"
    }


def test_adaround_fixneuron_power_of_two(conv_model: onnx.ModelProto, caplog) -> None:
    calib, held_out = _feeds(32, 1), _feeds(32, 2)
    pof2 = dict(quant_format=VitisQuantFormat.FixNeuron, calibrate_method=PowerOfTwoMethod.MinMSE)
    base = zonnx.quantize_static(conv_model, None, ListReader(calib), **pof2)
    ft = {"OptimAlgorithm": "adaround", "NumIterations": 300, "BatchSize": 4, "FixedSeed": 3}
    with caplog.at_level(logging.INFO, logger="zonnx.quantization.recovery"):
        tuned = zonnx.quantize_static(
            conv_model,
            None,
            ListReader(calib),
            **pof2,
            extra_options={"IncludeFastFT": True, "FastFinetune": ft},
        )
    outcome = tuned.recovery["fast_finetune"]
    assert [o.name for o in outcome.layers] == ["Conv_0"] and outcome.samples == 32
    layer = outcome.layers[0]
    assert layer.iterations == 300 and layer.loss_after < 0.9 * layer.loss_before, layer
    assert any(
        "fast finetune (adaround): 1 of 1 layers tuned on 32 samples" in r.message for r in caplog.records
    )

    # positions (and every other FixNeuron attribute) are unchanged
    assert _fix_attrs(tuned.model) == _fix_attrs(base.model)
    # the float weight now lies on the grid, one step at most from round-to-nearest, within the range
    fix_w = next(n for n in tuned.model.graph.node if n.op_type == "FixNeuron" and n.input[0] == "W")
    attrs = _fix_attrs(tuned.model)[fix_w.name]
    codes = _inits(tuned.model)["W"].astype(np.float64) * 2.0 ** attrs["pos"]
    assert np.array_equal(codes, np.rint(codes))
    nearest = np.clip(np.rint(_W.astype(np.float64) * 2.0 ** attrs["pos"]), -128, 127)
    assert np.abs(codes - nearest).max() == 1 and codes.min() >= -128 and codes.max() <= 127
    changed = int(np.count_nonzero(codes != nearest))
    assert changed == layer.codes_changed and 0 < changed < codes.size // 2
    assert np.array_equal(_inits(tuned.model)["B"], _inits(base.model)["B"])  # AdaRound keeps the bias

    # the whole model's output moves towards float, on the calibration and on held-out samples
    for feeds in (calib, held_out):
        ref = _run(conv_model, feeds)
        assert _mse(ref, _run(tuned.model, feeds)) < 0.95 * _mse(ref, _run(base.model, feeds))


def test_adaquant_qdq_per_channel_updates_codes_and_bias(conv_model: onnx.ModelProto) -> None:
    calib = _feeds(16, 3)
    args = dict(quant_format=QuantFormat.QDQ, per_channel=True, activation_type="int8")
    base = zonnx.quantize_static(conv_model, None, ListReader(calib), **args)
    ft = {"OptimAlgorithm": "adaquant", "NumIterations": 200, "BatchSize": 4}
    tuned = zonnx.quantize_static(
        conv_model, None, ListReader(calib), **args, extra_options={"IncludeFastFT": True, "FastFinetune": ft}
    )
    before, after = _inits(base.model), _inits(tuned.model)
    assert set(before) == set(after)
    for name, arr in before.items():  # scales and zero points stay, only codes move
        if "scale" in name or "zero_point" in name:
            assert np.array_equal(arr, after[name]), name
    w_codes, b_codes = after["W_quantized"], after["B_quantized"]
    assert w_codes.dtype == np.int8 and b_codes.dtype == np.int32
    assert w_codes.min() >= -127 and w_codes.max() <= 127  # ORT's restricted range for symmetric weights
    assert not np.array_equal(w_codes, before["W_quantized"])
    assert not np.array_equal(b_codes, before["B_quantized"])
    layer = tuned.recovery["fast_finetune"].layers[0]
    assert layer.loss_after < layer.loss_before
    ref = _run(conv_model, calib)
    assert _mse(ref, _run(tuned.model, calib)) < _mse(ref, _run(base.model, calib))


def test_too_few_samples_is_one_clear_error(conv_model: onnx.ModelProto) -> None:
    extra = {"IncludeFastFT": True, "FastFinetune": {"BatchSize": 8}}
    with pytest.raises(CalibrationError, match="needs at least 8 calibration sample.*got 3"):
        zonnx.quantize_static(conv_model, None, ListReader(_feeds(3, 0)), extra_options=extra)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"IncludeFastFT": True, "FastFinetune": {"NumIteration": 5}}, "Did you mean 'NumIterations'"),
        ({"FastFinetune": {"NumIterations": 5}}, "IncludeFastFT is not True"),
        ({"IncludeFastFT": True, "FastFinetune": {"OptimAlgorithm": "adaqant"}}, "Did you mean 'adaquant'"),
        (
            {"IncludeFastFT": True, "FastFinetune": {"UpdateBias": True}},
            "AdaRound only chooses weight rounding",
        ),
        ({"IncludeFastFT": True, "FastFinetune": {"NumBatches": 2}}, "does not implement"),
        ({"IncludeFastFT": True, "FastFinetune": {"OptimDevice": "cuda:0"}}, "CPU only"),
        ({"IncludeFastFT": True, "FastFinetune": {"BetaRange": [2, 20]}}, "start >= end"),
        ({"IncludeFastFT": True, "FastFinetune": {"TargetOpType": ["Conv", "LSTM"]}}, "TargetOpType"),
        ({"IncludeFastFT": True, "FastFinetune": {"NumIterations": True}}, "expected int"),
        ({"IncludeFastFT": True, "FastFinetune": {"MaxSeconds": 0}}, r"MaxSeconds.*positive.*inf: no bound"),
        ({"IncludeFastFT": True, "FastFinetune": {"MaxSeconds": float("nan")}}, "MaxSeconds"),
        ({"IncludeFastFT": True, "FastFinetune": {"LearningRate": float("inf")}}, "LearningRate"),
    ],
)
def test_fast_finetune_options_are_strict(extra: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_extra_options(extra)


def test_defaults_follow_vitis() -> None:
    ft = parse_extra_options(
        {"IncludeFastFT": True, "FastFinetune": {"OptimAlgorithm": "AdaQuant"}}
    ).fast_finetune
    assert (ft.optim_algorithm, ft.num_iterations, ft.learning_rate, ft.batch_size) == (
        "adaquant",
        1000,
        0.1,
        1,
    )
    assert (ft.reg_param, ft.beta_range, ft.warm_start) == (0.01, (20.0, 2.0), 0.2)


def test_qoperator_is_refused_before_calibration(conv_model: onnx.ModelProto) -> None:
    with pytest.raises(OptionError, match="QOperator"):
        zonnx.quantize_static(
            conv_model, None, None, quant_format=QuantFormat.QOperator, extra_options={"IncludeFastFT": True}
        )


def test_fast_finetune_without_samples_is_refused_before_anything_is_written(
    conv_model: onnx.ModelProto, tmp_path: Path
) -> None:
    out = tmp_path / "q.onnx"
    with pytest.raises(OptionError, match="IncludeFastFT needs calibration samples"):
        zonnx.quantize_static(conv_model, out, None, extra_options={"IncludeFastFT": True})
    assert not out.exists()


def test_mobilenetv2_dpu_adaround_improves_held_out_sqnr() -> None:
    """The random-weight MobileNetV2 overfits fast finetune easily (with 8 images or 20 steps the held-out
    SQNR can fall while the calibration SQNR rises); 16 images and 50 steps gain about 0.15 dB."""
    src = zoo.get("mobilenetv2-random")
    calib, held_out = (
        zoo.sample_inputs("mobilenetv2-random", 16),
        zoo.sample_inputs("mobilenetv2-random", 16, seed=5),
    )
    kwargs = target_quantize_kwargs("dpu-b4096")
    extra = dict(kwargs.pop("extra_options"))
    assert extra == {"Target": "dpu-b4096", "BiasCorrection": True, **PER_TENSOR_WEIGHT_RECOVERY}
    extra["BiasCorrection"] = False  # fast finetune alone against the same recipe without it
    base = zonnx.quantize_static(src, None, ListReader(calib), **kwargs, extra_options=extra)
    ft = {"OptimAlgorithm": "adaround", "NumIterations": 50, "FixedSeed": 0}
    tuned = zonnx.quantize_static(
        src,
        None,
        ListReader(calib),
        **kwargs,
        extra_options={**extra, "IncludeFastFT": True, "FastFinetune": ft},
    )
    outcome = tuned.recovery["fast_finetune"]
    assert outcome.tuned == 53 and not outcome.skipped and outcome.samples == 16  # 52 Conv + the classifier
    assert _fix_attrs(tuned.model) == _fix_attrs(base.model)  # power-of-two positions kept
    ref = _run(onnx.load(src), held_out)
    gain = _sqnr(ref, _run(tuned.model, held_out)) - _sqnr(ref, _run(base.model, held_out))
    assert gain > 0.05, gain


def test_selective_update_keeps_weights_that_got_worse(conv_model: onnx.ModelProto) -> None:
    calib = _feeds(8, 4)
    base = zonnx.quantize_static(conv_model, None, ListReader(calib))
    # AdaQuant with a huge step size wanders far from any good code; SelectiveUpdate refuses the result
    ft = {"OptimAlgorithm": "adaquant", "NumIterations": 30, "LearningRate": 1000.0, "SelectiveUpdate": True}
    tuned = zonnx.quantize_static(
        conv_model, None, ListReader(calib), extra_options={"IncludeFastFT": True, "FastFinetune": ft}
    )
    layer = tuned.recovery["fast_finetune"].layers[0]
    assert (
        layer.loss_after > layer.loss_before and not layer.kept and tuned.recovery["fast_finetune"].tuned == 0
    )
    for name, arr in _inits(base.model).items():
        assert np.array_equal(arr, _inits(tuned.model)[name]), name


def test_max_seconds_inf_is_no_bound_and_repeats_the_same_weights(conv_model: onnx.ModelProto) -> None:
    calib = _feeds(4, 5)
    ft = {"OptimAlgorithm": "adaquant", "NumIterations": 20, "MaxSeconds": math.inf}
    runs = [
        zonnx.quantize_static(
            conv_model, None, ListReader(calib), extra_options={"IncludeFastFT": True, "FastFinetune": ft}
        )
        for _ in range(2)
    ]
    assert runs[0].recovery["fast_finetune"].tuned == 1
    assert [o.iterations for o in runs[0].recovery["fast_finetune"].layers] == [20]
    first, second = (_inits(r.model) for r in runs)
    assert all(np.array_equal(first[name], second[name]) for name in first)


def test_max_seconds_leaves_later_layers_alone(conv_model: onnx.ModelProto, caplog) -> None:
    calib = _feeds(4, 5)
    base = zonnx.quantize_static(conv_model, None, ListReader(calib))
    ft = {"MaxSeconds": 1e-9}
    with caplog.at_level(logging.WARNING):
        tuned = zonnx.quantize_static(
            conv_model, None, ListReader(calib), extra_options={"IncludeFastFT": True, "FastFinetune": ft}
        )
    outcome = tuned.recovery["fast_finetune"]
    assert outcome.layers == [] and "MaxSeconds" in outcome.skipped["Conv_0"]
    assert any(
        "1 of 1 layers were not tuned" in r.message and "depends on this machine's speed" in r.message
        for r in caplog.records
    )
    for name, arr in _inits(base.model).items():
        assert np.array_equal(arr, _inits(tuned.model)[name]), name


def test_transformer_matmuls_qdq() -> None:
    src = zoo.get("transformer-random")
    calib, held_out = (
        zoo.sample_inputs("transformer-random", 8),
        zoo.sample_inputs("transformer-random", 16, seed=9),
    )
    base = zonnx.quantize_static(src, None, ListReader(calib), activation_type="int8")
    ft = {"NumIterations": 50, "BatchSize": 2}
    tuned = zonnx.quantize_static(
        src,
        None,
        ListReader(calib),
        activation_type="int8",
        extra_options={"IncludeFastFT": True, "FastFinetune": ft},
    )
    outcome = tuned.recovery["fast_finetune"]
    assert [o.op_type for o in outcome.layers].count("MatMul") == 12 and outcome.tuned == 13
    # attention's activation x activation MatMuls are left alone, with the reason
    assert len(outcome.skipped) == 4
    assert set(outcome.skipped.values()) == {"its second input is not a constant weight in the float model"}
    ref = _run(onnx.load(src), held_out)
    assert _sqnr(ref, _run(tuned.model, held_out)) > _sqnr(ref, _run(base.model, held_out)) + 0.5


def test_a_learned_bias_that_jumps_a_coarse_grid_step_is_not_kept() -> None:
    """AdaQuant's bias moves straight through its grid; on a grid far coarser than the layer's error (8-bit
    power-of-two biases on a DPU) it lands a whole step off (here [0, -1, 1] where the best is 0, which
    doubles the loss), so the learned bias stays only when it lowers the loss beside the new weights."""
    import torch

    from zonnx.quantization.recovery.finetune_layers import Grid
    from zonnx.quantization.recovery.finetune_optimize import LayerData, LayerOp, TuneSettings, tune_layer

    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 4, 1, 1)).astype(np.float32)
    x = rng.normal(size=(16, 4, 6, 6)).astype(np.float32) * 10
    y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.tensor([0.3, -0.3, 0.45]))
    data = LayerData(torch.from_numpy(np.round(x * 8) / 8), torch.from_numpy(x), y)
    weights, biases = (
        Grid(np.float32(1 / 64), np.int64(0), -128, 127),
        Grid(np.float32(1), np.int64(0), -128, 127),
    )
    op = LayerOp("conv", {"strides": [1, 1], "dilations": [1, 1], "group": 1})
    settings = TuneSettings("adaquant", 1000, 0.1, 4, 0.01, (20.0, 2.0), 0.2, 0.5, True, 0)
    tuned = tune_layer(
        op, data, w, weights, weights.nearest(w), np.zeros(3, np.float32), biases, settings, math.inf
    )
    assert tuned.bias is None  # the bias it started from stays
    assert tuned.loss_after < 1.01 * tuned.loss_before
