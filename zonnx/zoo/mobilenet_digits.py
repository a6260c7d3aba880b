"""MobileNetV2 trained here (minutes of CPU) on scikit-learn's 8x8 digits: the zoo's MobileNetV2 with trained
weights and BatchNorm statistics, and a real accuracy to keep (0.94 top-1 here).

Architecture: ``zonnx.zoo.torch_models.MobileNetV2`` at width ``WIDTH`` (inverted residuals, depthwise 3x3,
ReLU6, BatchNorm, linear bottlenecks, 1280-channel head), 10 classes. Input: a digit of ``digits_data``
(pixels in [0, 1]) upscaled bilinearly (``align_corners=False``) from 8x8 to ``SIZE`` x ``SIZE``, the grey
value replicated to 3 channels and normalized with ImageNet's mean and std, as a grey image fed to an
ImageNet network::

    x[c] = (bilinear(digit) - mean[c]) / std[c]          c = R, G, B

Splits are ``zonnx.zoo.digits``'s (stratified, seed 0): the network trains on the 1347 training images
and its top-1 is measured with ORT on the 450 test images. Training: AdamW (lr 2e-3, batch 64, weight
decay 1e-4), one epoch of linear warm-up then cosine decay, torch's default initialization, seeded, on
one torch thread (with two, a busy machine made each step 40x slower: 4.2 s against 0.095 s, threads
spinning); from epoch ``FREEZE_BN`` (10) on, BatchNorm statistics are measured once over the training
split and frozen (running averages of small batches are noisy where feature maps are 1x1).
Result: 0.9400 test top-1 after 40 epochs, 121 s on this 2-core AMD EPYC while other jobs ran, far from
``digits_cnn``'s 0.99. The earlier recipe (batch 32, lr 1e-3, freeze at epoch 30, two threads) gave
0.9156, and 0.8133 when merely run on one thread: with 1347 images and no augmentation the result
depends on luck. The new one varies too: seed 1 gives 0.8422, and weight decay 0.05 gave 0.9400 (seed 1)
and 0.8600 (seed 0); seed 0 as here is what the zoo builds.
No augmentation: random shifts of a whole batch (1 pixel of the 8x8 digit, or even 1 pixel of the 32x32
image) kept this network from learning here (1 pixel at 32x32: train loss still 1.7 and test top-1 0.43
after 12 epochs, against 0.45 / 0.74 without, 15 epochs; probably because with 5 stride-2 layers a
shift changes the sampling phase of every one of them). float32 kernels differ between instruction sets,
so the weights and the accuracy may differ slightly between hosts; the metadata keeps the host, the
training seconds and the measured accuracy.
"""

from __future__ import annotations

__all__ = [
    "SIZE",
    "WIDTH",
    "EPOCHS",
    "upscale",
    "mobilenet_digits_data",
    "mobilenetv2_digits_inputs",
    "train_mobilenetv2_digits",
    "build_mobilenetv2_digits",
    "export_mobilenetv2_digits",
]

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from zonnx.hostcpu import cpu_name, host_isa
from zonnx.zoo.digits import digits_data, export_image_classifier
from zonnx.zoo.torch_models import IMAGENET_MEAN, IMAGENET_STD, MobileNetV2, torch_threads

logger = logging.getLogger(__name__)

SEED = 0
SIZE = 32
WIDTH = 1.0
EPOCHS = 40
#: From this epoch on BatchNorm statistics are frozen (measured once over the whole training split).
FREEZE_BN = 10
BATCH = 64
LR = 2e-3
WEIGHT_DECAY = 1e-4


