"""Bias correction: per-channel output error removed on QDQ, FixNeuron, VitisQDQ and dpu-b4096 models,
target rules kept, options refused when it cannot run. (Figures on the trained digits CNN:
bench/bench_recovery.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import zonnx
from tests.helpers import parse
from zonnx import zoo
from zonnx.backend.targets import load_target
from zonnx.build_npu import target_quantize_kwargs
from zonnx.errors import OptionError
from zonnx.ir.io import to_ir, to_proto
from zonnx.quantization.api import QuantizeResult
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.enums import PowerOfTwoMethod, QuantFormat, VitisQuantFormat
from zonnx.quantization.recovery.bias_correction import correct_biases
from zonnx.quantization.recovery.bias_undo import BiasSnapshot
from zonnx.quantization.recovery.channel_means import ChannelProbe
from zonnx.quantization.refine.pipeline import refine_model
from zonnx.quantization.refine.positions import QuantGraph
from zonnx.verify import run_ort
from zonnx.zoo.digits import digits_data

RNG = np.random.default_rng(3)


def small_cnn(rng: np.random.Generator = RNG) -> onnx.ModelProto:
    """Conv -> Relu -> Conv with coarse int8 weights (few levels per channel: a visible mean error)."""
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    w1[:, :, 0, 0] *= 8.0  # one large tap per filter: the other taps round coarsely
    model = parse(
        """<ir_version: 8, opset_import: ["" : 13]>
        g (float[1,3,16,16] x) => (float[1,4,16,16] y) {
          a = Conv <pads=[1,1,1,1]> (x, w1, b1)
          r = Relu(a)
          y = Conv <pads=[1,1,1,1]> (r, w2, b2)
        }""",
        ("w1", w1),
        ("b1", (rng.standard_normal(8) * 0.1).astype(np.float32)),
        ("w2", rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.2),
        ("b2", (rng.standard_normal(4) * 0.1).astype(np.float32)),
    )
    for i, node in enumerate(model.graph.node):  # the names quantize_static gives unnamed nodes
        node.name = f"{node.op_type}_{i}"
    return model


def _feeds(n: int, rng: np.random.Generator = RNG) -> list[dict[str, np.ndarray]]:
    return [{"x": (rng.standard_normal((1, 3, 16, 16)) + 0.5).astype(np.float32)} for _ in range(n)]


def _mean_error(float_model: onnx.ModelProto, quant: onnx.ModelProto, feeds: list) -> float:
    """Largest |per-channel mean of (float - quantized)| over the two Conv outputs."""
    f, _ = ChannelProbe(float_model, {"a": 4, "y": 4}).run(feeds)
    q_names = {n.name: n.output[0] for n in quant.graph.node if n.op_type == "Conv"}
    f_names = {n.name: n.output[0] for n in float_model.graph.node if n.op_type == "Conv"}
    q, _ = ChannelProbe(quant, {q_names[k]: 4 for k in q_names}).run(feeds)
    return max(
        float(np.abs(f[f_names[k]].mean(0) - q[q_names[k]].mean(0)).max()) for k in q_names if k in f_names
    )


FORMATS = {
    "qdq": dict(quant_format=QuantFormat.QDQ, extra_options={"ActivationSymmetric": True}),
    "fixneuron": dict(quant_format=VitisQuantFormat.FixNeuron, calibrate_method=PowerOfTwoMethod.MinMSE),
    "vitisqdq": dict(quant_format=VitisQuantFormat.QDQ, calibrate_method=PowerOfTwoMethod.MinMSE),
    "dpu-b4096": target_quantize_kwargs("dpu-b4096"),
}


@pytest.mark.parametrize("form", list(FORMATS))
def test_bias_correction_removes_channel_mean_error(form: str) -> None:
    model, feeds = small_cnn(), _feeds(6)
    base = {k: (dict(v) if isinstance(v, dict) else v) for k, v in FORMATS[form].items()}
    extra = dict(base.pop("extra_options", {}))
    plain = zonnx.quantize_static(
        model, None, ListReader(feeds), extra_options={**extra, "BiasCorrection": False}, **base
    )
    fixed = zonnx.quantize_static(
        model, None, ListReader(feeds), extra_options={**extra, "BiasCorrection": True}, **base
    )
    record = fixed.recovery["bias_correction"]
    assert record.layers == 2 and record.samples == 6 and record.runs == 4  # float, before, level 2, after
    # against the float model the quantizer measured (the recipe's CLE rescales channels)
    ref = fixed.prepared
    before, after = _mean_error(ref, plain.model, feeds), _mean_error(ref, fixed.model, feeds)
    assert after < 0.5 * before, (before, after)
    assert record.sqnr_after > record.sqnr_before
    if form == "dpu-b4096":  # the corrected model still meets every rule of the target
        assert refine_model(to_ir(fixed.model), "dpu-b4096").total == 0


def test_dpu_recipe_corrects_biases() -> None:
    """target_quantize_kwargs("dpu-b4096") asks for bias correction (Vitis AI's default recipe)."""
    assert target_quantize_kwargs("dpu-b4096")["extra_options"]["BiasCorrection"] is True
    model, feeds = small_cnn(), _feeds(4)
    result = zonnx.quantize_static(model, None, ListReader(feeds), **target_quantize_kwargs("dpu-b4096"))
    assert result.recovery["bias_correction"].layers == 2


def test_a_layer_left_float_gets_its_float_bias_corrected() -> None:
    """Conv_2 excluded: it runs in float on quantized inputs; its plain bias takes their mean error."""
    model, feeds = small_cnn(), _feeds(8)
    args = dict(nodes_to_exclude=["Conv_2"], **FORMATS["fixneuron"])
    plain = zonnx.quantize_static(model, None, ListReader(feeds), **args)
    fixed = zonnx.quantize_static(
        model, None, ListReader(feeds), **args, extra_options={"BiasCorrection": True}
    )
    record = fixed.recovery["bias_correction"]
    assert record.layers == 2 and record.candidates == 2

    def bias(m: onnx.ModelProto) -> np.ndarray:
        conv2 = next(n for n in m.graph.node if n.name == "Conv_2")
        return next(onnx.numpy_helper.to_array(t) for t in m.graph.initializer if t.name == conv2.input[2])

    assert np.array_equal(bias(plain.model), bias(model)) and not np.array_equal(
        bias(fixed.model), bias(model)
    )
    # against the float model the quantizer measured (the recipe's CLE rescales channels)
    ref = fixed.prepared
    before, after = _mean_error(ref, plain.model, feeds), _mean_error(ref, fixed.model, feeds)
    assert after < 0.2 * before, (before, after)


def test_all_at_once_is_measured_too() -> None:
    model, feeds = small_cnn(), _feeds(4)
    q = zonnx.quantize_static(model, None, ListReader(feeds)).model
    record = correct_biases(to_ir(q), model, feeds, sequential=False)
    assert record.runs == 3 and not record.sequential and record.layers == 2


def test_refusals(tmp_path) -> None:
    model, feeds = small_cnn(), _feeds(2)
    # a format bias correction or fast finetune cannot work on is refused before the model is read
    for option in ("BiasCorrection", "IncludeFastFT"):
        with pytest.raises(OptionError, match="QOperator"):
            zonnx.quantize_static(
                tmp_path / "absent.onnx", None, None, QuantFormat.QOperator, extra_options={option: True}
            )
    with pytest.raises(OptionError, match="QOperator"):
        zonnx.quantize_static(
            model, None, ListReader(feeds), QuantFormat.QOperator, extra_options={"BiasCorrection": True}
        )
    with pytest.raises(OptionError, match="calibration samples"):
        zonnx.quantize_static(model, None, None, extra_options={"BiasCorrection": True})


def _logits_sqnr(float_model: onnx.ModelProto, quant: onnx.ModelProto, feeds: list) -> float:
    ref = [run_ort(float_model, f)["logits"].astype(np.float64) for f in feeds]
    out = [run_ort(quant, f)["logits"] for f in feeds]
    noise = sum(float(np.square(a - b).sum()) for a, b in zip(ref, out, strict=True))
    return 10 * np.log10(sum(float(np.square(a).sum()) for a in ref) / noise)


def test_every_calibration_sample_is_used_and_the_fit_carries_to_held_out_images() -> None:
    """Trained digits CNN for dpu-b4096: bias correction measures on all 32 calibration images (it used to
    take the first 8) and raises the logits SQNR on 256 test images it never saw."""
    src = onnx.load(str(zoo.get("digits_cnn")))
    x_cal, _ = digits_data("calib")
    x_te, _ = digits_data("test")
    calib = [{"input": x_cal[i : i + 1]} for i in range(32)]
    held = [{"input": x_te[i : i + 64]} for i in range(0, 256, 64)]
    kwargs = target_quantize_kwargs("dpu-b4096")
    extra = kwargs.pop("extra_options")
    plain = zonnx.quantize_static(
        src, None, ListReader(calib), extra_options={**extra, "BiasCorrection": False}, **kwargs
    )
    fixed = zonnx.quantize_static(
        src, None, ListReader(calib), extra_options={**extra, "BiasCorrection": True}, **kwargs
    )
    assert fixed.recovery["bias_correction"].samples == 32
    before, after = _logits_sqnr(src, plain.model, held), _logits_sqnr(src, fixed.model, held)
    assert after > before + 1.0, (before, after)


TINY_BIAS_SEED = 3


def _tiny_bias_cnn(rng: np.random.Generator) -> onnx.ModelProto:
    """``small_cnn`` with biases 1000x smaller than their corrections (their 8-bit grid must widen)."""
    model = small_cnn(rng)
    for t in model.graph.initializer:
        if t.name in ("b1", "b2"):
            t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t) * 1e-3, t.name))
    return model


