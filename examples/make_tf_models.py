"""Write the example Keras and TFLite models and their data for examples/keras.toml and tflite_int8.toml.

    .venv/bin/python examples/make_tf_models.py     (needs zonnx[tf]; about 20 s)

models/small.keras: a small functional CNN (Conv+BN+ReLU, depthwise, pooling, Dense; input ``image``
[N,16,16,3], 5 logits) with random weights; models/small_int8.tflite: the same model converted by
TensorFlow Lite's converter to full-integer int8; models/calib.npz and models/eval.npz: 32 and 64
standard-normal images (the inputs both models were built for), stacked on the first axis.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent / "models"


def build(seed: int = 0) -> None:
    import keras
    import tensorflow as tf
    from keras import layers

    HERE.mkdir(exist_ok=True)
    keras.utils.set_random_seed(seed)
    inp = keras.Input((16, 16, 3), name="image")
    x = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(8, 3, padding="same")(inp)))
    a = layers.BatchNormalization()(layers.DepthwiseConv2D(3, padding="same")(x))
    x = layers.Concatenate()([layers.ReLU(6.0)(a), layers.MaxPooling2D(3, strides=1, padding="same")(x)])
    x = layers.AveragePooling2D(2)(layers.Conv2D(12, 1, activation="relu")(x))
    model = keras.Model(inp, layers.Dense(5, name="logits")(layers.GlobalAveragePooling2D()(x)))
    model.save(HERE / "small.keras")
    rng = np.random.default_rng(seed)
    calib = rng.standard_normal((32, 16, 16, 3)).astype(np.float32)
    np.savez(HERE / "calib.npz", image=calib)
    np.savez(HERE / "eval.npz", image=rng.standard_normal((64, 16, 16, 3)).astype(np.float32))
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([calib[i : i + 1]] for i in range(len(calib)))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    (HERE / "small_int8.tflite").write_bytes(converter.convert())


if __name__ == "__main__":
    build()
    print(f"wrote {', '.join(sorted(p.name for p in HERE.iterdir()))} in {HERE}")
