"""The budget search's first step on an all-int8 configuration: try MSE thresholds instead of min/max.

Rule: when activations are calibrated by plain min/max (ORT's default, and zhouyi-x2's asymmetric
recipe), quantize once more as the baseline was but with MSE thresholds (statistics with histograms,
saved beside the search's own), score both configurations (``config_trial.try_config``) and keep MSE
when it scores at least as well on the metric. Kept, the MSE model is the search's baseline: its
per-layer report and measured sensitivities order the layers the search raises. Why: one outlier sample sets a min/max range for the whole
tensor. On PP-OCRv4 rec for zhouyi-x2 min/max read 0.83 char accuracy on one set of lines and MSE 0.996,
while on a transformer with real outlier channels min/max keeps what MSE clips; only the task metric
can tell which holds for a model. Every layer stays int8 either way, so the step costs no NPU time.
Other methods (MSE already, percentile, entropy, power-of-two) are the user's or the target's choice
and are not second-guessed.
"""

from __future__ import annotations

__all__ = ["takes_mse_trial", "try_mse_thresholds"]

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zonnx.quantization.calibration.methods import method_name
from zonnx.quantization.enums import ZonnxCalibrationMethod
from zonnx.quantization.search.config_trial import ConfigTrial, log_trial, recalibrate, try_recalibrated
from zonnx.quantization.search.scorer import Candidate

logger = logging.getLogger(__name__)


def takes_mse_trial(config: Any) -> bool:
    """True when activations are calibrated by plain min/max on a float-scale grid."""
    return (
        method_name(config.calibrate_method) == "minmax"
        and not config.extra.calib_moving_average
        and not config.power_of_two
    )


def _with_mse(config: Any) -> Any:
    return dataclasses.replace(config, calibrate_method=ZonnxCalibrationMethod.MSE)


def try_mse_thresholds(
    scorer: Any,
    metric: str,
    model_input: str | Path,
    calib: Sequence[dict[str, np.ndarray]],
    baseline_config: Any,
    stats_path: Path,
    plain: Candidate | None = None,
    calibration_executor: Any = None,
) -> tuple[ConfigTrial, Any] | None:
    """Quantize as the search's baseline was (``baseline_config``, with its report) but with MSE
    thresholds, saving their statistics in ``stats_path``, and A/B them against ``scorer.base`` (or
    ``plain``, its scored candidate); the kept one stays the scorer's base. Returns the trial and the MSE
    baseline's ``QuantizeResult`` (the search's new baseline when kept), or None when the configuration
    does not calibrate by plain min/max (module docstring)."""
    if not takes_mse_trial(scorer.base):
        return None
    result = recalibrate(model_input, calib, baseline_config, _with_mse, stats_path, calibration_executor)
    trial = try_recalibrated(scorer, _with_mse, stats_path, plain)
    log_trial("MSE thresholds (min/max -> MSE)", trial, metric)
    return trial, result
