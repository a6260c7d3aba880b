"""Models for tests, benchmarks and the default build: built locally, cached on disk, rebuilt when missing.

Provenance (``provenance(name)``): the PP-OCR models are pretrained third-party weights shipped in the
rapidocr-onnxruntime wheel; ``digits_cnn``, ``mobilenetv2_digits``, ``yolo_det`` and ``bert_encoder`` are trained here at first
use; every ``*-random`` model has seeded random weights and serves speed and exactness checks only,
never accuracy claims.
"""

from zonnx.zoo.registry import RENAMED, ZOO, ZooEntry, cache_dir, get, names, provenance, sample_inputs

__all__ = ["RENAMED", "ZOO", "ZooEntry", "cache_dir", "get", "names", "provenance", "sample_inputs"]
