"""Calibration data from a folder of images, with the preprocessing the deployed model expects.

The rule, per image: load (Pillow), convert to RGB (or L for one channel), resize to (height,
width) with bilinear filtering, to float32, reorder channels (``rgb``/``bgr``), then
``(pixel - mean) * scale`` per channel, then lay out as NCHW or NHWC with a batch axis of 1.
This matches TPU-MLIR's ``--mean``/``--scale``/``--pixel_format`` and Compass's preprocessing.
"""

from __future__ import annotations

__all__ = ["Preprocess", "ImageFolderReader", "IMAGE_SUFFIXES"]

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from zonnx.errors import OptionError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


@dataclasses.dataclass(frozen=True)
class Preprocess:
    """Image preprocessing.

    Attributes:
        size: (height, width) to resize to (required).
        mean: per-channel value subtracted, in the input's channel order (default 0).
        scale: per-channel multiplier applied after the mean (default 1/255).
        pixel_format: "rgb", "bgr" or "gray" (default "rgb").
        layout: "nchw" or "nhwc" (default "nchw").
    """

    size: tuple[int, int]
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    scale: tuple[float, ...] = (1 / 255, 1 / 255, 1 / 255)
    pixel_format: str = "rgb"
    layout: str = "nchw"

    def __post_init__(self) -> None:
        if self.pixel_format not in ("rgb", "bgr", "gray"):
            raise OptionError(f"--pixel-format {self.pixel_format!r}: use rgb, bgr or gray.")
        if self.layout not in ("nchw", "nhwc"):
            raise OptionError(f"--layout {self.layout!r}: use nchw or nhwc.")
        if len(self.size) != 2 or min(self.size) <= 0:
            raise OptionError(f"--size {self.size}: give HEIGHT,WIDTH with positive numbers.")
        channels = 1 if self.pixel_format == "gray" else 3
        for name in ("mean", "scale"):
            if len(getattr(self, name)) not in (1, channels):
                raise OptionError(f"--{name} {getattr(self, name)}: give 1 or {channels} values.")

    def apply(self, path: Path) -> np.ndarray:
        """Load and preprocess one image into a float32 array with a batch axis."""
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as img:
                img = img.convert("L" if self.pixel_format == "gray" else "RGB")
                img = img.resize((self.size[1], self.size[0]), Image.Resampling.BILINEAR)
                arr = np.asarray(img, dtype=np.float32)
        except (UnidentifiedImageError, OSError) as e:
            raise OptionError(
                f"{path}: cannot be read as an image ({e}); remove it from the folder."
            ) from None
        if arr.ndim == 2:
            arr = arr[:, :, None]
        if self.pixel_format == "bgr":
            arr = arr[:, :, ::-1]
        arr = (arr - np.asarray(self.mean, np.float32)) * np.asarray(self.scale, np.float32)
        if self.layout == "nchw":
            arr = arr.transpose(2, 0, 1)
        return np.ascontiguousarray(arr[None], dtype=np.float32)


class ImageFolderReader:
    """A CalibrationDataReader over the images in a folder (sorted by name), optionally the first ``limit``."""

    def __init__(
        self, folder: str | Path, input_name: str, preprocess: Preprocess, limit: int | None = None
    ) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise OptionError(f"{self.folder}: not a folder of images.")
        self.files: Sequence[Path] = sorted(
            p for p in self.folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES
        )
        if limit is not None:
            self.files = self.files[:limit]
        if not self.files:
            raise OptionError(f"{self.folder}: no images ({', '.join(IMAGE_SUFFIXES)}) found.")
        self.input_name = input_name
        self.preprocess = preprocess
        self._iter: Iterator[Path] = iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def get_next(self) -> dict[str, np.ndarray] | None:
        path = next(self._iter, None)
        return None if path is None else {self.input_name: self.preprocess.apply(path)}

    def rewind(self) -> None:
        self._iter = iter(self.files)
