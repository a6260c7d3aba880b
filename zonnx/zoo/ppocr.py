"""The PP-OCR ONNX files shipped inside the rapidocr-onnxruntime wheel (no network needed)."""

from __future__ import annotations

__all__ = ["PPOCR_FILES", "ppocr_path"]

import importlib.util
from pathlib import Path

from zonnx.errors import ModelLoadError

PPOCR_FILES = {
    "ppocr_det": "ch_PP-OCRv4_det_infer.onnx",
    "ppocr_rec": "ch_PP-OCRv4_rec_infer.onnx",
    "ppocr_cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx",
}


def ppocr_path(name: str) -> Path:
    """Return the path of a PP-OCR model inside the installed rapidocr_onnxruntime package."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"zoo model {name!r} comes from the rapidocr-onnxruntime wheel, which is not installed; "
            "run: pip install --no-deps rapidocr-onnxruntime==1.4.4"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / PPOCR_FILES[name]
    if not path.is_file():
        raise ModelLoadError(f"zoo model {name!r}: {path} is missing from the installed wheel; reinstall it.")
    return path
