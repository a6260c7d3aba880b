"""The budget search's step on an all-int8 configuration: try bias correction.

Rule: with the search's scorer, score the configuration as it is and with ``BiasCorrection`` on
(``config_trial.try_config``); keep bias correction when its score is at least the plain one. Either
way every layer stays int8, so this costs no NPU time, and a kept correction shifts the whole search's
starting point. A configuration bias correction cannot run on (``check_recovery_options``: QOperator,
bfloat16) is not tried.
"""

from __future__ import annotations

__all__ = ["try_bias_correction"]

import dataclasses
import logging
from typing import Any

from zonnx.errors import OptionError
from zonnx.quantization.recovery.steps import check_recovery_options
from zonnx.quantization.search.config_trial import ConfigTrial, log_trial, try_config
from zonnx.quantization.search.scorer import Candidate

logger = logging.getLogger(__name__)


def try_bias_correction(scorer: Any, metric: str, plain: Candidate | None = None) -> ConfigTrial | None:
    """Score ``scorer.base`` (or take ``plain``, its scored candidate) against it with bias correction
    (module docstring); the kept one stays the scorer's base. None when the configuration cannot take
    bias correction (QOperator, bfloat16: the reason is logged)."""
    base = scorer.base
    corrected = dataclasses.replace(base, extra=dataclasses.replace(base.extra, bias_correction=True))
    try:
        check_recovery_options(corrected, has_reader=True)
    except OptionError as e:
        logger.info("accuracy search: bias correction not tried (%s)", e)
        return None
    trial = try_config(scorer, corrected, plain)
    log_trial("bias correction", trial, metric)
    return trial
