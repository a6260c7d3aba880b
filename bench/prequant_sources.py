"""Already-quantized models as users get them, made by the tools that users use: ONNX Runtime's
``quantize_static`` (QOperator / QDQ, u8 activations, per-channel s8 weights) and ``quantize_dynamic``,
TensorFlow's TFLite converter (full-integer int8) and torch's eager-mode QAT (exported by ``zonnx convert``).

Each maker writes its source model into a folder and returns its path; the bench retargets it.
"""

from __future__ import annotations

__all__ = [
    "QAT_EPOCHS",
    "TFLITE_HW",
    "ort_static",
    "ort_dynamic",
    "tflite_int8",
    "tflite_feeds",
    "qat_digits",
]

import contextlib
import copy
import io
import logging
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

#: Epochs of QAT fine-tuning of the trained float digits CNN (observers and BN statistics frozen after 2).
QAT_EPOCHS = 3
#: Input size of the Keras MobileNetV2 (alpha 0.35) converted to TFLite int8.
TFLITE_HW = 96


class _Reader:
    """ORT's CalibrationDataReader protocol over a list of feeds."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.it, None)


def _preprocessed(zoo_name: str, folder: Path) -> Path:
    """ORT's own pre-processing (``quant_pre_process``: shape inference, BN folding) as its docs ask."""
    import zonnx.zoo as zoo

    pre = folder / f"{zoo_name}_pre.onnx"
    # ORT's pre-processing writes a uuid-named external data file into the working directory for some
    # models (the trained BERT): run it inside the bench's own folder
    if not pre.exists():
        with contextlib.chdir(folder):
            _ort_pre_process(zoo.get(zoo_name), pre)
    return pre


def _ort_pre_process(src: Path, pre: Path) -> None:
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(str(src), str(pre))
    except Exception:  # noqa: BLE001 - ORT's symbolic shape inference gives up on attention masks
        logger.info("%s: ORT's symbolic shape inference failed; pre-processing without it", src.name)
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)


def ort_static(zoo_name: str, folder: Path, fmt: str, feeds: list[dict[str, np.ndarray]]) -> Path:
    """``zoo_name`` quantized by ORT's ``quantize_static`` in ``fmt`` ("QOperator" or "QDQ"): u8
    activations, per-channel s8 weights, MinMax calibration on ``feeds``."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    out = folder / f"{zoo_name}_{fmt}.onnx"
    quantize_static(str(_preprocessed(zoo_name, folder)), str(out), _Reader(feeds), quant_format=getattr(QuantFormat, fmt),
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
    return out


def ort_dynamic(zoo_name: str, folder: Path) -> Path:
    """``zoo_name`` quantized by ORT's ``quantize_dynamic`` (s8 weights; activations quantized at run time)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = folder / f"{zoo_name}_dynamic.onnx"
    quantize_dynamic(str(_preprocessed(zoo_name, folder)), str(out), weight_type=QuantType.QInt8)
    return out


def tflite_feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    """``n`` NHWC float images for the TFLite model (standard normal, input ``image``)."""
    rng = np.random.default_rng(seed)
    return [{"image": rng.standard_normal((1, TFLITE_HW, TFLITE_HW, 3)).astype(np.float32)} for _ in range(n)]


def tflite_int8(folder: Path, calib: list[dict[str, np.ndarray]]) -> Path:
    """keras.applications.MobileNetV2 (alpha 0.35, random seeded weights, BN statistics randomized) made
    full-integer int8 by TF's own TFLiteConverter (per-channel weights, asymmetric activations,
    calibrated on ``calib``, float input/output), then converted to ONNX by ``zonnx convert``."""
    from zonnx.converters.from_tflite import from_tflite
    from zonnx.converters.tf_support import quiet_tf, require_tf
    from zonnx.ir.io import save_model
    from zonnx.zoo.keras_weights import randomize_statistics

    tf, _ = require_tf()
    import keras

    keras.utils.set_random_seed(0)
    with quiet_tf():
        inp = keras.Input((TFLITE_HW, TFLITE_HW, 3), name="image")
        app = keras.applications.MobileNetV2(
            weights=None, input_tensor=inp, alpha=0.35, classes=10, classifier_activation=None
        )
    randomize_statistics(app, 0)  # fresh BN layers are identities: give them trained-like statistics
    converter = tf.lite.TFLiteConverter.from_keras_model(app)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([f["image"]] for f in calib)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    tfl = folder / "mobilenetv2_int8.tflite"
    with quiet_tf(), contextlib.redirect_stdout(io.StringIO()):
        tfl.write_bytes(converter.convert())
    out = folder / "mobilenetv2_tflite_int8.onnx"
    save_model(from_tflite(tfl).model, out)
    return out


