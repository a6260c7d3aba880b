"""Cross-layer equalization: exact on parsed models (Conv, depthwise, Gemm/MatMul pairs), refusals, wiring,
and the gain on the zoo MobileNetV2 under power-of-two per-tensor quantization."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest

import zonnx
from tests.helpers import parse
from tests.quantization.recovery.measure import layer_sqnrs
from zonnx import zoo
from zonnx.build_npu import target_quantize_kwargs
from zonnx.errors import OptionError
from zonnx.ir.io import to_ir, to_proto
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.enums import PowerOfTwoMethod, VitisQuantFormat
from zonnx.quantization.recovery.cle import equalize, find_pairs
from zonnx.quantization.recovery.relu6 import replace_clip6_relu
from zonnx.verify import run_ort
from zonnx.zoo.digits import digits_data

RNG = np.random.default_rng(7)


def _spread(shape: tuple[int, ...], axis: int = 0) -> np.ndarray:
    """Random weights whose channels on ``axis`` have ranges from 0.01 to 10."""
    w = RNG.standard_normal(shape).astype(np.float32)
    scales = np.logspace(-2, 1, shape[axis]).astype(np.float32)
    RNG.shuffle(scales)
    view = [1] * len(shape)
    view[axis] = -1
    return w * scales.reshape(view)


def conv_pair(act: str = "r = Relu(a)") -> onnx.ModelProto:
    return parse(
        f"""<ir_version: 8, opset_import: ["" : 13]>
        g (float[2,4,8,8] x) => (float[2,4,8,8] y) {{
          a = Conv <pads=[1,1,1,1]> (x, w1, b1)
          {act}
          y = Conv <pads=[1,1,1,1]> (r, w2, b2)
        }}""",
        ("w1", _spread((8, 4, 3, 3))),
        ("b1", RNG.standard_normal(8).astype(np.float32)),
        ("w2", RNG.standard_normal((4, 8, 3, 3)).astype(np.float32)),
        ("b2", RNG.standard_normal(4).astype(np.float32)),
        ("lo", np.array(0.0, np.float32)),
        ("hi", np.array(6.0, np.float32)),
    )


def depthwise_chain() -> onnx.ModelProto:
    return parse(
        """<ir_version: 8, opset_import: ["" : 13]>
        g (float[2,4,8,8] x) => (float[2,4,8,8] y) {
          a = Conv (x, w1, b1)
          r = Relu(a)
          d = Conv <group=8, pads=[1,1,1,1]> (r, w2, b2)
          s = Relu(d)
          y = Conv (s, w3, b3)
        }""",
        ("w1", _spread((8, 4, 1, 1))),
        ("b1", RNG.standard_normal(8).astype(np.float32)),
        ("w2", _spread((8, 1, 3, 3))),
        ("b2", RNG.standard_normal(8).astype(np.float32)),
        ("w3", RNG.standard_normal((4, 8, 1, 1)).astype(np.float32)),
        ("b3", RNG.standard_normal(4).astype(np.float32)),
    )


def dense_chain() -> onnx.ModelProto:
    return parse(
        """<ir_version: 8, opset_import: ["" : 13]>
        g (float[3,6] x) => (float[3,4] y) {
          a = MatMul(x, m1)
          p = PRelu(a, slope)
          g1 = Gemm <transB=1> (p, w2, c2)
          l = LeakyRelu <alpha=0.2> (g1)
          y = Gemm (l, w3, c3)
        }""",
        ("m1", _spread((6, 5), axis=1)),
        ("slope", np.linspace(0.1, 0.5, 5).astype(np.float32)),
        ("w2", _spread((3, 5), axis=0)),
        ("c2", RNG.standard_normal(3).astype(np.float32)),
        ("w3", RNG.standard_normal((3, 4)).astype(np.float32)),
        ("c3", RNG.standard_normal(4).astype(np.float32)),
    )


def _feeds(model: onnx.ModelProto, n: int = 1) -> list[dict[str, np.ndarray]]:
    inp = model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    return [{inp.name: RNG.standard_normal(shape).astype(np.float32)} for _ in range(n)]


def _equalized(model: onnx.ModelProto, **kwargs: int) -> tuple[onnx.ModelProto, object]:
    work = to_ir(onnx.ModelProto.FromString(model.SerializeToString()))
    record = equalize(work, **kwargs)
    return to_proto(work), record


def _assert_same_outputs(a: onnx.ModelProto, b: onnx.ModelProto) -> None:
    feed = _feeds(a)[0]
    for x, y in zip(run_ort(a, feed).values(), run_ort(b, feed).values(), strict=True):
        assert np.abs(x - y).max() <= 1e-4 * np.abs(x).max()


def _w(model: onnx.ModelProto, name: str) -> np.ndarray:
    return next(onnx.numpy_helper.to_array(i) for i in model.graph.initializer if i.name == name)


def test_conv_relu_conv_is_equalized_and_outputs_unchanged() -> None:
    model = conv_pair()
    after, record = _equalized(model, append_bias=False)
    assert record.pairs == 1 and record.steps == 1
    _assert_same_outputs(model, after)
    r1 = np.abs(_w(after, "w1")).reshape(8, -1).max(axis=1)
    r2 = np.abs(_w(after, "w2")).transpose(1, 0, 2, 3).reshape(8, -1).max(axis=1)
    np.testing.assert_allclose(r1, r2, rtol=1e-5)  # both layers see sqrt(r1 * r2) on every channel
    # spread 0.01..10 on w1 alone becomes sqrt of it on both layers
    assert record.range_ratio_before > 300 and record.range_ratio_after < record.range_ratio_before / 10


def test_depthwise_chain_converges_with_steps() -> None:
    model = depthwise_chain()
    one, rec1 = _equalized(model, steps=1, append_bias=False)
    many, rec4 = _equalized(model, steps=8, append_bias=False)
    assert rec1.pairs == rec4.pairs == 2
    _assert_same_outputs(model, one)
    _assert_same_outputs(model, many)

    def imbalance(m: onnx.ModelProto) -> float:
        """Largest |log(r_out / r_in)| over the channels between w1 and the depthwise w2."""
        r1 = np.abs(_w(m, "w1")).reshape(8, -1).max(axis=1)
        r2 = np.abs(_w(m, "w2")).reshape(8, -1).max(axis=1)
        return float(np.abs(np.log(r1 / r2)).max())

    assert imbalance(model) > imbalance(one) > imbalance(many)
    assert rec4.range_ratio_after < rec1.range_ratio_before
    w3 = np.abs(_w(many, "w3")).transpose(1, 0, 2, 3).reshape(8, -1).max(axis=1)
    np.testing.assert_allclose(np.abs(_w(many, "w2")).reshape(8, -1).max(axis=1), w3, rtol=1e-5)


def test_matmul_prelu_gemm_leaky_gemm_outputs_unchanged() -> None:
    model = dense_chain()
    after, record = _equalized(model, steps=2)
    assert record.pairs == 2
    _assert_same_outputs(model, after)
    assert not np.array_equal(_w(model, "c2"), _w(after, "c2"))  # Gemm C scaled with its channels


def _pow2_step(w: np.ndarray) -> float:
    return 2.0 ** np.ceil(np.log2(np.abs(w).max() / 127.0))


def test_power_of_two_pair_is_equalized_to_finer_steps_and_stays_exact() -> None:
    model = conv_pair()
    after, record = _equalized(model, power_of_two=True)
    assert record.pairs == 1 and record.kept_pow2 == 0
    _assert_same_outputs(model, after)
    w1, w2 = _w(after, "w1"), _w(after, "w2")
    product = _pow2_step(w1) * _pow2_step(w2)
    assert product <= _pow2_step(_w(model, "w1")) * _pow2_step(_w(model, "w2")) / 2
    # the smallest product any scaling reaches: that of the largest per-channel range product
    r1 = np.abs(_w(model, "w1")).reshape(8, -1).max(axis=1)
    r2 = np.abs(_w(model, "w2")).max(axis=(0, 2, 3))
    assert product == 2.0 ** np.ceil(np.log2((r1 * r2).max() / 127.0**2))
    # both layers' largest values sit in the top half of their power-of-two grids
    assert np.abs(w1).max() > 63.5 * _pow2_step(w1) and np.abs(w2).max() > 63.5 * _pow2_step(w2)
    # the split keeps the activations' magnitude: the scales' geometric mean is within a factor 2 of 1
    s = np.abs(_w(model, "w1")).reshape(8, -1).max(axis=1) / np.abs(w1).reshape(8, -1).max(axis=1)
    assert 0.5 < np.exp(np.log(s).mean()) < 2.0


def _balanced_pair() -> onnx.ModelProto:
    """A Conv-Relu-Conv pair whose channel ranges are all 0.9 in both layers."""
    model = conv_pair()
    for init in model.graph.initializer:
        if init.name in ("w1", "w2"):
            w = RNG.uniform(-0.5, 0.5, tuple(init.dims)).astype(np.float32)
            w.reshape(w.shape[0], -1)[:, 0] = 0.9  # every channel's range is 0.9 in both layers
            if init.name == "w2":
                w[:, :, 0, 0] = 0.9
            init.CopyFrom(onnx.numpy_helper.from_array(w, init.name))
    return model


def test_power_of_two_pair_that_cannot_get_finer_steps_is_left_as_it_is() -> None:
    """Balanced channels: any scaling keeps (or coarsens) the two power-of-two steps, so nothing moves."""
    model = _balanced_pair()
    after, record = _equalized(model, power_of_two=True, steps=3)
    assert record.pairs == 1 and record.kept_pow2 == 1 and "1 of them left as they were" in record.summary()
    assert after.SerializeToString() == to_proto(to_ir(model)).SerializeToString()
    _, plain = _equalized(model, steps=3)
    assert plain.kept_pow2 == 0  # without power-of-two grids the same pair is equalized


def test_clip6_and_no_pair_leave_model_unchanged_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    model = conv_pair("r = Clip(a, lo, hi)")
    pairs, refused = find_pairs(to_ir(model))
    assert not pairs and "ReplaceClip6Relu" in refused[0]
    with caplog.at_level(logging.WARNING):
        after, record = _equalized(model)
    assert record.pairs == 0 and "no equalizable" in caplog.text
    assert after.SerializeToString() == to_proto(to_ir(model)).SerializeToString()
    single = parse(
        """<ir_version: 8, opset_import: ["" : 13]>
        g (float[1,4,8,8] x) => (float[1,8,8,8] y) { y = Conv <pads=[1,1,1,1]> (x, w1, b1) }""",
        ("w1", _spread((8, 4, 3, 3))),
        ("b1", np.zeros(8, np.float32)),
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        after, record = _equalized(single)
    assert record.pairs == 0 and "no equalizable" in caplog.text
    np.testing.assert_array_equal(_w(after, "w1"), _w(single, "w1"))


def test_shared_intermediate_is_refused() -> None:
    model = parse(
        """<ir_version: 8, opset_import: ["" : 13]>
        g (float[1,4,8,8] x) => (float[1,4,8,8] y, float[1,8,8,8] r) {
          a = Conv <pads=[1,1,1,1]> (x, w1, b1)
          r = Relu(a)
          y = Conv <pads=[1,1,1,1]> (r, w2, b2)
        }""",
        ("w1", _spread((8, 4, 3, 3))),
        ("b1", np.zeros(8, np.float32)),
        ("w2", RNG.standard_normal((4, 8, 3, 3)).astype(np.float32)),
        ("b2", np.zeros(4, np.float32)),
    )
    pairs, refused = find_pairs(to_ir(model))
    assert not pairs and "graph output" in refused[0]


def test_replace_clip6_relu_then_equalize() -> None:
    model = to_ir(conv_pair("r = Clip(a, lo, hi)"))
    assert replace_clip6_relu(model) == 1
    proto = to_proto(model)
    assert [n.op_type for n in proto.graph.node] == ["Conv", "Relu", "Conv"]
    assert {i.name for i in proto.graph.initializer} == {"w1", "b1", "w2", "b2"}
    assert equalize(model).pairs == 1


def test_quantize_static_options() -> None:
    model = conv_pair()
    reader = ListReader(_feeds(model, 4))
    result = zonnx.quantize_static(
        model, None, reader, extra_options={"IncludeCLE": True, "CLESteps": 3, "CLEScaleAppendBias": False}
    )
    record = result.recovery["cle"]
    assert record.pairs == 1 and record.steps == 3
    # power-of-two weight grids (FixNeuron) switch the rule on; float scales keep plain equalization
    balanced, options = _balanced_pair(), {"IncludeCLE": True}
    pow2 = dict(quant_format=VitisQuantFormat.FixNeuron, calibrate_method=PowerOfTwoMethod.MinMSE)
    feeds = _feeds(balanced, 2)
    pot = zonnx.quantize_static(balanced, None, ListReader(feeds), extra_options=options, **pow2).recovery[
        "cle"
    ]
    floats = zonnx.quantize_static(
        balanced, None, ListReader(feeds), extra_options=options, per_channel=False
    )
    assert (pot.kept_pow2, floats.recovery["cle"].kept_pow2) == (1, 0)
    with pytest.raises(OptionError, match="IncludeCLE=True"):
        zonnx.quantize_static(model, None, reader, extra_options={"CLESteps": 2})
    with pytest.raises(OptionError, match="CLESteps"):
        zonnx.quantize_static(model, None, reader, extra_options={"IncludeCLE": True, "CLESteps": 0})


def test_mobilenetv2_pof2_gains_from_cle() -> None:
    """Mean SQNR of the Conv/Gemm outputs on held-out images. (The logits of this random-weight net are
    chaotic, input noise at 60 dB leaves 17 dB there, so output SQNR hides weight-level gains.)"""
    feeds = zoo.sample_inputs("mobilenetv2-random", 4)
    calib, held = feeds[:2], feeds[2:]
    prepared = to_ir(zonnx.optimize(zoo.get("mobilenetv2-random")))
    assert replace_clip6_relu(prepared) > 30  # ReLU6 blocks equalization; the baseline gets the same model
    relu = to_proto(prepared)
    record = equalize(prepared, steps=4, power_of_two=True)
    assert record.pairs > 30 and record.kept_pow2 < record.pairs
    equalized = to_proto(prepared)
    kwargs = dict(quant_format=VitisQuantFormat.FixNeuron, calibrate_method=PowerOfTwoMethod.MinMSE)
    plain = zonnx.quantize_static(relu, None, ListReader(calib), **kwargs).model
    cle = zonnx.quantize_static(equalized, None, ListReader(calib), **kwargs).model
    before = layer_sqnrs(relu, plain, held).mean()
    after = layer_sqnrs(equalized, cle, held).mean()
    assert after > before + 0.5, (before, after)


def test_bias_in_the_balance_is_an_option_and_the_default_keeps_plain_accuracy_on_the_digits_cnn() -> None:
    """dpu-b4096 power-of-two per-tensor, logits SQNR on 256 held-out digits: CLEScaleAppendBias reaches
    the equalization (the models differ), and the default (biases left out) keeps plain MinMSE's figure.

    Which of the two balances is better is this trained model's accident, not a rule: the digits CNN's
    weights differ per CPU (zonnx/zoo/digits.py). Measured (plain, default, with bias): 32.80, 32.81, 32.24
    dB on the AVX-512 VNNI host where the default was chosen; 30.69, 30.69, 31.36 on an AMD Zen 3 host."""
    src = zonnx.optimize(zoo.get("digits_cnn"))
    x_cal, _ = digits_data("calib")
    x_te, _ = digits_data("test")
    calib = [{"input": x_cal[i : i + 1]} for i in range(32)]
    held = [{"input": x_te[i : i + 64]} for i in range(0, 256, 64)]

    def sqnr(extra: dict) -> float:
        kwargs = target_quantize_kwargs("dpu-b4096")
        options = {**kwargs.pop("extra_options"), "BiasCorrection": False, **extra}
        quant = zonnx.quantize_static(src, None, ListReader(calib), extra_options=options, **kwargs).model
        ref = [run_ort(src, f)["logits"].astype(np.float64) for f in held]
        noise = sum(
            float(np.square(a - run_ort(quant, f)["logits"]).sum()) for a, f in zip(ref, held, strict=True)
        )
        return 10 * np.log10(sum(float(np.square(a).sum()) for a in ref) / noise)

    plain = sqnr({})
    default = sqnr({"IncludeCLE": True, "CLESteps": 4})
    with_bias = sqnr({"IncludeCLE": True, "CLESteps": 4, "CLEScaleAppendBias": True})
    assert default > plain - 0.1, (plain, default, with_bias)
    assert abs(default - with_bias) > 0.01, (plain, default, with_bias)  # the option changed the balance
