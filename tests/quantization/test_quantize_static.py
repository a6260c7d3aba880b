"""``zonnx.quantize_static`` as a drop-in for ORT's call: every format, real models, parity with ORT's scales."""

from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType
from onnxruntime.quantization import quantize_static as ort_quantize_static

import zonnx
from zonnx import zoo
from zonnx.errors import OptionError, ZonnxError
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.enums import PowerOfTwoMethod, VitisQuantFormat
from zonnx.zoo.digits import digits_data, evaluate_top1


class DigitsReader(CalibrationDataReader):
    """An ORT CalibrationDataReader subclass, as users write them."""

    def __init__(self, n: int = 64, batch: int = 1) -> None:
        x, _ = digits_data("calib")
        self.feeds = iter([{"input": x[i : i + batch]} for i in range(0, n, batch)])

    def get_next(self):
        return next(self.feeds, None)


@pytest.fixture(scope="module")
def digits() -> Path:
    return zoo.get("digits_cnn")


@pytest.fixture(scope="module")
def digits_test() -> tuple[np.ndarray, np.ndarray]:
    return digits_data("test")


def _ops(path: Path) -> Counter[str]:
    return Counter((f"{n.domain}:" if n.domain else "") + n.op_type for n in onnx.load(path).graph.node)


def test_positional_call_like_ort(tmp_path: Path, digits: Path, digits_test) -> None:
    out = tmp_path / "q.onnx"
    # the exact positional order of onnxruntime.quantization.quantize_static
    zonnx.quantize_static(
        str(digits),
        str(out),
        DigitsReader(),
        QuantFormat.QDQ,
        None,
        True,
        False,
        QuantType.QInt8,
        QuantType.QInt8,
        None,
        None,
        False,
        CalibrationMethod.MinMax,
    )
    ops = _ops(out)
    assert ops["QuantizeLinear"] == 11 and ops["DequantizeLinear"] == 23 and ops["Conv"] == 5
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])  # stock ORT, no extra library
    x, y = digits_test
    float_acc = evaluate_top1(digits, x, y)
    assert evaluate_top1(out, x, y) >= float_acc - 0.003  # int8 per-channel: at most 0.3 points lost
    assert sess.get_inputs()[0].name == "input"


