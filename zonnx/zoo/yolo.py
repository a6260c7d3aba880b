"""A small YOLO-style detector (one stride-8 head, decoupled box / score branches), trained here in seconds.

Image [N, 3, 64, 64] -> backbone of Conv-BN-SiLU stages (strides 2, 2, 2; 16, 32, 64 channels) ->
an 8 x 8 grid. The head, per cell (YOLOX's decoupled head and decode)::

    xy = (t_xy + grid) * 8          wh = exp(t_wh) * 8           (boxes in pixels, 0..64)
    obj = sigmoid(t_obj)            cls = sigmoid(t_cls)          (scores in [0, 1])
    detections = Concat(xy, wh, obj, cls) -> [N, 64 cells, 4 + 1 + CLASSES]

so one output tensor holds values in [0, 64] next to values in [0, 1]: the detection-head trap of a
quantizer that gives the Concat one 8-bit grid (the scores then get about 3 codes).

Weights: ``TRAIN_STEPS`` Adam steps on synthetic images (noise plus 1-3 coloured rectangles; the class
is the colour), under a minute of CPU; objectness BCE on the cell holding a box centre, box L1 on
those cells, class BCE. Deterministic for a seed.
"""

from __future__ import annotations

__all__ = [
    "CLASSES",
    "IMAGE",
    "STRIDE",
    "YoloTiny",
    "synthetic_boxes",
    "yolo_module",
    "build_yolo_det",
    "yolo_inputs",
]

import logging
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from zonnx.zoo.torch_models import export_legacy, torch_threads

logger = logging.getLogger(__name__)

CLASSES = 3
IMAGE = 64
STRIDE = 8
TRAIN_STEPS = 150
_COLOURS = np.array([[1.0, -1.0, -1.0], [-1.0, 1.0, -1.0], [-1.0, -1.0, 1.0]], dtype=np.float32)


def _block(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.SiLU())


class YoloTiny(nn.Module):
    """Backbone + decoupled head; ``forward`` returns decoded detections [N, cells, 4 + 1 + CLASSES]."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            _block(3, 16, 2), _block(16, 32, 2), _block(32, 64, 2), _block(64, 64, 1)
        )
        self.reg = nn.Sequential(_block(64, 32, 1), nn.Conv2d(32, 4, 1))
        self.cls = nn.Sequential(_block(64, 32, 1), nn.Conv2d(32, 1 + CLASSES, 1))
        g = IMAGE // STRIDE
        ys, xs = torch.meshgrid(torch.arange(g), torch.arange(g), indexing="ij")
        self.register_buffer("grid", torch.stack([xs, ys]).float().view(1, 2, g, g), persistent=False)

    def raw(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Undecoded box offsets [N, 4, g, g] and score logits [N, 1 + CLASSES, g, g]."""
        f = self.backbone(x)
        return self.reg(f), self.cls(f)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, s = self.raw(x)
        xy = (t[:, :2] + self.grid) * STRIDE
        wh = torch.exp(t[:, 2:]) * STRIDE
        out = torch.cat([xy, wh, torch.sigmoid(s)], dim=1)
        return out.flatten(2).transpose(1, 2)


def synthetic_boxes(
    n: int, seed: int
) -> tuple[np.ndarray, list[list[tuple[float, float, float, float, int]]]]:
    """``n`` images [n, 3, 64, 64] (noise plus 1-3 rectangles) and their boxes (cx, cy, w, h, class)."""
    rng = np.random.default_rng(seed)
    images = rng.normal(0.0, 0.3, (n, 3, IMAGE, IMAGE)).astype(np.float32)
    boxes: list[list[tuple[float, float, float, float, int]]] = []
    for i in range(n):
        mine = []
        for _ in range(rng.integers(1, 4)):
            w, h = rng.integers(8, 33, 2)
            x0, y0 = rng.integers(0, IMAGE - w), rng.integers(0, IMAGE - h)
            c = int(rng.integers(CLASSES))
            images[i, :, y0 : y0 + h, x0 : x0 + w] = _COLOURS[c][:, None, None]
            mine.append((x0 + w / 2, y0 + h / 2, float(w), float(h), c))
        boxes.append(mine)
    return images, boxes


def _targets(boxes: list, g: int) -> tuple[torch.Tensor, ...]:
    n = len(boxes)
    obj = torch.zeros(n, 1, g, g)
    cls = torch.zeros(n, CLASSES, g, g)
    reg = torch.zeros(n, 4, g, g)
    for i, mine in enumerate(boxes):
        for cx, cy, w, h, c in mine:
            gx, gy = int(cx // STRIDE), int(cy // STRIDE)
            obj[i, 0, gy, gx] = 1.0
            cls[i, c, gy, gx] = 1.0
            reg[i, :, gy, gx] = torch.tensor(
                [cx / STRIDE - gx, cy / STRIDE - gy, np.log(w / STRIDE), np.log(h / STRIDE)]
            )
    return obj, cls, reg


def yolo_module(seed: int = 0, steps: int = TRAIN_STEPS) -> YoloTiny:
    """The detector trained ``steps`` Adam steps (batch 16) on ``synthetic_boxes`` from ``seed``."""
    torch.manual_seed(seed)
    model = YoloTiny()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    bce = nn.BCEWithLogitsLoss()
    g = IMAGE // STRIDE
    for step in range(steps):
        images, boxes = synthetic_boxes(16, seed * 100_000 + step)
        obj, cls, reg = _targets(boxes, g)
        t, s = model.raw(torch.from_numpy(images))
        cells = obj.expand_as(reg) > 0
        loss = bce(s[:, :1], obj) + bce(s[:, 1:], cls) * 0.5 + (t - reg).abs()[cells].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    logger.info("yolo_det: %d steps, final loss %.3f", steps, float(loss))
    return model.eval()


def build_yolo_det(path: Path) -> None:
    """Train (seconds) and export: input ``images`` [N, 3, 64, 64], output ``detections`` [N, 64, 8]."""
    start = time.perf_counter()
    with torch_threads():
        model = yolo_module()
        export_legacy(
            model,
            (torch.from_numpy(yolo_inputs(1, seed=123)[0]["images"]),),
            Path(path),
            input_names=["images"],
            output_names=["detections"],
            dynamic_axes={},
            metadata={"zonnx.zoo": "yolo_det", "zonnx.trained": f"{TRAIN_STEPS} steps on synthetic boxes"},
        )
    logger.info("built %s in %.1f s", path, time.perf_counter() - start)


def yolo_inputs(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n`` feeds ``{"images": [1, 3, 64, 64]}`` of synthetic rectangles (held out from training)."""
    images, _ = synthetic_boxes(n, 7_000_000 + seed)
    return [{"images": images[i : i + 1]} for i in range(n)]
