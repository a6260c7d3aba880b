"""Text lines and pages rendered with DejaVu fonts, preprocessed as rapidocr does, for the PP-OCR zoo models."""

from __future__ import annotations

__all__ = [
    "REC_HEIGHT",
    "REC_MIN_WIDTH",
    "CLS_SHAPE",
    "DET_SHAPE",
    "font_dirs",
    "find_fonts",
    "font_paths",
    "rec_characters",
    "random_text",
    "render_line",
    "rec_preprocess",
    "rec_samples",
    "rec_inputs",
    "det_samples",
    "det_inputs",
    "cls_samples",
    "cls_inputs",
    "ctc_greedy_decode",
    "char_accuracy",
    "edit_distance",
]

import functools
import importlib.util
import logging
import math
import os
from pathlib import Path

import numpy as np
import onnx
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from zonnx.errors import ZonnxError
from zonnx.zoo.ppocr import ppocr_path

logger = logging.getLogger(__name__)

#: rapidocr's PP-OCRv4 rec shape [3, 48, 320]: height 48; narrower lines are zero-padded to width 320.
REC_HEIGHT = 48
REC_MIN_WIDTH = 320
#: rapidocr's cls_image_shape.
CLS_SHAPE = (3, 48, 192)
#: Default det page (H, W); both multiples of 32 as the DB detector needs.
DET_SHAPE = (160, 320)
#: rapidocr 1.4.4's det normalization (config.yaml Det.mean/std); PaddleOCR's own uses ImageNet values.
DET_MEAN = np.array([0.5, 0.5, 0.5], dtype=np.float32)
DET_STD = np.array([0.5, 0.5, 0.5], dtype=np.float32)

_FONT_NAMES = [
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansCondensed.ttf",
    "DejaVuSerif-Bold.ttf",
]

_WORD_TEXT = """
the of and to in is for on with as by at from total price date time name number order invoice
account amount balance page item quantity address street city phone email open close north south
market station coffee bread water green blue red black white report table model input output layer
value error result sample image text line print paper office school river garden window summer
winter monday friday january march april october december hello world quick brown fox jumps over
lazy dog
"""
_WORDS = _WORD_TEXT.split()
#: Non-ASCII characters used. Left out: "×" and "°C" (read as "x" and "℃", the same glyphs) and accented
#: letters (the model mostly drops the accent).
_SYMBOLS = "±"
#: Letters for codes such as "AB-1234": no I or O, which DejaVu draws like 1 and 0 (as on licence plates).
_CODE_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"


def font_dirs() -> list[Path]:
    """Where DejaVu fonts are looked for: $ZONNX_FONT_DIR, the usual system folders, matplotlib's copy."""
    dirs = [Path(os.environ["ZONNX_FONT_DIR"])] if os.environ.get("ZONNX_FONT_DIR") else []
    dirs += [Path(d) for d in ("/usr/share/fonts", "/usr/local/share/fonts", "/usr/X11R6/lib/X11/fonts")]
    dirs.append(Path.home() / ".fonts")
    spec = importlib.util.find_spec("matplotlib")
    if spec is not None and spec.submodule_search_locations:
        dirs.append(Path(next(iter(spec.submodule_search_locations))) / "mpl-data" / "fonts" / "ttf")
    return dirs


def find_fonts(dirs: list[Path]) -> tuple[Path, ...]:
    """The DejaVu faces used for rendering found under ``dirs`` (first match of each name wins)."""
    found: dict[str, Path] = {}
    for d in dirs:
        if d.is_dir():
            for p in sorted(d.rglob("DejaVu*.ttf")):
                found.setdefault(p.name, p)
    paths = tuple(found[n] for n in _FONT_NAMES if n in found)
    if not paths:
        looked = ", ".join(str(d) for d in dirs)
        raise ZonnxError(
            f"no DejaVu TTF font found (looked in {looked}); install them with "
            "'apt-get install fonts-dejavu-core' or set ZONNX_FONT_DIR to a folder holding DejaVuSans.ttf."
        )
    return paths


@functools.cache
def font_paths() -> tuple[Path, ...]:
    """The DejaVu fonts of this machine (see font_dirs); a ZonnxError says how to install them if none."""
    return find_fonts(font_dirs())