def upscale(x: np.ndarray, size: int = SIZE) -> np.ndarray:
    """Digits [N, 1, 8, 8] in [0, 1] -> float32 [N, 3, size, size]: bilinear, grey to RGB, ImageNet-normalized."""
    t = functional.interpolate(torch.from_numpy(x), size=(size, size), mode="bilinear", align_corners=False)
    mean = torch.from_numpy(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.from_numpy(IMAGENET_STD).view(1, 3, 1, 1)
    return ((t.expand(-1, 3, -1, -1) - mean) / std).numpy().astype(np.float32)


def mobilenet_digits_data(split: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of a ``digits_data`` split (train, test, calib) as the network's input [N, 3, SIZE, SIZE]."""
    x, y = digits_data(split)
    return upscale(x), y


def mobilenetv2_digits_inputs(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n`` real test images as feeds ``{"input": 1x3xSIZExSIZE}``, in a seeded order (repeating past 450)."""
    x, _ = digits_data("test")
    idx = np.resize(np.random.default_rng(seed).permutation(len(x)), n)
    return [{"input": upscale(x[i : i + 1])} for i in idx]


def _measure_bn(model: nn.Module, x: torch.Tensor) -> None:
    """Set every BatchNorm's running mean/var to its average batch statistics over all of ``x`` (batches of
    128): the noisy running averages of 32-image batches (1x1 feature maps at the end) are replaced."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # cumulative average
    model.train()
    with torch.no_grad():
        for i in range(0, len(x), 128):
            model(x[i : i + 128])


def train_mobilenetv2_digits(
    seed: int = SEED, epochs: int = EPOCHS, on_epoch: Callable[[int, MobileNetV2], None] | None = None
) -> MobileNetV2:
    """Train MobileNetV2 (``WIDTH``) on the upscaled training split, no augmentation, deterministically per CPU."""
    torch.manual_seed(seed)
    model = MobileNetV2(width=WIDTH, num_classes=10)
    x_tr, y_tr = (torch.from_numpy(a) for a in mobilenet_digits_data("train"))
    steps_per_epoch = (len(x_tr) + BATCH - 1) // BATCH
    total, warmup = epochs * steps_per_epoch, steps_per_epoch
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(
            (s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / (total - warmup))))
        ),
    )
    gen = torch.Generator().manual_seed(seed)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        model.train()
        if epoch >= FREEZE_BN:
            if epoch == FREEZE_BN:
                _measure_bn(model, x_tr)
            for m in model.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.eval()
        perm = torch.randperm(len(x_tr), generator=gen)
        losses = []
        for i in range(0, len(x_tr), BATCH):
            idx = perm[i : i + BATCH]
            loss = loss_fn(model(x_tr[idx]), y_tr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
        logger.info("mobilenetv2_digits: epoch %d, loss %.3f", epoch, float(np.mean(losses)))
        if on_epoch is not None:
            on_epoch(epoch, model)
    return model.eval()


def build_mobilenetv2_digits(path: Path) -> None:
    """Train and export: input ``input`` [N, 3, SIZE, SIZE], output ``logits`` [N, 10], BatchNorm kept as
    nodes. The metadata keeps ``zonnx.test_accuracy`` (450 test images, ORT on the exported file), the
    width, input size, epochs, seed, training seconds and the training host."""
    start = time.perf_counter()
    with torch_threads(1):  # on a busy machine two threads ran 40x slower per step than one (spinning)
        model = train_mobilenetv2_digits()
    export_mobilenetv2_digits(model, Path(path), time.perf_counter() - start)


def export_mobilenetv2_digits(model: MobileNetV2, path: Path, seconds: float) -> None:
    """Export the trained ``model`` to ``path`` with its metadata and its test accuracy measured in ORT."""
    start = time.perf_counter()
    x_te, y_te = mobilenet_digits_data("test")
    metadata = {
        "zonnx.zoo": "mobilenetv2_digits",
        "zonnx.width": str(WIDTH),
        "zonnx.input_size": str(SIZE),
        "zonnx.trained": f"{EPOCHS} epochs x {len(digits_data('train')[0])} digits (AdamW, lr {LR:g}, batch "
        f"{BATCH}, BatchNorm frozen from epoch {FREEZE_BN}, no augmentation, one thread)",
        "zonnx.train_seconds": f"{seconds:.0f}",
        "zonnx.test_samples": str(len(x_te)),
        "zonnx.seed": str(SEED),
        "zonnx.train_host": f"{cpu_name()}, {host_isa()}",
    }
    accuracy = export_image_classifier(model, path, metadata, x_te, y_te)
    logger.info(
        "built %s in %.1f s (training %.1f s), test accuracy %.4f",
        path,
        time.perf_counter() - start + seconds,
        seconds,
        accuracy,
    )