def _dq_params(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(scale, zero point) of every DequantizeLinear, keyed by what it dequantizes: the quantized weight
    or bias initializer, or the QuantizeLinear output of an activation (names both quantizers share)."""
    model = onnx.load(path)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    return {
        n.input[0]: (inits[n.input[1]], inits[n.input[2]])
        for n in model.graph.node
        if n.op_type == "DequantizeLinear"
    }


def test_scales_match_ort_minmax(tmp_path: Path, digits: Path) -> None:
    """Same data, same MinMax per-tensor options: every scale and zero point of every one of ORT's
    DequantizeLinear nodes (weights, biases, activations) equals zonnx's for the same tensor."""
    prepped = tmp_path / "prepped.onnx"
    zonnx.save_model(zonnx.optimize(digits, opset=13), prepped)
    ours, theirs = tmp_path / "ours.onnx", tmp_path / "ort.onnx"
    zonnx.quantize_static(prepped, ours, DigitsReader(32), activation_type=QuantType.QUInt8)
    ort_quantize_static(str(prepped), str(theirs), DigitsReader(32), activation_type=QuantType.QUInt8)
    ours_q, theirs_q = _dq_params(ours), _dq_params(theirs)
    assert len(theirs_q) == 23 and sorted(ours_q) == sorted(theirs_q)
    for key, (scale, zero_point) in theirs_q.items():
        np.testing.assert_allclose(ours_q[key][0], scale, rtol=1e-6, err_msg=key)
        np.testing.assert_array_equal(ours_q[key][1], zero_point, err_msg=key)


@pytest.mark.parametrize(
    ("kwargs", "expect", "max_drop"),
    [
        (dict(quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8), "QLinearConv", 0.003),
        (
            dict(quant_format=VitisQuantFormat.FixNeuron, calibrate_method=PowerOfTwoMethod.MinMSE),
            "com.zonnx:FixNeuron",
            0.01,
        ),
        (
            dict(quant_format=VitisQuantFormat.QDQ, calibrate_method=PowerOfTwoMethod.NonOverflow),
            "com.zonnx:VitisQuantizeLinear",
            0.01,
        ),
        (dict(calibrate_method=CalibrationMethod.Entropy), "QuantizeLinear", 0.003),
        (dict(calibrate_method=CalibrationMethod.Percentile, per_channel=True), "QuantizeLinear", 0.003),
        (dict(activation_type=QuantType.QInt16, weight_type=QuantType.QInt8), "QuantizeLinear", 0.003),
        (
            dict(activation_type=QuantType.QUInt8, weight_type=QuantType.QInt4, per_channel=True),
            "DequantizeLinear",
            0.02,
        ),
        (dict(activation_type="bfloat16", weight_type="bfloat16"), "Cast", 0.003),
    ],
)
def test_formats_run_in_stock_ort(
    tmp_path: Path, digits: Path, digits_test, kwargs, expect: str, max_drop: float
) -> None:
    out = tmp_path / "q.onnx"
    result = zonnx.quantize_static(digits, out, DigitsReader(), **kwargs)
    assert _ops(out)[expect] > 0
    x, y = digits_test
    assert evaluate_top1(out, x, y) >= evaluate_top1(digits, x, y) - max_drop
    model = onnx.load(out)
    onnx.checker.check_model(model)
    assert model.ir_version <= 13
    assert {m.key for m in model.metadata_props} >= {"zonnx.test_accuracy"}
    if kwargs.get("activation_type") == QuantType.QInt16 or kwargs.get("weight_type") == QuantType.QInt4:
        assert result.opset == 21  # 16-bit and 4-bit Q/DQ need opset 21: upgraded automatically


def test_fixneuron_positions_are_powers_of_two(tmp_path: Path, digits: Path) -> None:
    out = tmp_path / "fix.onnx"
    result = zonnx.quantize_static(
        digits,
        out,
        DigitsReader(),
        quant_format=VitisQuantFormat.FixNeuron,
        calibrate_method=PowerOfTwoMethod.NonOverflow,
    )
    model = onnx.load(out)
    fix = [n for n in model.graph.node if n.op_type == "FixNeuron"]
    assert len(fix) == sum(result.counts.values())
    assert {f.name for f in model.functions} == {"FixNeuron"}
    for tp in result.plan.tensors.values():
        assert tp.params is not None and tp.params.pos is not None
        np.testing.assert_array_equal(tp.params.scale, np.ldexp(1.0, -tp.params.pos))


def test_ppocr_rec_per_channel_where_ort_fails(tmp_path: Path) -> None:
    """Opset 12, weights in Constant nodes, calibration lines of different widths (Percentile)."""
    src = zoo.get("ppocr_rec")
    by_width = {f["x"].shape: f for f in zoo.sample_inputs("ppocr_rec", 40, seed=5)}
    feeds = list(by_width.values())[:6]
    assert len({f["x"].shape for f in feeds}) >= 3
    out = tmp_path / "rec.onnx"
    result = zonnx.quantize_static(
        src, out, ListReader(feeds), per_channel=True, calibrate_method=CalibrationMethod.Percentile
    )
    model = onnx.load(out)
    assert result.opset == 13
    assert "character" in {m.key for m in model.metadata_props}
    per_channel = [
        n
        for n in model.graph.node
        if n.op_type == "DequantizeLinear" and any(a.name == "axis" for a in n.attribute)
    ]
    assert len(per_channel) >= 38  # every Conv weight
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    probs = sess.run(None, feeds[0])[0]
    assert probs.shape[-1] == 6625 and np.isfinite(probs).all()


def test_exclusions_and_input_output_nodes(tmp_path: Path, digits: Path) -> None:
    prepped = zonnx.optimize(digits, opset=13)
    convs = [n.name for n in prepped.graph.node if n.op_type == "Conv"]
    result = zonnx.quantize_static(prepped, tmp_path / "a.onnx", DigitsReader(), nodes_to_exclude=[convs[0]])
    assert result.plan.skipped[convs[0]] == "listed in nodes_to_exclude"
    result = zonnx.quantize_static(prepped, tmp_path / "b.onnx", DigitsReader(), input_nodes=[convs[1]])
    assert convs[0] in result.plan.skipped and convs[1] in result.plan.quantized_nodes
    result = zonnx.quantize_static(
        prepped, tmp_path / "c.onnx", DigitsReader(), op_types_to_quantize=["Conv"]
    )
    assert set(result.plan.quantized_nodes) == set(convs)


def test_missing_exclude_name_warns_with_close_match(tmp_path: Path, digits: Path, caplog) -> None:
    prepped = zonnx.optimize(digits, opset=13)
    conv = next(n.name for n in prepped.graph.node if n.op_type == "Conv")
    with caplog.at_level(logging.WARNING):
        zonnx.quantize_static(prepped, tmp_path / "a.onnx", DigitsReader(), nodes_to_exclude=[conv + "x"])
    assert f"Did you mean {conv!r}" in caplog.text


def _x(shape=(1, 1, 8, 8), dtype=np.float32):
    return np.zeros(shape, dtype)


@pytest.mark.parametrize(
    ("feeds", "kwargs", "message"),
    [
        ([{"inputs": _x()}], {}, "Did you mean 'input'"),
        ([{"input": _x(dtype=np.float64)}], {}, "float64"),
        ([{"input": _x((1, 8, 8))}], {}, "rank"),
        ([], {}, "produced no samples"),
        ([{"input": _x()}, {"input": np.full((1, 1, 8, 8), np.nan, np.float32)}], {}, "sample 1"),
        (
            [{"input": _x()}],
            {"extra_options": {"ActivationSymetric": True}},
            "Did you mean 'ActivationSymmetric'",
        ),
        (
            [{"input": _x()}],
            {"per_channel": True, "calibrate_method": PowerOfTwoMethod.MinMSE},
            "per_channel",
        ),
        ([{"input": _x()}], {"quant_format": "qlinear"}, "quant_format"),
    ],
)
def test_bad_input_gives_one_clear_error_and_no_file(
    tmp_path: Path, digits: Path, feeds, kwargs, message
) -> None:
    out = tmp_path / "q.onnx"
    with pytest.raises(ZonnxError, match=message):
        zonnx.quantize_static(digits, out, ListReader(feeds), **kwargs)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_overwrite_the_input(tmp_path: Path, digits: Path) -> None:
    copy = tmp_path / "m.onnx"
    copy.write_bytes(digits.read_bytes())
    with pytest.raises(ZonnxError, match="is the input model"):
        zonnx.quantize_static(copy, copy, DigitsReader())
    assert copy.read_bytes() == digits.read_bytes()


def test_no_reader_and_no_stats(tmp_path: Path, digits: Path) -> None:
    with pytest.raises(OptionError, match="calibration_data_reader is None"):
        zonnx.quantize_static(digits, tmp_path / "q.onnx", None)


def test_saved_statistics_requantize_without_calibrating(tmp_path: Path, digits: Path) -> None:
    stats = tmp_path / "stats.npz"
    first = zonnx.quantize_static(
        digits,
        tmp_path / "a.onnx",
        DigitsReader(),
        calibrate_method=CalibrationMethod.Percentile,
        extra_options={"SaveStats": str(stats)},
    )
    again = zonnx.quantize_static(
        digits,
        tmp_path / "b.onnx",
        None,
        calibrate_method=CalibrationMethod.Percentile,
        extra_options={"LoadStats": str(stats)},
    )
    for name, tp in first.plan.tensors.items():
        np.testing.assert_array_equal(tp.params.scale, again.plan.tensors[name].params.scale, err_msg=name)
    other = zonnx.quantize_static(
        digits,
        tmp_path / "c.onnx",
        None,
        calibrate_method=CalibrationMethod.MinMax,
        extra_options={"LoadStats": str(stats)},
    )
    changed = [
        n
        for n, tp in other.plan.tensors.items()
        if tp.role.value == "activation"
        and not np.array_equal(tp.params.scale, first.plan.tensors[n].params.scale)
    ]
    assert changed  # another method on the same statistics gives other ranges
    with pytest.raises(ZonnxError, match="different model|fingerprint|made for"):
        zonnx.quantize_static(
            zoo.get("ppocr_cls"), tmp_path / "d.onnx", None, extra_options={"LoadStats": str(stats)}
        )


def test_tpu_mlir_table_round_trip(tmp_path: Path, digits: Path) -> None:
    table = tmp_path / "cali_table"
    first = zonnx.quantize_static(
        digits,
        tmp_path / "a.onnx",
        DigitsReader(),
        activation_type=QuantType.QUInt8,
        extra_options={"ExportCalibrationTable": str(table)},
    )
    lines = [ln for ln in table.read_text().splitlines() if not ln.startswith("#")]
    assert lines and all(len(ln.split()) == 4 for ln in lines)
    again = zonnx.quantize_static(
        digits,
        tmp_path / "b.onnx",
        None,
        activation_type=QuantType.QUInt8,
        extra_options={"LoadCalibrationTable": str(table)},
    )
    for name, tp in first.plan.tensors.items():
        if tp.role.value == "activation":
            np.testing.assert_allclose(tp.params.scale, again.plan.tensors[name].params.scale, rtol=1e-6)


def test_per_channel_gemm_with_weight_axis_1(tmp_path: Path, digits: Path) -> None:
    """After canonicalize-gemm the Gemm weight is [K, N] (channel axis 1); its 1-D bias still uses axis 0."""
    optimized = zonnx.optimize(digits)  # folds transB into the weight
    gemm = next(n for n in optimized.graph.node if n.op_type == "Gemm")
    assert not any(a.name == "transB" and a.i for a in gemm.attribute)
    out = tmp_path / "q.onnx"
    zonnx.quantize_static(optimized, out, DigitsReader(), per_channel=True)
    x, y = digits_data("test")
    assert evaluate_top1(out, x, y) >= evaluate_top1(digits, x, y) - 0.003


def test_target_scheme_mismatch_warns(tmp_path: Path, digits: Path, caplog) -> None:
    """Asymmetric activations for a symmetric target: a warning with the fix; the target's kwargs: none."""
    from zonnx.build_npu import target_quantize_kwargs

    feeds = zoo.sample_inputs("digits_cnn", 4, seed=2)
    with caplog.at_level(logging.WARNING, logger="zonnx.quantization.api"):
        zonnx.quantize_static(
            digits, tmp_path / "a.onnx", ListReader(feeds), extra_options={"Target": "bm1684x"}
        )
    assert "takes symmetric activations" in caplog.text and "target_quantize_kwargs" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="zonnx.quantization.api"):
        zonnx.quantize_static(
            digits, tmp_path / "b.onnx", ListReader(feeds), **target_quantize_kwargs("bm1684x")
        )
    assert "takes symmetric activations" not in caplog.text


