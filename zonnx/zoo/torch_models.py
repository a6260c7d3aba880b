"""Zoo CNNs and a transformer defined in torch (ResNet-18, MobileNetV2, encoder), exported at opset 13."""

from __future__ import annotations

__all__ = [
    "OPSET",
    "IMAGE_SIZE",
    "VOCAB_SIZE",
    "SEQ_LEN",
    "torch_threads",
    "export_legacy",
    "resnet18_module",
    "mobilenetv2_module",
    "transformer_module",
    "build_resnet18",
    "build_mobilenetv2",
    "build_transformer",
    "smooth_images",
    "image_inputs",
    "token_inputs",
]

import contextlib
import io
import logging
import math
import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import torch
from PIL import Image, ImageDraw, ImageFilter
from torch import nn

from zonnx.ir.io import save_model

logger = logging.getLogger(__name__)

#: Every zoo model is exported at this opset with the legacy (TorchScript) exporter.
OPSET = 13
IMAGE_SIZE = 224
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
VOCAB_SIZE = 1000
SEQ_LEN = 32
_SEED = 0


@contextlib.contextmanager
def torch_threads(n: int | None = None) -> Iterator[None]:
    """Run the block with ``n`` torch threads (default: the CPU count, at most 4), then restore the old count."""
    old = torch.get_num_threads()
    torch.set_num_threads(n or min(4, os.cpu_count() or 1))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def export_legacy(
    module: nn.Module,
    args: tuple[torch.Tensor, ...],
    path: Path | None,
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: Mapping[str, Mapping[int, str]],
    metadata: Mapping[str, str] | None = None,
) -> onnx.ModelProto:
    """Export ``module`` in eval mode with the legacy exporter (opset 13, no constant folding, so BatchNorm
    stays a node), put ``metadata`` in its metadata_props and write it atomically to ``path`` (if given)."""
    module.eval()
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="You are using the legacy TorchScript", category=DeprecationWarning
        )
        torch.onnx.export(
            module,
            args,
            buf,
            dynamo=False,
            opset_version=OPSET,
            do_constant_folding=False,
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_axes={k: dict(v) for k, v in dynamic_axes.items()},
        )
    proto = onnx.load_from_string(buf.getvalue())
    proto.producer_name = "zonnx.zoo"
    for key, value in (metadata or {}).items():
        proto.metadata_props.add(key=key, value=str(value))
    if path is not None:
        save_model(proto, path)
    return proto


# ---------------------------------------------------------------- ResNet-18