def _dpu_with_and_without(
    model: onnx.ModelProto | Path, feeds: list, fmt: QuantFormat | None
) -> tuple[QuantizeResult, QuantizeResult]:
    """The dpu-b4096 recipe in format ``fmt`` without and with bias correction."""
    kwargs = target_quantize_kwargs("dpu-b4096", fmt)
    extra = kwargs.pop("extra_options")
    plain, fixed = (
        zonnx.quantize_static(
            model, None, ListReader(feeds), extra_options={**extra, "BiasCorrection": on}, **kwargs
        )
        for on in (False, True)
    )
    return plain, fixed


@pytest.mark.parametrize("fmt", [None, QuantFormat.QDQ], ids=["fixneuron", "qdq"])
def test_a_dpu_bias_the_correction_outgrows_widens_in_both_formats(fmt: QuantFormat | None) -> None:
    """Biases 1000x smaller than their corrections: their 8-bit grid must widen, FixNeuron or QDQ codes.

    Before the QDQ form widened its stored codes, all 12 corrected values saturated there and the mean
    error stayed (0.256 -> 0.251); PP-OCRv4 rec on dpu-b4096 as QDQ fell to 0.45 char accuracy.
    """
    # their own draw, whatever ran before: on some draws of 6 feeds the correction is undone (it lowered
    # the output SQNR on them, e.g. 23.43 -> 23.42 dB), which this test is not about
    rng = np.random.default_rng(TINY_BIAS_SEED)
    model, feeds = _tiny_bias_cnn(rng), _feeds(6, rng)
    plain, fixed = _dpu_with_and_without(model, feeds, fmt)
    record = fixed.recovery["bias_correction"]
    assert record.moved_positions == 2 and record.clipped == 0, record.summary()
    before, after = (
        _mean_error(fixed.prepared, plain.model, feeds),
        _mean_error(fixed.prepared, fixed.model, feeds),
    )
    assert after < 0.05 * before, (before, after)
    assert refine_model(to_ir(fixed.model), "dpu-b4096").total == 0  # the widened grids obey shift_bias