def qat_digits(folder: Path) -> tuple[Path, Path]:
    """(QAT model, float model): the zoo's digits CNN trained in float (``train_digits_cnn``, seed 0),
    then fine-tuned ``QAT_EPOCHS`` epochs with torch eager-mode QAT (fbgemm qconfig: per-channel s8
    weights, u8 activations; SGD lr 1e-3, seed 0), converted by torch and exported by ``zonnx convert``
    (QDQ). The float model is the same trained network before QAT (for PTQ from float)."""
    import torch
    import torch.ao.quantization as tq
    from torch import nn

    from zonnx.converters.from_torch import from_torch
    from zonnx.ir.io import save_model
    from zonnx.zoo.digits import DigitsCNN, digits_data, train_digits_cnn
    from zonnx.zoo.torch_models import torch_threads

    class QuantDigits(nn.Module):
        """DigitsCNN with quant stubs and FloatFunctional add/cat (eager QAT needs them)."""

        def __init__(self, src: DigitsCNN) -> None:
            super().__init__()
            self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
            self.stem, self.res, self.pool = src.stem, src.res, src.pool
            self.branch3, self.branch1, self.fc = src.branch3, src.branch1, src.fc
            self.relu = nn.ReLU()
            self.add, self.cat = nn.quantized.FloatFunctional(), nn.quantized.FloatFunctional()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.stem(self.quant(x))
            x = self.pool(self.relu(self.add.add(x, self.res(x))))
            x = self.cat.cat([self.branch3(x), self.branch1(x)], dim=1)
            return self.dequant(self.fc(torch.flatten(x, 1)))

    names = {"input_names": ["input"], "output_names": ["logits"],
             "dynamic_axes": {"input": {0: "N"}, "logits": {0: "N"}}}  # fmt: skip
    x_te, _ = digits_data("test")
    example = torch.from_numpy(x_te[:1])
    with torch_threads(1):
        fl = train_digits_cnn()
        float_path = folder / "digits_float.onnx"
        save_model(from_torch(copy.deepcopy(fl), example, **names).model, float_path)
        torch.backends.quantized.engine = "fbgemm"
        model = QuantDigits(copy.deepcopy(fl)).train()
        fuse = [["stem.0", "stem.1", "stem.2"], ["res.0", "res.1", "res.2"], ["res.3", "res.4"],
                ["branch3.0", "branch3.1", "branch3.2"], ["branch1.0", "branch1.1", "branch1.2"]]  # fmt: skip
        model = tq.fuse_modules_qat(model, fuse)
        model.qconfig = tq.get_default_qat_qconfig("fbgemm")
        prepared = tq.prepare_qat(model)
        x_tr, y_tr = (torch.from_numpy(a) for a in digits_data("train"))
        opt = torch.optim.SGD(prepared.parameters(), lr=1e-3, momentum=0.9)
        gen = torch.Generator().manual_seed(0)
        for epoch in range(QAT_EPOCHS):
            perm = torch.randperm(len(x_tr), generator=gen)
            for i in range(0, len(x_tr), 64):
                idx = perm[i : i + 64]
                opt.zero_grad()
                nn.functional.cross_entropy(prepared(x_tr[idx]), y_tr[idx]).backward()
                opt.step()
            if epoch == QAT_EPOCHS - 2:
                prepared.apply(tq.disable_observer)
                prepared.apply(torch.ao.nn.intrinsic.qat.freeze_bn_stats)
        quantized = tq.convert(prepared.eval())
        qat_path = folder / "digits_qat.onnx"
        save_model(from_torch(quantized, example, **names).model, qat_path)
    return qat_path, float_path