class BasicBlock(nn.Module):
    """Two 3x3 Conv+BN with a residual Add; a 1x1 Conv+BN projects the shortcut when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + self.down(x))


class ResNet18(nn.Module):
    """ResNet-18 layout: 7x7/2 stem, max pool, BasicBlocks [2, 2, 2, 2] at 64..512 channels, GAP, FC."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks: list[nn.Module] = []
        cin = 64
        for i, cout in enumerate([64, 128, 256, 512]):
            stride = 1 if i == 0 else 2
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.layers(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


# ---------------------------------------------------------------- MobileNetV2


def _divisible(v: float, divisor: int = 8) -> int:
    """Round channels to a multiple of ``divisor`` without going below 90% of ``v`` (MobileNet's rule)."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def _conv_bn_relu6(cin: int, cout: int, k: int, stride: int, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    """1x1 expand (ReLU6), 3x3 depthwise (ReLU6), 1x1 linear project; residual Add when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn_relu6(cin, hidden, 1, 1))
        layers += [
            _conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, 1, 0, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNetV2(nn.Module):
    """MobileNetV2 layout (t, c, n, s table of the paper) scaled by ``width``; 1280-channel head, FC."""

    SETTINGS = [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ]

    def __init__(self, width: float = 1.0, num_classes: int = 1000) -> None:
        super().__init__()
        cin = _divisible(32 * width)
        last = _divisible(1280 * max(1.0, width))
        layers: list[nn.Module] = [_conv_bn_relu6(3, cin, 3, 2)]
        for t, c, n, s in self.SETTINGS:
            cout = _divisible(c * width)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        layers.append(_conv_bn_relu6(cin, last, 1, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(last, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


# ---------------------------------------------------------------- transformer encoder


class SelfAttention(nn.Module):
    """Multi-head self-attention written out: Q/K/V MatMul, scaled Q.K^T, Softmax, MatMul with V, output proj."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, d_model // heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        n, s, _ = x.shape
        return x.reshape(n, s, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, s, d = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.out(ctx.transpose(1, 2).reshape(n, s, d))


class EncoderLayer(nn.Module):
    """Post-norm encoder layer: LayerNorm(x + attention(x)), then LayerNorm(x + Linear(GELU(Linear(x))))."""

    def __init__(self, d_model: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.attn = SelfAttention(d_model, heads)
        self.norm1 = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, ffn), nn.GELU(), nn.Linear(ffn, d_model))
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.ffn(x))


class TinyEncoder(nn.Module):
    """Token + learned position embedding, ``layers`` encoder layers, mean pooling, linear classifier."""

    def __init__(
        self,
        vocab: int = VOCAB_SIZE,
        d_model: int = 96,
        heads: int = 4,
        layers: int = 2,
        max_len: int = 128,
        num_classes: int = 10,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(1, max_len, d_model) * 0.1)
        self.layers = nn.ModuleList(EncoderLayer(d_model, heads, 4 * d_model) for _ in range(layers))
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) + self.pos[:, : input_ids.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


# ---------------------------------------------------------------- deterministic weights


def _randomize_norms(module: nn.Module, gen: torch.Generator) -> None:
    """Give every BatchNorm/LayerNorm a non-trivial affine (gamma in [0.5, 1.5], beta ~ N(0, 0.1))."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d | nn.LayerNorm):
            with torch.no_grad():
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)


def _calibrate_bn(module: nn.Module, images: np.ndarray) -> None:
    """Set BatchNorm running mean/var to the batch statistics the model sees on ``images``.

    The stats are data-driven (so activations keep a sane scale through 20+ layers, as in a trained net)
    but far from the trivial mean 0 / var 1, so folding BN into Conv changes the weights for real.
    """
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the calibration batches
    module.train()
    with torch.no_grad():
        for batch in np.array_split(images, max(1, len(images) // 4)):
            module(torch.from_numpy(batch))
    module.eval()


def _seeded_cnn(factory: type[nn.Module], seed: int, **kwargs: float) -> nn.Module:
    torch.manual_seed(seed)
    model = factory(**kwargs)
    gen = torch.Generator().manual_seed(seed + 1)
    _randomize_norms(model, gen)
    _calibrate_bn(model, smooth_images(8, seed=seed + 2))
    return model


def resnet18_module(seed: int = _SEED) -> nn.Module:
    """The ResNet-18-style torch module with deterministic weights and data-driven BN statistics."""
    with torch_threads():
        return _seeded_cnn(ResNet18, seed)


def mobilenetv2_module(seed: int = _SEED, width: float = 1.0) -> nn.Module:
    """The MobileNetV2-style torch module (``width`` multiplier) with deterministic weights and BN stats."""
    with torch_threads():
        return _seeded_cnn(MobileNetV2, seed, width=width)


def transformer_module(seed: int = _SEED) -> nn.Module:
    """The small transformer encoder (d_model 96, 4 heads, 2 layers) with deterministic weights."""
    torch.manual_seed(seed)
    model = TinyEncoder()
    _randomize_norms(model, torch.Generator().manual_seed(seed + 1))
    return model.eval()


# ---------------------------------------------------------------- builders


def _build_cnn(name: str, module: nn.Module, path: Path) -> None:
    start = time.perf_counter()
    x = torch.from_numpy(smooth_images(1, seed=123))
    with torch_threads():
        export_legacy(
            module,
            (x,),
            path,
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}},
            metadata={"zonnx.zoo": name, "zonnx.seed": str(_SEED)},
        )
    logger.info("built %s in %.1f s", path, time.perf_counter() - start)


def build_resnet18(path: Path) -> None:
    """Export the ResNet-18-style CNN to ``path``: input ``input`` [N, 3, 224, 224], output ``logits`` [N, 1000]."""
    _build_cnn("resnet18-random", resnet18_module(), Path(path))


def build_mobilenetv2(path: Path) -> None:
    """Export the MobileNetV2-style CNN to ``path``: input ``input`` [N, 3, 224, 224], output ``logits``."""
    _build_cnn("mobilenetv2-random", mobilenetv2_module(), Path(path))


def build_transformer(path: Path) -> None:
    """Export the encoder to ``path``: input ``input_ids`` int64 [N, S], output ``logits`` [N, 10]."""
    start = time.perf_counter()
    ids = torch.from_numpy(token_inputs(1, seed=123)[0]["input_ids"])
    with torch_threads():
        export_legacy(
            transformer_module(),
            (ids,),
            Path(path),
            input_names=["input_ids"],
            output_names=["logits"],
            dynamic_axes={"input_ids": {0: "N", 1: "S"}, "logits": {0: "N"}},
            metadata={"zonnx.zoo": "transformer-random", "zonnx.seed": str(_SEED)},
        )
    logger.info("built %s in %.1f s", path, time.perf_counter() - start)


# ---------------------------------------------------------------- inputs


def _smooth_image(rng: np.random.Generator, size: int) -> Image.Image:
    """One natural-looking RGB image: 1/f multi-scale colour noise plus a few blurred shapes."""
    acc = np.zeros((size, size, 3), dtype=np.float32)
    for cells, weight in [(2, 1.0), (4, 0.6), (8, 0.35), (16, 0.2), (32, 0.1)]:
        small = (rng.random((cells, cells, 3)) * 255).astype(np.uint8)
        big = Image.fromarray(small, "RGB").resize((size, size), Image.Resampling.BICUBIC)
        acc += weight * np.asarray(big, dtype=np.float32)
    acc /= 2.25
    img = Image.fromarray(np.clip(acc, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 6))):
        x0, y0 = rng.integers(0, size, 2)
        w, h = rng.integers(size // 10, size // 2, 2)
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        box = [int(x0), int(y0), int(x0 + w), int(y0 + h)]
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=color)
    return img.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.5, 2.0))))


def smooth_images(n: int, seed: int = 0, size: int = IMAGE_SIZE) -> np.ndarray:
    """``n`` natural-like images as float32 [n, 3, size, size], normalized with ImageNet mean/std."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, 3, size, size), dtype=np.float32)
    for i in range(n):
        rgb = np.asarray(_smooth_image(rng, size), dtype=np.float32) / 255.0
        out[i] = ((rgb - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)
    return out


def image_inputs(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n`` feeds ``{"input": 1x3x224x224}`` of smooth natural-like images (ImageNet-normalized)."""
    images = smooth_images(n, seed)
    return [{"input": images[i : i + 1]} for i in range(n)]


def token_inputs(n: int, seed: int = 0, seq_len: int = SEQ_LEN) -> list[dict[str, np.ndarray]]:
    """``n`` feeds ``{"input_ids": 1 x seq_len int64}`` with Zipf-distributed token ids (like real text)."""
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(n):
        ids = np.minimum(rng.zipf(1.3, seq_len), VOCAB_SIZE) - 1
        feeds.append({"input_ids": ids.astype(np.int64).reshape(1, seq_len)})
    return feeds
