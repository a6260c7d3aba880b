"""ORT's ``calibration_cache_path``: per-tensor ranges in ONNX Runtime's JSON cache format.

Rules (the same as ORT 1.31's call):

- the file exists and was written with the same SmoothQuant setting: its ranges are used and the
  calibration data reader is not read; a cache made with another calibration method is an error;
- the file exists but was written with another SmoothQuant setting: a warning, the ranges are
  recomputed and the file is overwritten;
- the file does not exist: calibrate, then write it.

The file is read and written with onnxruntime's own ``save_tensors_data``/``load_tensors_data``, so ORT
and zonnx share caches. A file that is a zonnx statistics file (``SaveStats``) is read as before.
Only ORT's calibration methods can be stored (the cache records the method by ORT's enum).
"""

from __future__ import annotations

__all__ = ["CalibrationCache"]

import dataclasses
import json
import logging
import os
from enum import Enum
from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationMethod

from zonnx.errors import OptionError

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class CalibrationCache:
    """One ``calibration_cache_path`` for one call: ``load`` before calibration, ``save`` after."""

    path: Path
    method: Enum
    smooth_quant: bool

    @classmethod
    def open(cls, path: str | os.PathLike[str], method: Enum, smooth_quant: bool) -> CalibrationCache:
        p = Path(path)
        if p.exists() and not p.is_file():
            raise OptionError(f"calibration_cache_path {p}: is not a file.")
        if not isinstance(method, CalibrationMethod):
            raise OptionError(
                f"calibration_cache_path: ORT's cache records ORT's calibration methods only (got {method}); "
                "use extra_options SaveStats/LoadStats for zonnx's methods."
            )
        return cls(p, method, smooth_quant)

    def is_zonnx_stats(self) -> bool:
        """True when the file exists and is not JSON (a zonnx SaveStats file)."""
        if not self.path.is_file():
            return False
        with self.path.open("rb") as f:
            return f.read(1) not in (b"{", b"[", b" ", b"\n")

    def load(self) -> dict[str, tuple[float, float]] | None:
        """The cached ranges, or None when calibration must run (no file, or a SmoothQuant mismatch)."""
        if not self.path.is_file():
            return None
        with self.path.open("r", encoding="utf-8") as f:
            raw = json.load(f)
        cached_sq = bool(raw.get("smooth_quant", False))
        if cached_sq != self.smooth_quant:
            logging.getLogger().warning(  # the root logger, where ORT reports it
                "Calibration cache at %s was produced with smooth_quant=%s; this call uses smooth_quant=%s: "
                "recomputing the ranges and overwriting the cache.",
                self.path,
                cached_sq,
                self.smooth_quant,
            )
            return None
        from onnxruntime.quantization.calibrate import load_tensors_data

        data = load_tensors_data(self.path)
        if data.calibration_method != self.method:
            raise OptionError(
                f"calibration_cache_path {self.path}: made with {data.calibration_method}, but this call uses "
                f"calibrate_method={self.method}; delete the cache or pass the same method."
            )
        return {
            name: (float(np.asarray(td.range_value[0]).min()), float(np.asarray(td.range_value[1]).max()))
            for name, td in data.items()
        }

    def save(self, ranges: dict[str, tuple[float, float]]) -> None:
        """Write the ranges (ORT's format, with the SmoothQuant flag)."""
        from onnxruntime.quantization.calibrate import TensorData, TensorsData, save_tensors_data

        data = TensorsData(
            self.method,
            {
                name: TensorData(
                    lowest=np.array(lo, dtype=np.float32), highest=np.array(hi, dtype=np.float32)
                )
                for name, (lo, hi) in ranges.items()
            },
        )
        save_tensors_data(data, self.path, smooth_quant=self.smooth_quant)
        logger.info("calibration cache written to %s (%d tensors)", self.path, len(ranges))
