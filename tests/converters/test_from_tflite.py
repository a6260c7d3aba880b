"""TFLite frontend: the Keras test models converted with TF's own converter (float and full-integer int8 on
representative data), then through tf2onnx's TFLite path, checked against the TFLite interpreter."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
pytest.importorskip("tensorflow", reason="TensorFlow frontends need `pip install zonnx[tf]`")
pytest.importorskip("tf2onnx", reason="TensorFlow frontends need `pip install zonnx[tf]`")

from tests.converters import tf_models as tm  # noqa: E402
from zonnx.converters.common import ConversionError, ConversionResult  # noqa: E402
from zonnx.converters.from_tflite import from_tflite  # noqa: E402
from zonnx.inspection import inspect_model  # noqa: E402
from zonnx.ir.io import MAX_IR_VERSION  # noqa: E402
from zonnx.verify import check_loadable, run_ort  # noqa: E402

INT8 = onnx.TensorProto.INT8
NAMES = {"functional": (["image"], ["output_0"]), "sequential": (["pixels"], ["output_0"])}


def _io(result: ConversionResult) -> tuple[list[str], list[str]]:
    return [i.name for i in result.model.graph.input], [o.name for o in result.model.graph.output]


@pytest.mark.parametrize("kind", ["functional", "sequential"])
def test_float_tflite(kind: str) -> None:
    result = from_tflite(tm.tflite_file(kind, int8=False))
    assert _io(result) == NAMES[kind]
    (check,) = result.checks
    assert check.max_lsb is None and check.cosine > 0.9999, check
    check_loadable(result.model)
    assert result.model.ir_version <= MAX_IR_VERSION
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in result.model.graph.node)
    meta = {p.key: p.value for p in result.model.metadata_props}
    assert meta["zonnx.framework"] == "tflite" and meta["zonnx.source"].endswith(f"{kind}_float.tflite")


@pytest.mark.parametrize("kind", ["functional", "sequential"])
def test_int8_tflite_becomes_qdq_within_one_lsb(kind: str, tmp_path) -> None:
    result = from_tflite(tm.tflite_file(kind, int8=True))
    assert _io(result) == NAMES[kind]
    graph = result.model.graph
    assert (
        graph.input[0].type.tensor_type.elem_type == INT8
        and graph.output[0].type.tensor_type.elem_type == INT8
    )
    (check,) = result.checks
    assert check.max_lsb is not None and check.max_lsb <= 1, check
    check_loadable(result.model)
    path = tmp_path / "int8.onnx"
    onnx.save(result.model, str(path))
    q = inspect_model(path).quantization
    assert q.format == "QDQ" and q.dtypes == ["int8"]
    assert q.per_channel > 0 and q.per_tensor > 0  # per-channel weights, per-tensor activations
    zero_points = [
        int(onnx.numpy_helper.to_array(t).ravel()[0])
        for t in graph.initializer
        if t.data_type == INT8 and t.name in {n.input[2] for n in graph.node if n.op_type == "QuantizeLinear"}
    ]
    assert any(z != 0 for z in zero_points)  # asymmetric activations


def test_int8_mobilenet_v2_application() -> None:
    """keras.applications.MobileNetV2 (random weights) through TF's int8 converter: the real model."""
    result = from_tflite(tm.tflite_file("mobilenet_v2", int8=True))
    (check,) = result.checks
    assert check.max_lsb is not None and check.max_lsb <= 1, check
    ops = [n.op_type for n in result.model.graph.node]
    assert ops.count("Conv") == 52 and ops.count("QuantizeLinear") > 50
    check_loadable(result.model)


def test_user_inputs_with_another_batch_size_resize_the_interpreter() -> None:
    rng = np.random.default_rng(3)
    feeds = [{"image": rng.integers(-128, 128, (3, tm.SMALL_HW, tm.SMALL_HW, 3), dtype=np.int8)}]
    result = from_tflite(tm.tflite_file("functional", int8=True), check_inputs=feeds)
    assert result.checks[0].max_lsb <= 1
    assert run_ort(result.model, feeds[0])["output_0"].shape == (3, 5)


def test_check_fails_when_the_codes_differ_more_than_allowed() -> None:
    """max_lsb=-1 cannot be met: proves the int8 comparison really runs (it reports the LSB numbers)."""
    with pytest.raises(
        ConversionError, match=r"output 'output_0' does not match the source framework: \d+ LSB"
    ):
        from_tflite(tm.tflite_file("functional", int8=True), max_lsb=-1)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (lambda data: data[: len(data) // 2], "corrupt or truncated"),
        (lambda data: data[:200] + bytes(b ^ 0xFF for b in data[200:400]) + data[400:], "corrupt"),
        (lambda data: b"\0\0\0\0TFL3" + bytes(range(256)) * 8, "corrupt"),
        (lambda data: b"this is not a model", "not a TFLite model"),
        (lambda data: b"", "not a TFLite model"),
    ],
    ids=["truncated", "flipped", "garbage_with_identifier", "text", "empty"],
)
def test_corrupt_tflite_is_one_clear_error(tmp_path, content, message: str) -> None:
    path = tmp_path / "bad.tflite"
    path.write_bytes(content(tm.tflite_file("functional", int8=True).read_bytes()))
    with pytest.raises(ConversionError, match=message) as info:
        from_tflite(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_missing_file_and_folder(tmp_path) -> None:
    with pytest.raises(ConversionError, match="no such file"):
        from_tflite(tmp_path / "missing.tflite")
    with pytest.raises(ConversionError, match="is a folder"):
        from_tflite(tmp_path)
