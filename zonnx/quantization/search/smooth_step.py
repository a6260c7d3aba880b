"""The budget search's step on an all-int8 configuration: try SmoothQuant.

Rule: when the configuration does not smooth already, quantize once more as the search's baseline was
but with ``SmoothQuant`` on (its alpha, 0.5 unless given; statistics calibrated on the smoothed model and
saved beside the search's own), score both configurations (``config_trial.try_config``) and keep
SmoothQuant when it scores at least as well on the metric. Kept, the smoothed model is the search's
baseline: its per-layer report and measured sensitivities order the layers the search raises, and the
config file says ``SmoothQuant = true``. A model with nothing to smooth (no MatMul, Gemm or 1x1 Conv
reading an activation) is not tried, nor a pre-quantized model that keeps its own grids.

Why a trial and not a recipe: SmoothQuant moves per-channel spread from an activation into the weights
that read it. On PP-OCRv4 rec for dpu-b4096 it lifts the two pointwise convolutions HardSwish keeps out
of CLE's reach (0.9833 -> 0.9902 char accuracy on the NPU), while on MobileNetV2 and a small CNN for the
same target it costs 0.8-2 dB of output SQNR. Only the metric on the user's data can tell which holds
for a model, and every layer stays int8 either way, so the step costs no NPU time.
"""

from __future__ import annotations

__all__ = ["takes_smooth_trial", "try_smooth_quant"]

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zonnx.quantization.search.config_trial import ConfigTrial, log_trial, recalibrate, try_recalibrated
from zonnx.quantization.search.scorer import Candidate

logger = logging.getLogger(__name__)


def takes_smooth_trial(config: Any, prequantized: str | None) -> bool:
    """True when ``config`` does not smooth already and the model is float, or a pre-quantized model (of
    form ``prequantized``) the configuration re-quantizes from scratch (``PrequantRequantize``): one that
    keeps its own grids takes no rescaling of its channels (``prequant.keep_imported_grids``)."""
    if config.extra.smooth_quant:
        return False
    if prequantized is not None and not config.extra.prequant_requantize:
        logger.info(
            "accuracy search: SmoothQuant not tried (a pre-quantized %s model keeps its grids)", prequantized
        )
        return False
    return True


def _smoothed(config: Any) -> Any:
    return dataclasses.replace(config, extra=dataclasses.replace(config.extra, smooth_quant=True))


def try_smooth_quant(
    scorer: Any,
    metric: str,
    model_input: str | Path,
    calib: Sequence[dict[str, np.ndarray]],
    baseline_config: Any,
    stats_path: Path,
    plain: Candidate | None = None,
    calibration_executor: Any = None,
    prequantized: str | None = None,
) -> tuple[ConfigTrial, Any] | None:
    """Quantize as the search's baseline was (``baseline_config``, with its report) but with SmoothQuant,
    saving the smoothed model's statistics in ``stats_path``, and A/B it against ``scorer.base`` (or
    ``plain``, its scored candidate); the kept one stays the scorer's base. Returns the trial and the
    smoothed baseline's ``QuantizeResult`` (the search's new baseline when kept), or None when the step
    does not apply (module docstring). ``prequantized``: the input's pre-quantized form (the baseline's
    ``QuantizeResult.prequant.form``), None for a float model."""
    if not takes_smooth_trial(scorer.base, prequantized):
        return None
    result = recalibrate(model_input, calib, baseline_config, _smoothed, stats_path, calibration_executor)
    record = (result.recovery or {}).get("smooth_quant") or {}
    if not record.get("smoothed"):
        logger.info("accuracy search: SmoothQuant not tried (it smoothed no activation of this model)")
        return None
    trial = try_recalibrated(scorer, _smoothed, stats_path, plain)
    alpha = baseline_config.extra.smooth_quant_alpha
    log_trial(f"SmoothQuant (alpha {alpha:.2f}, {record['smoothed']} activations)", trial, metric)
    return trial, result