@pytest.mark.parametrize("fmt", [None, QuantFormat.QDQ], ids=["fixneuron", "qdq"])
def test_an_undone_correction_leaves_the_dpu_graph_as_calibrated(fmt: QuantFormat | None) -> None:
    """The trained yolo_det on dpu-b4096, 4 of its sample images: the correction lowers the output SQNR on
    them (measured 31.99 -> 31.97 dB, FixNeuron), so it is undone and the graph is byte-for-byte the one
    quantized without it: biases, quantizer positions and initializers as calibrated, FixNeuron or QDQ."""
    feeds = zoo.sample_inputs("yolo_det", 4, seed=1)
    plain, fixed = _dpu_with_and_without(zoo.get("yolo_det"), feeds, fmt)
    record = fixed.recovery["bias_correction"]
    assert record.undone and record.layers == 8 and record.sqnr_after < record.sqnr_before, record.summary()
    assert fixed.model.graph.SerializeToString() == plain.model.graph.SerializeToString()


@pytest.mark.parametrize("fmt", [None, QuantFormat.QDQ], ids=["fixneuron", "qdq"])
def test_the_snapshot_restores_widened_dpu_positions(fmt: QuantFormat | None) -> None:
    """A correction that widened two bias positions (the 1000x-smaller biases above), then restored from
    the snapshot taken before it: the graph serializes byte-for-byte as calibrated, positions included."""
    rng = np.random.default_rng(TINY_BIAS_SEED)
    model, feeds = _tiny_bias_cnn(rng), _feeds(6, rng)
    kwargs = target_quantize_kwargs("dpu-b4096", fmt)
    extra = kwargs.pop("extra_options")
    plain = zonnx.quantize_static(
        model, None, ListReader(feeds), extra_options={**extra, "BiasCorrection": False}, **kwargs
    )
    calibrated = plain.model.graph.SerializeToString()
    work = to_ir(plain.model)
    quant_graph = QuantGraph(work)
    biases = [node.inputs[2] for node in work.graph if node.op_type == "Conv"]
    quantizers = [site.quantizers[0] for site in map(quant_graph.input_site, biases) if site is not None]
    assert len(quantizers) == 2
    snapshot = BiasSnapshot(work, [(q.source, q) for q in quantizers])
    record = correct_biases(work, plain.prepared, feeds, target=load_target("dpu-b4096"))
    assert record.moved_positions == 2 and not record.undone, record.summary()
    assert to_proto(work).graph.SerializeToString() != calibrated
    snapshot.restore()
    assert to_proto(work).graph.SerializeToString() == calibrated
