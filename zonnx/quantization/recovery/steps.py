"""Where accuracy recovery runs in ``quantize_static``: float-model steps before annotation, bias correction
after the target's refinement. Each step that runs adds its record to the returned dict and logs one line.
"""

from __future__ import annotations

__all__ = [
    "KEPT_SAMPLES",
    "check_fast_finetune",
    "check_fast_finetune_format",
    "check_recovery_formats",
    "check_recovery_options",
    "recover_float",
    "recover_quantized",
]

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx_ir as ir

from zonnx.errors import OptionError
from zonnx.quantization.config import QuantConfig
from zonnx.quantization.enums import QuantFormat

if TYPE_CHECKING:
    from zonnx.backend.targets import Target

logger = logging.getLogger(__name__)

#: Calibration feeds bias correction measures on: all of them up to this many (a uniform sample of the
#: calibration set past it; copies, so memory stays bounded). Was 8, which left per-channel mean errors
#: too noisy to carry to other images (zoo mobilenetv2_digits: held-out logits SQNR fell).
KEPT_SAMPLES = 256


def check_recovery_formats(cfg: QuantConfig) -> None:
    """Refuse, before the model is read, a bias correction or fast finetune its format has no room for.

    These refusals hold whatever the model is, so they come first; what depends on the model (a
    pre-quantized import drops bias correction) and on the data is ``check_recovery_options``.
    """
    if cfg.extra.include_fast_ft:
        check_fast_finetune_format(cfg)
    if not cfg.extra.bias_correction:
        return
    if cfg.quant_format == QuantFormat.QOperator:
        raise OptionError(
            "extra_options BiasCorrection works on QDQ, FixNeuron and VitisQDQ models; "
            "use quant_format QDQ (QOperator is converted from it afterwards by `zonnx optimize`)."
        )
    if cfg.activation_type == "bfloat16":
        raise OptionError("extra_options BiasCorrection: bfloat16 models have no quantized bias; remove it.")


def check_recovery_options(cfg: QuantConfig, has_reader: bool) -> None:
    """Refuse, before calibration, a bias correction or fast finetune that could not run."""
    check_recovery_formats(cfg)
    if cfg.extra.include_fast_ft:
        check_fast_finetune(cfg, has_reader)
    if cfg.extra.bias_correction and not has_reader:
        raise OptionError(
            "extra_options BiasCorrection needs calibration samples: give a calibration_data_reader "
            "(zonnx quantize --calib), also when statistics are loaded."
        )


def check_fast_finetune_format(cfg: QuantConfig) -> None:
    """Fast finetune needs weight quantizers: QOperator models have none."""
    if cfg.quant_format == QuantFormat.QOperator:
        raise OptionError(
            "IncludeFastFT: fast finetune rewrites weights behind DequantizeLinear/FixNeuron nodes and "
            "QOperator models have none; use quant_format QDQ (or a Vitis format)."
        )


def check_fast_finetune(cfg: QuantConfig, has_reader: bool) -> None:
    """Fast finetune needs weight quantizers (not QOperator) and calibration samples to capture."""
    check_fast_finetune_format(cfg)
    if not has_reader:
        raise OptionError(
            "IncludeFastFT needs calibration samples: pass a calibration_data_reader (saved statistics "
            "alone are not enough)."
        )


def recover_float(model: ir.Model, cfg: QuantConfig) -> dict[str, Any]:
    """ReplaceClip6Relu then cross-layer equalization on the prepared float model, as the options ask."""
    from zonnx.quantization.recovery.cle import equalize
    from zonnx.quantization.recovery.relu6 import replace_clip6_relu

    records: dict[str, Any] = {}
    if cfg.extra.replace_clip6_relu:
        records["replace_clip6_relu"] = replace_clip6_relu(model)
    if cfg.extra.include_cle:
        record = equalize(
            model,
            steps=cfg.extra.cle_steps,
            append_bias=cfg.extra.cle_scale_append_bias,
            power_of_two=cfg.power_of_two,
        )
        logger.info("%s", record.summary())
        records["cle"] = record
    return records


def recover_quantized(
    model: ir.Model,
    float_model: onnx.ModelProto,
    feeds: Sequence[Mapping[str, np.ndarray]],
    cfg: QuantConfig,
    target: Target | None,
    providers: Sequence[str] | None,
    judge: tuple[str, Sequence[Sequence[np.ndarray]]] | None = None,
) -> dict[str, Any]:
    """Bias correction of the written (and refined) quantized model, when ``BiasCorrection`` is set
    (``judge``: the outputs its kept-or-undone decision is measured against, default the float model's)."""
    if not cfg.extra.bias_correction:
        return {}
    from zonnx.quantization.recovery.bias_correction import correct_biases

    record = correct_biases(
        model,
        float_model,
        feeds,
        target=target,
        providers=providers or ("CPUExecutionProvider",),
        judge=judge,
    )
    logger.info("%s", record.summary())
    return {"bias_correction": record}