@functools.cache
def rec_characters() -> tuple[str, ...]:
    """The PP-OCRv4 rec character list from its metadata, as rapidocr's CTC decoder indexes it.

    Index 0 is the CTC blank, 1..6623 the metadata's ``character`` lines, and a space is appended last.
    """
    model = onnx.load(str(ppocr_path("ppocr_rec")), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    if "character" not in meta:
        raise ZonnxError(
            f"{ppocr_path('ppocr_rec')}: has no 'character' metadata; reinstall rapidocr-onnxruntime."
        )
    return ("blank", *meta["character"].splitlines(), " ")


def _renderable() -> set[str]:
    """Characters the rec model knows that DejaVu can draw: ASCII and a few symbols (DejaVu has no CJK)."""
    chars = set(rec_characters()[1:])
    return {c for c in chars if 32 <= ord(c) < 127 or c in _SYMBOLS}


def random_text(rng: np.random.Generator, max_len: int = 32) -> str:
    """A plausible text line: words, numbers, dates, prices, codes (characters the rec model knows)."""
    kind = rng.integers(0, 4)
    if kind == 0:
        words = [str(rng.choice(_WORDS)) for _ in range(int(rng.integers(1, 6)))]
        case = rng.integers(0, 3)
        text = " ".join(w.title() if case == 1 else w.upper() if case == 2 else w for w in words)
    elif kind == 1:
        d = rng.integers(0, 10, 12)
        forms = [
            f"{2000 + d[0] * 3 + d[1]}-{1 + d[2]:02d}-{10 + d[3] * 2:02d}",
            f"${d[4]}{d[5]}.{d[6]}{d[7]}",
            f"{d[0]}{d[1]}:{d[2] % 6}{d[3]}",
            f"+49 {d[4]}{d[5]} {''.join(map(str, d[6:12]))}",
            f"{d[8]}{d[9]}.{d[10]}%",
            f"{d[1]}{d[2]} km",
            f"{d[3]}{d[4]}x{d[5]}{d[6]} cm",
            f"{d[7]}.{d[8]}±0.{d[9]}",
        ]
        text = " ".join(str(rng.choice(forms)) for _ in range(int(rng.integers(1, 4))))
    elif kind == 2:
        letters = "".join(rng.choice(list(_CODE_LETTERS), int(rng.integers(2, 4))))
        label = str(rng.choice(["Invoice No.", "Order", "Total:", "Ref", "Room", "ID:"]))
        text = f"{label} {letters}-{int(rng.integers(100, 99999))}"
    else:
        text = f"{str(rng.choice(_WORDS)).title()} {int(rng.integers(1, 999))} {rng.choice(_WORDS)}"
    known = _renderable()
    return "".join(c for c in text if c in known)[:max_len].strip() or "0"


def render_line(
    text: str, rng: np.random.Generator, *, size: int | None = None, font: Path | None = None
) -> Image.Image:
    """Draw ``text`` dark on a light background, cropped with a small margin like a detector's box."""
    font_file = font or font_paths()[int(rng.integers(0, len(font_paths())))]
    size = size or int(rng.integers(22, 35))
    face = ImageFont.truetype(str(font_file), size)
    ascent, descent = face.getmetrics()
    left, _, right, _ = face.getbbox(text)
    pad_x, pad_y = int(rng.integers(2, 11)), int(rng.integers(2, 7))
    bg = tuple(int(v) for v in rng.integers(200, 256, 3))
    fg = tuple(int(v) for v in rng.integers(0, 80, 3))
    img = Image.new("RGB", (right - left + 2 * pad_x, ascent + descent + 2 * pad_y), bg)
    ImageDraw.Draw(img).text((pad_x - left, pad_y), text, font=face, fill=fg)
    if rng.random() < 0.5:
        img = img.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.2, 0.8))))
    arr = np.asarray(img, dtype=np.float32) + rng.normal(0, rng.uniform(0, 6), (img.height, img.width, 3))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")


