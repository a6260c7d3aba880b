"""TensorFlow test models built at test time (no network): small Keras models, a random-weight Keras
application, their SavedModel exports and TFLite float/int8 files. Built once per process and cached."""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from zonnx.converters.tf_support import quiet_tf, require_tf
from zonnx.zoo.keras_weights import randomize_statistics as randomize

#: Image size of the small models (NHWC input), and of the Keras application.
SMALL_HW = 16
APP_HW = 96


@functools.cache
def workdir() -> Path:
    """A folder for this process's model files, removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="zonnx-tf-models-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def functional(seed: int = 0) -> Any:
    """Functional CNN: Conv+BN+ReLU, DepthwiseConv+BN, a MaxPool branch, Concatenate, AveragePool,
    GlobalAveragePool, Dense. Input ``image`` [N,16,16,3], output ``logits`` [N,5]."""
    require_tf()
    import keras
    from keras import layers

    keras.utils.set_random_seed(seed)
    inp = keras.Input((SMALL_HW, SMALL_HW, 3), name="image")
    x = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(8, 3, padding="same")(inp)))
    a = layers.BatchNormalization()(layers.DepthwiseConv2D(3, padding="same")(x))
    b = layers.MaxPooling2D(3, strides=1, padding="same")(x)
    x = layers.Concatenate(name="concat")([layers.ReLU(6.0)(a), b])
    x = layers.AveragePooling2D(2)(layers.Conv2D(12, 1, activation="relu")(x))
    out = layers.Dense(5, name="logits")(layers.GlobalAveragePooling2D()(x))
    return randomize(keras.Model(inp, out, name="small_functional"), seed)


def sequential(seed: int = 0) -> Any:
    """Sequential CNN: Conv+BN, DepthwiseConv, AveragePool, Flatten, Dense+BN, Dense. Input ``pixels``
    [N,12,12,3], output ``scores`` [N,4]."""
    require_tf()
    import keras
    from keras import layers

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((12, 12, 3), name="pixels"),
            layers.Conv2D(6, 3, activation="relu"),
            layers.BatchNormalization(),
            layers.DepthwiseConv2D(3, padding="same", activation="relu"),
            layers.AveragePooling2D(2),
            layers.Flatten(),
            layers.Dense(16),
            layers.BatchNormalization(),
            layers.Dense(4, name="scores"),
        ],
        name="small_sequential",
    )
    return randomize(model, seed)


def two_inputs(seed: int = 0) -> Any:
    """Functional model with two inputs (``a`` [N,8], ``b`` [N,4]) and two outputs (``sum``, ``prod``)."""
    require_tf()
    import keras
    from keras import layers

    keras.utils.set_random_seed(seed)
    a, b = keras.Input((8,), name="a"), keras.Input((4,), name="b")
    h = layers.Concatenate()([layers.Dense(6)(a), b])
    return randomize(
        keras.Model([a, b], [layers.Dense(3, name="sum")(h), layers.Dense(2, name="prod")(h)]), seed
    )


def mobilenet_v2() -> Any:
    """keras.applications.MobileNetV2 (alpha 0.35, 96x96, 10 classes) with random weights: the real
    model the project did not write."""
    require_tf()
    import keras

    keras.utils.set_random_seed(0)
    with quiet_tf():
        model = keras.applications.MobileNetV2(
            weights=None, input_shape=(APP_HW, APP_HW, 3), alpha=0.35, classes=10
        )
    return randomize(model, 0)


def unconvertible() -> Any:
    """A model with TensorFlow's Lgamma op, which tf2onnx 1.17 cannot convert."""
    tf, _ = require_tf()
    import keras
    from keras import layers

    class Lgamma(layers.Layer):
        def call(self, x: Any) -> Any:
            return tf.raw_ops.Lgamma(x=x)

    inp = keras.Input((4,), name="x")
    out = layers.Dense(3, name="out")(Lgamma(name="lgamma")(layers.Dense(4, activation="relu")(inp)))
    return keras.Model(inp, out, name="with_lgamma")


def images(n: int, hw: int, seed: int = 0, channels: int = 3) -> list[np.ndarray]:
    """``n`` NHWC float images of batch 1, standard normal."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, hw, hw, channels)).astype(np.float32) for _ in range(n)]


def to_tflite(model: Any, path: Path, *, int8: bool, samples: int = 16) -> Path:
    """Convert with TF's own converter: float, or full-integer int8 (int8 input and output; TFLite's
    defaults: per-channel weights, asymmetric activations) calibrated on ``samples`` normal inputs."""
    tf, _ = require_tf()
    shape = tuple(d or 1 for d in model.inputs[0].shape)
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if int8:
        rng = np.random.default_rng(1)
        data = [rng.standard_normal(shape).astype(np.float32) for _ in range(samples)]
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([x] for x in data)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    with quiet_tf(), contextlib.redirect_stdout(io.StringIO()):  # the converter prints the whole signature
        path.write_bytes(converter.convert())
    return path


@functools.cache
def model(kind: str) -> Any:
    """One shared instance of "functional", "sequential", "two_inputs" or "mobilenet_v2"."""
    builders = {"functional": functional, "sequential": sequential, "two_inputs": two_inputs}
    return mobilenet_v2() if kind == "mobilenet_v2" else builders[kind]()


@functools.cache
def keras_file(kind: str, suffix: str = ".keras") -> Path:
    """The ``kind`` model saved as .keras or .h5."""
    path = workdir() / f"{kind}{suffix}"
    with quiet_tf():
        model(kind).save(path)
    return path


@functools.cache
def saved_model(kind: str) -> Path:
    """The ``kind`` model exported with ``model.export()`` (a SavedModel folder)."""
    path = workdir() / f"{kind}_savedmodel"
    with quiet_tf():
        model(kind).export(str(path), verbose=False)
    return path


@functools.cache
def tflite_file(kind: str, int8: bool) -> Path:
    """The ``kind`` model as a .tflite file (float or full-integer int8), built once per process."""
    return to_tflite(model(kind), workdir() / f"{kind}_{'int8' if int8 else 'float'}.tflite", int8=int8)
