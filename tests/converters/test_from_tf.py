"""Keras and SavedModel frontends: small Keras models built here and keras.applications.MobileNetV2 with
random weights, converted through tf2onnx and checked against Keras/TensorFlow on the same inputs."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import onnx
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
pytest.importorskip("tensorflow", reason="TensorFlow frontends need `pip install zonnx[tf]`")
pytest.importorskip("tf2onnx", reason="TensorFlow frontends need `pip install zonnx[tf]`")

from tests.converters import tf_models as tm  # noqa: E402
from zonnx.converters.common import ConversionError, ConversionResult  # noqa: E402
from zonnx.converters.from_tf import from_keras, from_saved_model  # noqa: E402
from zonnx.converters.tf_support import CUSTOM_OP_DOMAIN, TF_INSTALL_HINT  # noqa: E402
from zonnx.errors import OptionError  # noqa: E402
from zonnx.ir.io import MAX_IR_VERSION, default_opset  # noqa: E402
from zonnx.verify import check_loadable, run_ort  # noqa: E402

MIN_COSINE = 0.9999


def _io(result: ConversionResult) -> tuple[list[str], list[str]]:
    g = result.model.graph
    return [i.name for i in g.input], [o.name for o in g.output]


def _dims(vi: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


def _assert_good(result: ConversionResult) -> None:
    """The numeric check ran and passed, and the model passes the foundation's checks."""
    assert result.checks and all(c.cosine > MIN_COSINE for c in result.checks), result.checks
    check_loadable(result.model)
    assert result.model.ir_version <= MAX_IR_VERSION
    assert not any(n.op_type == "BatchNormalization" for n in result.model.graph.node)  # folded by tf2onnx


def test_functional_model_object() -> None:
    model = tm.model("functional")
    result = from_keras(model)
    _assert_good(result)
    assert _io(result) == (["image"], ["logits"])
    assert _dims(result.model.graph.input[0]) == ["batch", 16, 16, 3]
    assert default_opset(result.model) == 17
    ops = {n.op_type for n in result.model.graph.node}
    assert {"Conv", "Concat", "MaxPool", "AveragePool", "GlobalAveragePool"} <= ops
    assert any(
        a.name == "group" and a.i == 8 for n in result.model.graph.node for a in n.attribute
    )  # depthwise
    meta = {p.key: p.value for p in result.model.metadata_props}
    assert meta["zonnx.framework"] == "keras" and meta["zonnx.source"] == "<keras.Model small_functional>"
    assert '"converter": "tf2onnx 1.17.0"' in meta["zonnx.convert_options"]
    # independent of the built-in check: Keras and ORT on a batch of 3 fresh images
    x = np.concatenate(tm.images(3, tm.SMALL_HW, seed=11))
    np.testing.assert_allclose(run_ort(result.model, {"image": x})["logits"], model(x).numpy(), atol=1e-5)


def test_keras_and_h5_files_match_the_model_object() -> None:
    x = tm.images(1, tm.SMALL_HW, seed=4)[0]
    direct = run_ort(from_keras(tm.model("functional"), check=False).model, {"image": x})["logits"]
    for suffix in (".keras", ".h5"):
        result = from_keras(tm.keras_file("functional", suffix))
        _assert_good(result)
        assert _io(result) == (["image"], ["logits"])
        assert {p.key: p.value for p in result.model.metadata_props}["zonnx.source"].endswith(suffix)
        np.testing.assert_allclose(run_ort(result.model, {"image": x})["logits"], direct, atol=1e-6)


def test_sequential_model_keeps_input_and_last_layer_names() -> None:
    result = from_keras(tm.keras_file("sequential", ".h5"))
    _assert_good(result)
    assert _io(result) == (["pixels"], ["scores"])


def test_two_inputs_two_outputs_keep_order_and_names() -> None:
    result = from_keras(tm.model("two_inputs"))
    _assert_good(result)
    assert _io(result) == (["a", "b"], ["sum", "prod"])
    assert [_dims(i)[0] for i in result.model.graph.input] == ["a_batch", "b_batch"]


def test_mobilenet_v2_application_with_random_weights() -> None:
    """keras.applications.MobileNetV2 (alpha 0.35, 96x96): the real model the project did not write."""
    model = tm.model("mobilenet_v2")
    name = model.layers[0].name  # the InputLayer: Keras names the input tensor keras_tensor_N
    start = time.perf_counter()
    result = from_keras(model, input_shapes={name: (1, tm.APP_HW, tm.APP_HW, 3)})
    elapsed = time.perf_counter() - start
    _assert_good(result)
    assert _io(result) == ([name], ["predictions"])
    assert _dims(result.model.graph.input[0]) == [1, tm.APP_HW, tm.APP_HW, 3]
    assert sum(n.op_type == "Conv" for n in result.model.graph.node) == 52
    print(f"MobileNetV2 from_keras: {elapsed:.2f}s, cosine {result.checks[0].cosine:.10f}")


def test_saved_model_uses_signature_names() -> None:
    result = from_saved_model(tm.saved_model("functional"))
    _assert_good(result)
    assert _io(result) == (["image"], ["output_0"])
    meta = {p.key: p.value for p in result.model.metadata_props}
    assert (
        meta["zonnx.framework"] == "tensorflow-savedmodel"
        and '"signature": "serving_default"' in meta["zonnx.convert_options"]
    )
    x = tm.images(1, tm.SMALL_HW, seed=2)[0]
    np.testing.assert_allclose(
        run_ort(result.model, {"image": x})["output_0"], tm.model("functional")(x).numpy(), atol=1e-5
    )