def test_u8s8_output_for_ort_cpu_warns_and_names_this_host(tmp_path: Path, digits: Path, caplog) -> None:
    """u8 activations with s8 weights (no target): one warning naming the saturation, the fix and this host."""
    from zonnx.hostcpu import host_int

    feeds = zoo.sample_inputs("digits_cnn", 4, seed=2)
    with caplog.at_level(logging.WARNING, logger="zonnx.quantization.api"):
        zonnx.quantize_static(
            digits, tmp_path / "u8s8.onnx", ListReader(feeds), activation_type=QuantType.QUInt8
        )
    lines = [r.getMessage() for r in caplog.records if "without VNNI" in r.getMessage()]
    assert len(lines) == 1
    assert "--activation-type int8" in lines[0] and "reduce_range" in lines[0]
    verdict = "is one of them" if not host_int().u8s8_exact else "is not"
    assert f"this host ({host_int().isa}) {verdict}" in lines[0]
    for kwargs in (
        {"activation_type": QuantType.QInt8},
        {"reduce_range": True, "activation_type": QuantType.QUInt8},
    ):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="zonnx.quantization.api"):
            zonnx.quantize_static(digits, tmp_path / "ok.onnx", ListReader(feeds), **kwargs)
        assert "without VNNI" not in caplog.text, kwargs


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("CalibNStd", -1.0, "positive"),
        ("CalibNStd", 0.0, "positive"),
        ("CalibMovingAverageConstant", -1.0, "(0, 1]"),
        ("CalibMovingAverageConstant", 0.0, "(0, 1]"),
        ("CalibMovingAverageConstant", 2.0, "(0, 1]"),
        ("CalibNumQuantizedBins", 0, "from 1 to"),
        ("CalibNumQuantizedBins", 4096, "from 1 to"),
        ("CalibNumBins", 50_000_000, "16 to 65536"),
    ],
)
def test_numeric_options_out_of_range_are_value_errors(
    tmp_path: Path, digits: Path, key: str, value: float, fragment: str
) -> None:
    """Each numeric extra option has a range; outside it: one ValueError naming the key, before any work
    (issue 17, item 7: 50 million bins no longer try to allocate)."""
    with pytest.raises(ValueError, match=rf"{key}.*{re.escape(fragment)}"):
        zonnx.quantize_static(digits, tmp_path / "q.onnx", ListReader([]), extra_options={key: value})
    assert not (tmp_path / "q.onnx").exists()