def _resize_pad(img: Image.Image, height: int, width: int) -> np.ndarray:
    """rapidocr's rec/cls rule: resize to ``height`` keeping the aspect (at most ``width``), BGR, CHW,
    (x/255 - 0.5)/0.5, zero-padded on the right to ``width``."""
    resized_w = min(width, math.ceil(height * img.width / img.height))
    bgr = np.asarray(img.resize((resized_w, height), Image.Resampling.BILINEAR), dtype=np.float32)[:, :, ::-1]
    out = np.zeros((3, height, width), dtype=np.float32)
    out[:, :, :resized_w] = (bgr.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    return out


def rec_preprocess(img: Image.Image, width: int | None = None) -> np.ndarray:
    """One line image to the rec input [1, 3, 48, W] as rapidocr does for a batch of one.

    W = int(48 * max(320/48, w/h)): 320 for short lines, the line's own width at height 48 for long ones.
    A fixed ``width`` (a model exported or built with a static input shape) is W for every line: a
    shorter line is zero-padded on the right, a longer one squeezed to it (PaddleOCR's fixed-shape rule).
    """
    if width is not None:
        return _resize_pad(img, REC_HEIGHT, width)[None]
    ratio = max(REC_MIN_WIDTH / REC_HEIGHT, img.width / img.height)
    return _resize_pad(img, REC_HEIGHT, int(REC_HEIGHT * ratio))[None]


def rec_samples(n: int, seed: int = 0, width: int | None = None) -> list[tuple[str, dict[str, np.ndarray]]]:
    """``n`` (text, feed) pairs: the rendered text and its rec feed ``{"x": 1x3x48xW}`` (W varies unless
    ``width`` fixes it, see rec_preprocess)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        text = random_text(rng)
        out.append((text, {"x": rec_preprocess(render_line(text, rng), width)}))
    return out


def rec_inputs(n: int, seed: int = 0, width: int | None = None) -> list[dict[str, np.ndarray]]:
    """``n`` rec feeds ``{"x": 1x3x48xW float32}`` of rendered text lines (see rec_samples)."""
    return [feed for _, feed in rec_samples(n, seed, width)]


def det_samples(
    n: int, seed: int = 0, shape: tuple[int, int] = DET_SHAPE
) -> list[tuple[list[tuple[int, int, int, int]], dict[str, np.ndarray]]]:
    """``n`` (boxes, feed) pairs: pages of ``shape`` (H, W multiples of 32) with 1-5 text lines.

    ``boxes`` holds each line's text box (x0, y0, x1, y1); the feed ``{"x": 1x3xHxW}`` is the BGR page
    normalized with rapidocr's det mean/std.
    """
    h, w = shape
    if h % 32 or w % 32:
        raise ZonnxError(f"det page shape {shape}: height and width must both be multiples of 32.")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        page = Image.new("RGB", (w, h), tuple(int(v) for v in rng.integers(210, 256, 3)))
        draw = ImageDraw.Draw(page)
        boxes: list[tuple[int, int, int, int]] = []
        y = int(rng.integers(4, 16))
        for _ in range(int(rng.integers(1, 6))):
            face = ImageFont.truetype(
                str(font_paths()[int(rng.integers(0, len(font_paths())))]), int(rng.integers(14, 24))
            )
            text = random_text(rng, max_len=24)
            while text and face.getlength(text) > w - 12:
                text = text[:-1]
            x0, y0, x1, y1 = (int(v) for v in face.getbbox(text))
            if y + y1 > h - 4 or not text:
                break
            x = int(rng.integers(4, w - 4 - x1 + 1))
            draw.text((x, y), text, font=face, fill=tuple(int(v) for v in rng.integers(0, 80, 3)))
            boxes.append((x + x0, y + y0, x + x1, y + y1))
            y += y1 + int(rng.integers(6, 20))
        rgb = np.asarray(page, dtype=np.float32) + rng.normal(0, rng.uniform(0, 5), (h, w, 3))
        bgr = (np.clip(rgb, 0, 255)[:, :, ::-1] / 255.0 - DET_MEAN) / DET_STD
        out.append((boxes, {"x": np.ascontiguousarray(bgr.transpose(2, 0, 1)[None], dtype=np.float32)}))
    return out


def det_inputs(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n`` det feeds ``{"x": 1x3x160x320}`` of rendered pages (see det_samples)."""
    return [feed for _, feed in det_samples(n, seed)]


def cls_samples(n: int, seed: int = 0) -> list[tuple[int, dict[str, np.ndarray]]]:
    """``n`` (label, feed) pairs: label 0 upright or 1 rotated 180 degrees (every third line), feed
    ``{"x": 1x3x48x192}`` preprocessed as rapidocr's direction classifier."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        img = render_line(random_text(rng, max_len=16), rng)
        label = int(i % 3 == 2)
        if label:
            img = img.rotate(180)
        out.append((label, {"x": _resize_pad(img, CLS_SHAPE[1], CLS_SHAPE[2])[None]}))
    return out


def cls_inputs(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n`` cls feeds ``{"x": 1x3x48x192}`` of rendered lines, some upside down (see cls_samples)."""
    return [feed for _, feed in cls_samples(n, seed)]


def ctc_greedy_decode(probs: np.ndarray, characters: tuple[str, ...] | None = None) -> list[str]:
    """rapidocr's CTC decode of rec output [N, T, C]: argmax per step, merge repeats, drop blank (index 0)."""
    chars = characters or rec_characters()
    texts = []
    for idx in probs.argmax(axis=2):
        keep = np.ones(len(idx), dtype=bool)
        keep[1:] = idx[1:] != idx[:-1]
        keep &= idx != 0
        texts.append("".join(chars[i] for i in idx[keep]))
    return texts


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest single-character insertions, deletions and substitutions."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def char_accuracy(predicted: list[str], truth: list[str]) -> float:
    """1 - (total edit distance / total reference characters), floored at 0: the OCR char accuracy.

    Leading and trailing spaces of both are ignored (the crop's margins are often read as spaces).
    """
    errors = sum(edit_distance(p.strip(), t.strip()) for p, t in zip(predicted, truth, strict=True))
    total = sum(len(t.strip()) for t in truth)
    return max(0.0, 1.0 - errors / total) if total else 1.0