def test_saved_model_picks_outputs_and_fixes_shapes() -> None:
    result = from_saved_model(
        tm.saved_model("two_inputs"),
        inputs=["b", "a"],
        outputs=["output_1"],
        input_shapes={"a": (2, 8), "b": (2, 4)},
    )
    _assert_good(result)
    assert _io(result) == (["b", "a"], ["output_1"])
    assert [_dims(i) for i in result.model.graph.input] == [[2, 4], [2, 8]]


def test_cut_at_layer_names() -> None:
    """inputs/outputs name layers: the ONNX model starts at concat's output and ends at logits."""
    result = from_keras(tm.model("functional"), inputs=["concat"], outputs=["logits"])
    _assert_good(result)
    assert _io(result) == (["concat"], ["logits"])
    assert _dims(result.model.graph.input[0]) == ["batch", 16, 16, 16]
    assert "MaxPool" not in {n.op_type for n in result.model.graph.node}  # before the cut


def test_input_shapes_fix_or_name_dynamic_dims_and_user_inputs_drive_the_check() -> None:
    fixed = from_keras(tm.model("functional"), input_shapes={"image": (2, 16, 16, 3)})
    assert _dims(fixed.model.graph.input[0]) == [2, 16, 16, 3] and _dims(fixed.model.graph.output[0]) == [
        2,
        5,
    ]
    named = from_keras(
        tm.model("functional"),
        input_shapes={"image": ("N", 16, 16, 3)},
        check_inputs=[{"image": np.concatenate(tm.images(4, tm.SMALL_HW))}],
    )
    assert _dims(named.model.graph.input[0])[0] == "N" and _dims(named.model.graph.output[0]) == ["N", 5]
    _assert_good(named)


def test_higher_opset_is_reached_by_the_clean_pipeline() -> None:
    result = from_keras(tm.model("functional"), opset=20)
    assert default_opset(result.model) == 20
    _assert_good(result)


def test_check_fails_loudly_when_the_tolerance_is_not_met() -> None:
    with pytest.raises(ConversionError, match=r"output 'logits' does not match the source framework: cosine"):
        from_keras(tm.model("functional"), min_cosine=1.5)


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (
            {"image": (1, 17, 16, 3)},
            r"input shape image:1,17,16,3 does not fit the model's input 'image' \[\?,16,16,3\]",
        ),
        ({"image": (1, 16, 3)}, r"give one size per dimension"),
        ({"imag": (1, 16, 16, 3)}, r"input shape given for 'imag'.*Did you mean 'image'\?"),
    ],
)
def test_bad_input_shape_is_one_clear_error(shapes: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        from_keras(tm.model("functional"), input_shapes=shapes)


def test_unknown_layer_name_is_one_clear_error() -> None:
    with pytest.raises(OptionError, match=r"no input or layer named 'logit'.*Did you mean 'logits'\?"):
        from_keras(tm.model("functional"), outputs=["logit"])


def test_unconvertible_op_is_named_with_the_way_out() -> None:
    with pytest.raises(ConversionError) as info:
        from_keras(tm.unconvertible())
    text = str(info.value)
    assert "TensorFlow op(s) Lgamma (node 'with_lgamma_1/lgamma_1/Lgamma')" in text
    assert "--custom-ops Lgamma" in text and "float fallback" in text


def test_custom_ops_keeps_the_op_but_cannot_be_checked() -> None:
    with pytest.raises(ConversionError, match="keeps custom op.*Lgamma.*check=False"):
        from_keras(tm.unconvertible(), custom_ops=["Lgamma"])
    result = from_keras(tm.unconvertible(), custom_ops=["Lgamma"], check=False)
    assert [(n.op_type, n.domain) for n in result.model.graph.node if n.op_type == "Lgamma"] == [
        ("Lgamma", CUSTOM_OP_DOMAIN)
    ]
    assert result.checks == []
    onnx.checker.check_model(result.model)


def test_folder_that_is_not_a_saved_model(tmp_path) -> None:
    (tmp_path / "variables").mkdir()
    with pytest.raises(ConversionError, match=r"not a SavedModel folder \(no saved_model.pb inside\)"):
        from_saved_model(tmp_path)
    with pytest.raises(ConversionError, match="no such folder"):
        from_saved_model(tmp_path / "missing")
    with pytest.raises(
        ConversionError, match="is a folder; convert a SavedModel folder with from_saved_model"
    ):
        from_keras(tmp_path)


def test_bad_keras_files(tmp_path) -> None:
    broken = tmp_path / "broken.keras"
    broken.write_bytes(b"not a zip archive")
    with pytest.raises(ConversionError, match=r"broken.keras: Keras cannot load it"):
        from_keras(broken)
    with pytest.raises(ConversionError, match="no such file"):
        from_keras(tmp_path / "missing.h5")
    with pytest.raises(ConversionError, match=r"not a Keras file \(expected .keras, .h5 or .hdf5\)"):
        from_keras(tm.tflite_file("functional", False))


def test_unbuilt_sequential_model_says_how_to_fix() -> None:
    import keras

    with pytest.raises(ConversionError, match=r"no defined inputs.*keras.Input\(shape=...\)"):
        from_keras(keras.Sequential([keras.layers.Dense(2)]))


def test_missing_tensorflow_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    """Importing the frontends never needs TensorFlow; calling them without it says what to install."""
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    with pytest.raises(ConversionError, match=r"TensorFlow frontends need `pip install zonnx\[tf\]`"):
        from_keras("model.keras")
    with pytest.raises(ConversionError, match="zonnx\\[tf\\]"):
        from_saved_model("saved_model_dir")
    assert TF_INSTALL_HINT == "TensorFlow frontends need `pip install zonnx[tf]`"