def test_dead_channel_bias_fits_int32(tmp_path: Path) -> None:
    """A channel whose weights are ~0 (per-channel scale ~1e-30) keeps its bias: the weight scale is raised
    so the int32 bias code fits (it saturated to a meaningless value before); QDQDisableWeightAdjustForInt32Bias
    keeps the old scale."""
    import warnings

    from onnx import numpy_helper

    from tests.helpers import parse

    w = np.ones((2, 3, 1, 1), np.float32)
    w[1] = 1e-30
    model = parse(
        '<ir_version: 8, opset_import: ["" : 13]>\n'
        "g (float[1, 3, 4, 4] x) => (float[1, 2, 4, 4] y) {\n y = Conv (x, w, b)\n}",
        ("w", w),
        ("b", np.array([0.25, 0.5], np.float32)),
    )
    feeds = [{"x": np.random.default_rng(i).normal(size=(1, 3, 4, 4)).astype(np.float32)} for i in range(4)]

    def bias_of(result) -> np.ndarray:
        inits = {t.name: numpy_helper.to_array(t) for t in result.model.graph.initializer}
        codes = next(v for k, v in inits.items() if v.dtype == np.int32)
        scale = next(v for k, v in inits.items() if k.startswith("b") and "scale" in k)
        return codes * scale

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fixed = zonnx.quantize_static(model, None, ListReader(feeds), per_channel=True)
    np.testing.assert_allclose(bias_of(fixed), [0.25, 0.5], rtol=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        kept = zonnx.quantize_static(
            model,
            None,
            ListReader(feeds),
            per_channel=True,
            extra_options={"QDQDisableWeightAdjustForInt32Bias": True},
        )
    assert abs(bias_of(kept)[1] - 0.5) > 0.1


def test_weight_calibrate_method_moves_float_scale_weights_and_is_refused_for_power_of_two(
    digits: Path,
) -> None:
    """``WeightCalibrateMethod`` changes per-tensor float-scale weight scales; power-of-two weights always take
    vai_q's position search, so there the option is refused (it used to be accepted and ignored)."""
    feeds = zoo.sample_inputs("digits_cnn", 4, seed=2)

    def weight_scales(**kwargs) -> dict[str, float]:
        q = zonnx.quantize_static(digits, None, ListReader(feeds), **kwargs).model
        inits = {t.name: onnx.numpy_helper.to_array(t) for t in q.graph.initializer}
        return {
            n.input[0]: float(inits[n.input[1]])
            for n in q.graph.node
            if n.op_type == "DequantizeLinear"
            and n.input[0] in inits
            and inits[n.input[0]].dtype == np.int8
            and inits[n.input[1]].size == 1
            and inits[n.input[0]].ndim > 1
        }

    minmax = weight_scales()
    percentile = weight_scales(extra_options={"WeightCalibrateMethod": "Percentile"})
    assert minmax and minmax.keys() == percentile.keys()
    assert any(percentile[k] < minmax[k] for k in minmax)  # outlier weights clipped: finer steps
    with pytest.raises(OptionError, match="WeightCalibrateMethod"):
        zonnx.quantize_static(
            digits, None, ListReader(feeds), quant_format=VitisQuantFormat.FixNeuron,
            calibrate_method=PowerOfTwoMethod.MinMSE, extra_options={"WeightCalibrateMethod": "Percentile"},
        )  # fmt: skip
