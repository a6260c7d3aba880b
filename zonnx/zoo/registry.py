"""Zoo entries by name; built models are cached under ``$ZONNX_CACHE`` (default ~/.cache/zonnx)."""

from __future__ import annotations

__all__ = ["ZooEntry", "ZOO", "RENAMED", "cache_dir", "names", "provenance", "get", "sample_inputs"]

import dataclasses
import importlib
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from zonnx.errors import OptionError, did_you_mean
from zonnx.zoo.ppocr import PPOCR_FILES, ppocr_path

#: Bump when a builder changes so stale cached files are rebuilt instead of reused.
ZOO_VERSION = (
    3  # 3: mobilenetv2_digits retrained (batch 64, lr 2e-3, BatchNorm frozen from epoch 10, one thread)
)
# 2: "bert_encoder" is the trained classifier (v1 caches hold the random one)


@dataclasses.dataclass(frozen=True)
class ZooEntry:
    """A zoo model: either built by ``builder`` ("module:function" writing an .onnx to the given path)
    or shipped in a wheel (``builder`` is None)."""

    name: str
    description: str
    builder: str | None
    inputs: str | None = None  # "module:function(n, seed) -> list[feeds]" for real sample inputs
    provenance: str = "random"  # "pretrained" (third-party weights), "trained here", or "random" (untrained)


ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in [
        ZooEntry(
            "digits_cnn",
            "small CNN trained at first use on scikit-learn's 8x8 digits (test accuracy in metadata)",
            "zonnx.zoo.digits:build_digits_cnn",
            "zonnx.zoo.digits:digits_inputs",
            "trained here",
        ),
        ZooEntry(
            "mobilenetv2_digits",
            "MobileNetV2 (width 1.0: inverted residuals, depthwise, ReLU6, BatchNorm) trained here at first use "
            "(minutes of CPU) on scikit-learn's 8x8 digits upscaled to 1x3x32x32 (test accuracy in metadata)",
            "zonnx.zoo.mobilenet_digits:build_mobilenetv2_digits",
            "zonnx.zoo.mobilenet_digits:mobilenetv2_digits_inputs",
            "trained here",
        ),
        ZooEntry(
            "resnet18-random",
            "ResNet-18-style CNN (torch, seeded random weights, BN statistics from synthetic images; NOT "
            "trained: for speed and exactness only), 1x3x224x224",
            "zonnx.zoo.torch_models:build_resnet18",
            "zonnx.zoo.torch_models:image_inputs",
        ),
        ZooEntry(
            "mobilenetv2-random",
            "MobileNetV2-style CNN (torch, seeded random weights, BN statistics from synthetic images; NOT "
            "trained: for speed and exactness only), 1x3x224x224",
            "zonnx.zoo.torch_models:build_mobilenetv2",
            "zonnx.zoo.torch_models:image_inputs",
        ),
        ZooEntry(
            "transformer-random",
            "small transformer encoder (attention, decomposed LayerNorm and GELU), opset 13; NOT trained: "
            "seeded random weights",
            "zonnx.zoo.torch_models:build_transformer",
            "zonnx.zoo.torch_models:token_inputs",
        ),
        ZooEntry(
            "bert_encoder-random",
            "MiniLM-like BERT sentence encoder (6 x 384, 12 heads, attention mask, masked mean pooling), opset 13; "
            "NOT trained: fixed-seed init with 4 LayerNorm outlier channels (beta +-3) as trained BERTs show",
            "zonnx.zoo.bert:build_bert_encoder",
            "zonnx.zoo.bert:bert_inputs",
        ),
        ZooEntry(
            "bert_encoder",
            "small BERT sequence classifier (4 x 128, 4 heads, attention mask, GELU FFN, pooler + classifier; "
            "outputs logits [N, 32] and the pooled embedding), opset 13; trained here (about a minute of CPU) "
            "on the topic of synthetic padded sentences (held-out accuracy in metadata)",
            "zonnx.zoo.bert_trained:build_bert_classifier",
            "zonnx.zoo.bert_trained:bert_classifier_inputs",
            "trained here",
        ),
        ZooEntry(
            "yolo_det",
            "small YOLO-style detector (Conv-BN-SiLU, decoupled head: decoded boxes in pixels concatenated with "
            "sigmoid scores), opset 13; trained here (under a minute of CPU) on synthetic rectangles",
            "zonnx.zoo.yolo:build_yolo_det",
            "zonnx.zoo.yolo:yolo_inputs",
            "trained here",
        ),
        ZooEntry(
            "ppocr_det",
            "PP-OCRv4 text detection (rapidocr-onnxruntime wheel)",
            None,
            "zonnx.zoo.text_images:det_inputs",
            "pretrained",
        ),
        ZooEntry(
            "ppocr_rec",
            "PP-OCRv4 text recognition (rapidocr-onnxruntime wheel)",
            None,
            "zonnx.zoo.text_images:rec_inputs",
            "pretrained",
        ),
        ZooEntry(
            "ppocr_cls",
            "PP-OCR mobile v2.0 direction classifier (rapidocr-onnxruntime wheel)",
            None,
            "zonnx.zoo.text_images:cls_inputs",
            "pretrained",
        ),
    ]
}


#: Old names of renamed zoo models -> their new names (an old name is refused with the new one).
RENAMED = {
    "resnet18": "resnet18-random",
    "mobilenetv2": "mobilenetv2-random",
    "transformer": "transformer-random",
}


def cache_dir() -> Path:
    """Folder for built zoo models: ``$ZONNX_CACHE`` or ``~/.cache/zonnx``, versioned by ZOO_VERSION."""
    root = Path(os.environ.get("ZONNX_CACHE") or Path.home() / ".cache" / "zonnx")
    return root / f"zoo-v{ZOO_VERSION}"


def names() -> list[str]:
    return list(ZOO)


def provenance(name: str) -> str:
    """Where the weights of zoo model ``name`` come from: "pretrained", "trained here" or "random"."""
    return _entry(name).provenance


def _entry(name: str) -> ZooEntry:
    if name in RENAMED:
        raise OptionError(
            f"zoo model {name!r} is now {RENAMED[name]!r} (seeded random weights, not trained): use that name."
        )
    if name not in ZOO:
        hint = did_you_mean(name, [*ZOO, *RENAMED])
        for old, new in RENAMED.items():
            hint = hint.replace(repr(old), repr(new))
        raise OptionError(f"unknown zoo model {name!r}.{hint} Known: {', '.join(ZOO)}.")
    return ZOO[name]


def _resolve(ref: str) -> Callable:
    module, _, func = ref.partition(":")
    return getattr(importlib.import_module(module), func)


def get(name: str, *, rebuild: bool = False) -> Path:
    """Return the path of zoo model ``name``, building it into the cache first when missing."""
    entry = _entry(name)
    if entry.builder is None:
        assert name in PPOCR_FILES
        return ppocr_path(name)
    path = cache_dir() / f"{name}.onnx"
    if rebuild or not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        _resolve(entry.builder)(path)
    return path


def sample_inputs(name: str, n: int = 8, *, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Return ``n`` realistic input feeds for zoo model ``name`` (real digits, rendered text, images)."""
    entry = _entry(name)
    if entry.inputs is None:
        raise OptionError(f"zoo model {name!r} has no sample inputs.")
    return _resolve(entry.inputs)(n, seed)
