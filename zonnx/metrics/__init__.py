"""Model metrics: one number saying how close a quantized (or compiled) model is to its float model.

A metric gets, sample by sample, the float model's outputs and the other model's outputs
(``update(float_outputs, quant_outputs, feed)``) and returns one number (``result()``, higher is
better unless ``higher_is_better = False``); the protocol is in ``zonnx.metrics.protocol``.
Built-ins: ``cosine``, ``sqnr``, ``top1``, ``top5`` (``zonnx.metrics.builtin``), ``mean-iou`` and
``box-f1`` for detectors (``zonnx.metrics.detection``), ``char-accuracy``
(``zonnx.metrics.ocr``); plugins as ``path/to/file.py:ClassName`` (``zonnx.metrics.plugins``);
``evaluate`` runs both models and scores them (``zonnx.metrics.evaluate``).
"""

from zonnx.metrics.builtin import Cosine, Sqnr, Top1, TopK
from zonnx.metrics.detection import BoxF1, MeanIoU
from zonnx.metrics.evaluate import evaluate
from zonnx.metrics.ocr import CharAccuracy, model_characters
from zonnx.metrics.plugins import BUILTIN_METRICS, load_metric
from zonnx.metrics.protocol import Metric

__all__ = [
    "Metric",
    "BUILTIN_METRICS",
    "load_metric",
    "evaluate",
    "Cosine",
    "Sqnr",
    "Top1",
    "TopK",
    "MeanIoU",
    "BoxF1",
    "CharAccuracy",
    "model_characters",
]
