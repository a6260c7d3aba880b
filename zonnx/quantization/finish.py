"""The last step of ``quantize_static``: the reports on the quantized model.

Two reports, each when it applies: a pre-quantized source's import report (what was kept, snapped or
calibrated, checked against the source when data is given; ``prequant.flow.finish_report``) and the
per-layer report (float vs quantized activations on held samples; ``report.layer_report``), followed by
the collapse warning it may raise (``collapse.similarity_warning``). Past the protobuf limit the caller
runs this after the output is written, with the output's weights mapped from its data file
(``zonnx.ir.large.rooted``).
"""

from __future__ import annotations

__all__ = ["run_reports"]

import logging
from collections.abc import Sequence
from typing import Any

import onnx

logger = logging.getLogger(__name__)


def run_reports(
    result: Any,
    imported: Any,
    grid_rows: Any,
    model_input: Any,
    float_model: onnx.ModelProto,
    reader: Any,
    holdout: Any,
    target: Any,
    providers: Sequence[Any] | None,
) -> None:
    """Fill ``result.prequant``, ``result.report`` and ``result.warnings`` (a ``QuantizeResult``) for the
    quantized ``result.model``; ``reader`` keeps calibration samples, ``holdout`` the held-out ones."""
    from zonnx.quantization.prequant import flow as prequant

    cfg, proto = result.config, result.model
    if imported is not None:
        feeds = reader.fill() if reader is not None else []
        result.prequant = prequant.finish_report(imported, grid_rows, model_input, proto, feeds, providers)
    if reader is None or not (reader.kept or holdout.held) or not cfg.extra.report_samples:
        return
    from zonnx.quantization.collapse import similarity_warning
    from zonnx.quantization.report import layer_report

    feeds = (holdout.held or reader.kept)[: cfg.extra.report_samples]
    result.report = layer_report(float_model, proto, feeds, max_samples=len(feeds))
    result.report.data = holdout.describe(len(feeds))
    warning = similarity_warning(
        result.report,
        float_model,
        cfg.extra.warn_below_cosine,
        target=target.name if target is not None else None,
        placement=cfg.extra.quant_placement,
        int16=target is not None and "int16" in target.quant.activation_dtypes,
    )
    if warning:
        logger.warning("%s", warning)
        result.warnings.append(warning)
