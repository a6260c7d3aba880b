"""A small CNN trained in seconds on scikit-learn's 8x8 digits: a zoo model with a real accuracy to keep."""

from __future__ import annotations

__all__ = [
    "SEED",
    "TEST_FRACTION",
    "CALIB_SIZE",
    "DigitsCNN",
    "digits_data",
    "digits_inputs",
    "train_digits_cnn",
    "build_digits_cnn",
    "evaluate_top1",
]

import functools
import logging
import os
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from zonnx.errors import OptionError
from zonnx.hostcpu import cpu_name, host_isa
from zonnx.ir.io import save_model
from zonnx.verify import ort_session
from zonnx.zoo.torch_models import export_legacy, torch_threads

logger = logging.getLogger(__name__)

SEED = 0
#: Fraction of the 1797 images held out as the fixed test split (stratified, ``random_state=SEED``).
TEST_FRACTION = 0.25
#: The calibration split is the first CALIB_SIZE images of the (shuffled) training split.
CALIB_SIZE = 256
EPOCHS = 20
BATCH = 64


@functools.cache
def _splits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = (data.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = data.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=TEST_FRACTION, random_state=SEED, stratify=y)
    return {
        "train": (x_tr, y_tr),
        "test": (x_te, y_te),
        "calib": (x_tr[:CALIB_SIZE], y_tr[:CALIB_SIZE]),
    }


def digits_data(split: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """Return ``(x, y)`` of a fixed split: x float32 [N, 1, 8, 8] with pixels in [0, 1], y int64 labels.

    ``train`` (1347 images) and ``test`` (450) are a stratified split of sklearn's ``load_digits``;
    ``calib`` is the first 256 training images (for quantization calibration, never the test set).
    """
    splits = _splits()
    if split not in splits:
        raise OptionError(f"digits split {split!r} does not exist; use one of {', '.join(splits)}.")
    x, y = splits[split]
    return x.copy(), y.copy()


def digits_inputs(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n`` real test images as feeds ``{"input": 1x1x8x8}``, in a seeded order (repeating past 450)."""
    x, _ = digits_data("test")
    order = np.random.default_rng(seed).permutation(len(x))
    idx = np.resize(order, n)
    return [{"input": x[i : i + 1]} for i in idx]


class DigitsCNN(nn.Module):
    """Conv+BN+ReLU stem, a residual block (Add), max pool, two branches joined by Concat, GAP, Gemm."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.res = nn.Sequential(
            nn.Conv2d(16, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
        )
        self.pool = nn.MaxPool2d(2)
        self.branch3 = nn.Sequential(nn.Conv2d(16, 24, 3, padding=1), nn.BatchNorm2d(24), nn.ReLU())
        self.branch1 = nn.Sequential(nn.Conv2d(16, 8, 1), nn.BatchNorm2d(8), nn.ReLU())
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.pool(torch.relu(x + self.res(x)))
        x = torch.cat([self.branch3(x), self.branch1(x)], dim=1)
        return self.fc(torch.flatten(x, 1))


def train_digits_cnn(seed: int = SEED, epochs: int = EPOCHS) -> DigitsCNN:
    """Train DigitsCNN with Adam on the train split (random +-1 pixel shifts), deterministically."""
    torch.manual_seed(seed)
    x_tr, y_tr = (torch.from_numpy(a) for a in digits_data("train"))
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=3e-3, total_steps=epochs * ((len(x_tr) + BATCH - 1) // BATCH)
    )
    gen = torch.Generator().manual_seed(seed)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(x_tr), generator=gen)
        for i in range(0, len(x_tr), BATCH):
            idx = perm[i : i + BATCH]
            xb = x_tr[idx]
            dx, dy = (int(v) for v in torch.randint(-1, 2, (2,), generator=gen))
            xb = torch.roll(xb, shifts=(dy, dx), dims=(2, 3))
            opt.zero_grad()
            loss_fn(model(xb), y_tr[idx]).backward()
            opt.step()
            sched.step()
    return model.eval()


def evaluate_top1(
    model: str | os.PathLike[str] | onnx.ModelProto | ort.InferenceSession, x: np.ndarray, y: np.ndarray
) -> float:
    """Top-1 accuracy of an ONNX classifier run in ORT on images ``x`` [N, 1, 8, 8] with labels ``y``."""
    sess = model if isinstance(model, ort.InferenceSession) else ort_session(model)
    name = sess.get_inputs()[0].name
    logits = np.concatenate([sess.run(None, {name: x[i : i + 64]})[0] for i in range(0, len(x), 64)])
    return float(np.mean(logits.argmax(axis=1) == y))


def build_digits_cnn(path: Path) -> None:
    """Train the digits CNN and write it to ``path`` (input ``input`` [N,1,8,8], output ``logits`` [N,10]).

    The metadata keeps ``zonnx.test_accuracy`` (top-1 measured with ORT on the exported file),
    ``zonnx.train_samples``, ``zonnx.test_samples``, ``zonnx.seed`` and ``zonnx.train_host`` (the CPU's
    instruction set: torch's float32 training is deterministic per CPU, not across CPUs, so the weights
    and the accuracy differ between hosts, e.g. 0.9956 on an Intel AMX host and 0.9933 on AMD EPYC).
    """
    path = Path(path)
    start = time.perf_counter()
    with torch_threads(1):  # tiny kernels: a second thread gains little and suffers badly on a busy machine
        model = train_digits_cnn()
    x_te, y_te = digits_data("test")
    x_tr, _ = digits_data("train")
    metadata = {
        "zonnx.zoo": "digits_cnn",
        "zonnx.train_samples": str(len(x_tr)),
        "zonnx.test_samples": str(len(x_te)),
        "zonnx.seed": str(SEED),
        "zonnx.train_host": f"{cpu_name()}, {host_isa()}",
    }
    accuracy = export_image_classifier(model, path, metadata, x_te, y_te)
    logger.info("built %s in %.1f s, test accuracy %.4f", path, time.perf_counter() - start, accuracy)


def export_image_classifier(
    model: torch.nn.Module, path: Path, metadata: dict[str, str], x_te: np.ndarray, y_te: np.ndarray
) -> float:
    """Export a trained image classifier the way the zoo's classifiers are kept (input ``input``,
    output ``logits``, dynamic batch), measure its top-1 on the test split in ORT, record it in the
    metadata as ``zonnx.test_accuracy`` and save it to ``path``; returns that accuracy."""
    proto = export_legacy(
        model,
        (torch.from_numpy(x_te[:1]),),
        None,
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}},
        metadata=metadata,
    )
    accuracy = evaluate_top1(proto, x_te, y_te)
    proto.metadata_props.add(key="zonnx.test_accuracy", value=f"{accuracy:.4f}")
    save_model(proto, path)
    return accuracy
