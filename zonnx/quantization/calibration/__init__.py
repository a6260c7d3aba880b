"""Streaming calibration: readers, the one-session collector, per-tensor statistics and range methods.

Typical use: ``stats = collect(model, tensor_names, reader, methods_needed={"percentile"})``, then
``compute_range(stats[name], "percentile", qmin=-128, qmax=127)`` per tensor; ``save_stats`` keeps the
statistics so other settings can be tried without calibrating again.
"""

from zonnx.quantization.calibration.collector import DEFAULT_HIST_SAMPLE, collect
from zonnx.quantization.calibration.methods import METHODS, compute_range, method_name, requirements
from zonnx.quantization.calibration.readers import (
    CalibrationDataReader,
    CalibrationError,
    ListReader,
    NpzReader,
    validated,
)
from zonnx.quantization.calibration.stats import DEFAULT_BINS, GridHistogram, TensorStats
from zonnx.quantization.calibration.stats_file import (
    load_stats,
    read_calibration_table,
    save_stats,
    write_calibration_table,
)

__all__ = [
    "DEFAULT_BINS",
    "DEFAULT_HIST_SAMPLE",
    "METHODS",
    "CalibrationDataReader",
    "CalibrationError",
    "GridHistogram",
    "ListReader",
    "NpzReader",
    "TensorStats",
    "collect",
    "compute_range",
    "load_stats",
    "method_name",
    "read_calibration_table",
    "requirements",
    "save_stats",
    "validated",
    "write_calibration_table",
]
