"""Quantizer placement: the "kernels" policy quantizes only what integer kernels consume, on real models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import zonnx
from tests.helpers import parse
from zonnx import zoo
from zonnx.errors import OptionError
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.enums import QuantFormat, QuantType
from zonnx.zoo.text_images import char_accuracy, ctc_greedy_decode, rec_samples

KERNELS = {"QuantPlacement": "kernels"}

ENCODER_BLOCK = """
<ir_version: 8, opset_import: ["" : 17]>
block (float[2, 8, 16] x, float[2, 1, 8, 8] mask) => (float[2, 8, 16] y) {
  ln = LayerNormalization <axis = -1> (x, gamma, beta)
  q = MatMul (ln, wq)
  k = MatMul (ln, wk)
  qh = Reshape (q, shp)
  kh = Reshape (k, shp)
  kt = Transpose <perm = [0, 2, 3, 1]> (kh)
  qt = Transpose <perm = [0, 2, 1, 3]> (qh)
  s = MatMul (qt, kt)
  sd = Div (s, two)
  sm = Add (sd, mask)
  p = Softmax <axis = -1> (sm)
  vt = Transpose <perm = [0, 2, 1, 3]> (qh)
  a = MatMul (p, vt)
  at = Transpose <perm = [0, 2, 1, 3]> (a)
  ar = Reshape (at, flat)
  o = MatMul (ar, wo)
  y = Add (o, ln)
}
"""

RESIDUAL_CNN = """
<ir_version: 8, opset_import: ["" : 17]>
cnn (float[1, 4, 8, 8] x) => (float[1, 4, 8, 8] y) {
  a = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
  r = Relu (a)
  c = Conv <pads = [1, 1, 1, 1]> (r, w2, b2)
  s = Add (c, r)
  t = Relu (s)
  y = Conv <pads = [1, 1, 1, 1]> (t, w3, b3)
}
"""


def _encoder_block() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    f = np.float32
    return parse(
        ENCODER_BLOCK,
        ("gamma", np.ones(16, f)),
        ("beta", np.zeros(16, f)),
        ("wq", rng.normal(0, 0.3, (16, 16)).astype(f)),
        ("wk", rng.normal(0, 0.3, (16, 16)).astype(f)),
        ("wo", rng.normal(0, 0.3, (16, 16)).astype(f)),
        ("shp", np.array([2, 8, 2, 8], np.int64)),
        ("flat", np.array([2, 8, 16], np.int64)),
        ("two", np.array(2.0, f)),
    )


def _block_feeds(n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    mask = np.zeros((2, 1, 8, 8), np.float32)
    mask[1, :, :, 5:] = -10000.0
    return [{"x": rng.normal(0, 1, (2, 8, 16)).astype(np.float32), "mask": mask} for _ in range(n)]


def _readers_of(model: onnx.ModelProto, tensor: str) -> list[str]:
    return [n.op_type for n in model.graph.node if tensor in n.input]


def test_kernels_placement_quantizes_only_kernel_edges_of_an_attention_block() -> None:
    result = zonnx.quantize_static(
        _encoder_block(), None, ListReader(_block_feeds(4)), per_channel=True, extra_options=KERNELS
    )
    model = result.model
    planned = {name for name, tp in result.plan.tensors.items() if tp.role.value == "activation"}
    # the MatMul inputs, Softmax's output (read by a MatMul) and the projected values; nothing else
    assert planned == {"ln", "qt", "kt", "p", "vt", "ar"}
    ln_readers = result.plan.tensors["ln"].consumers
    assert ln_readers is not None and len(ln_readers) == 2 and all(n.startswith("MatMul") for n in ln_readers)
    # the residual Add and the mask Add read float values; Softmax reads the float scores
    assert _readers_of(model, "ln") == ["QuantizeLinear", "Add"]
    assert _readers_of(model, "sm") == ["Softmax"]
    reasons = [r for n, r in result.plan.skipped.items() if n.startswith(("Softmax", "LayerNorm", "Add"))]
    assert len(reasons) == 4 and all(r.startswith("kernels placement") for r in reasons), reasons
    # outputs of MatMuls are never rounded
    assert not any(name in planned for name in ("q", "k", "s", "o", "y"))


def test_kernels_placement_keeps_a_cnn_residual_add_integer(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    inits = []
    for i in (1, 2, 3):
        inits += [
            (f"w{i}", rng.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32)),
            (f"b{i}", np.zeros(4, np.float32)),
        ]
    model = parse(RESIDUAL_CNN, *inits)
    feeds = [{"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    result = zonnx.quantize_static(
        model, None, ListReader(feeds), activation_type=QuantType.QUInt8, extra_options=KERNELS
    )
    planned = {n for n, tp in result.plan.tensors.items() if tp.role.value == "activation"}
    assert planned == {"x", "r", "c", "t"}
    # the inner convolutions and the Add become integer kernels in ORT (uint8 activations: ORT's x86
    # selectors leave int8-activation QDQ groups in float); the last one writes a float output
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(result.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    opt = onnx.load(tmp_path / "opt.onnx")
    kinds = [n.op_type for n in opt.graph.node]
    assert kinds.count("QLinearConv") == 2 and "QLinearAdd" in kinds


@pytest.mark.parametrize(
    ("extra", "kwargs", "fragment"),
    [
        ({**KERNELS, "Target": "zhouyi-x2"}, {}, "an NPU target cannot run"),
        (KERNELS, {"quant_format": QuantFormat.QOperator}, "use quant_format=QuantFormat.QDQ"),
        ({"QuantPlacement": "nncf"}, {}, "use one of ort, kernels"),
    ],
)
def test_kernels_placement_refuses_what_it_cannot_do(extra: dict, kwargs: dict, fragment: str) -> None:
    with pytest.raises(OptionError, match=fragment):
        zonnx.quantize_static(
            _encoder_block(), None, ListReader(_block_feeds(1)), extra_options=extra, **kwargs
        )


def _embedding_cosine(path: Path | onnx.ModelProto, feeds: list, ref: list | None = None) -> list | float:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    src = path.SerializeToString() if isinstance(path, onnx.ModelProto) else str(path)
    sess = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    outs = [sess.run(None, f)[0].ravel() for f in feeds]
    if ref is None:
        return outs
    return float(
        np.mean([a @ b / np.linalg.norm(a) / np.linalg.norm(b) for a, b in zip(outs, ref, strict=True)])
    )


def test_kernels_placement_beats_ort_placement_on_the_zoo_transformer() -> None:
    src = zoo.get("transformer-random")
    feeds = zoo.sample_inputs("transformer-random", 24, seed=3)
    calib, held_out = feeds[:16], feeds[16:]
    ref = _embedding_cosine(src, held_out)
    cos = {}
    for placement in ("ort", "kernels"):
        result = zonnx.quantize_static(
            src,
            None,
            ListReader(calib),
            per_channel=True,
            activation_type=QuantType.QUInt8,
            extra_options={"QuantPlacement": placement},
        )
        cos[placement] = _embedding_cosine(result.model, held_out, ref)
    assert cos["kernels"] > cos["ort"]
    assert cos["kernels"] >= 0.9995, cos


def test_kernels_placement_keeps_ppocr_rec_accuracy() -> None:
    src = zoo.get("ppocr_rec")
    samples = rec_samples(24 + 40, seed=11)
    calib, held_out = [f for _, f in samples[:24]], samples[24:]
    truth = [text for text, _ in held_out]

    def accuracy(model: Path | onnx.ModelProto) -> float:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        sess = ort.InferenceSession(
            model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model),
            so,
            providers=["CPUExecutionProvider"],
        )
        return char_accuracy([p for _, f in held_out for p in ctc_greedy_decode(sess.run(None, f)[0])], truth)

    float_acc = accuracy(src)
    acc = {}
    for placement in ("ort", "kernels"):
        result = zonnx.quantize_static(
            src, None, ListReader(calib), per_channel=True, extra_options={"QuantPlacement": placement}
        )
        acc[placement] = accuracy(result.model)
    assert acc["kernels"] >= acc["ort"]
    assert acc["kernels"] >= float_acc - 0.005, (float_acc, acc)


def test_a_masked_softmax_input_is_clipped_to_its_useful_span() -> None:
    """The -10000 attention mask must not set the Softmax input's 8-bit grid (ORT placement)."""
    feeds = _block_feeds(6)
    result = zonnx.quantize_static(_encoder_block(), None, ListReader(feeds[:4]), per_channel=True)
    scores = result.plan.tensors["sm"]
    assert scores.softmax_span == 32.0
    # calibrated on max(x, rowmax - 20) (calibration.softmax_floor), capped at 32 below the top: not -10000
    assert scores.rmax - 32.0 <= scores.rmin < scores.rmax - 19.0
    assert result.plan.tensors["sm"].params.scale < 0.2
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    q = ort.InferenceSession(result.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    f = ort.InferenceSession(_encoder_block().SerializeToString(), so, providers=["CPUExecutionProvider"])
    for feed in feeds[4:]:
        a, b = f.run(None, feed)[0].ravel(), q.run(None, feed)[0].ravel()
        assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.99
