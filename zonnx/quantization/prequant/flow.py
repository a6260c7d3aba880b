"""The steps ``quantize_static`` runs for a pre-quantized input: import, pin ranges, report.

1. ``import_for_quantize``: the model becomes float weights + grids (``importer``); dynamic models need
   calibration data (their activation ranges change per run), refused in one line without it. Dynamic
   imports then fold their float bias Adds into Conv/Gemm (``fold-conv-affine``, ``canonicalize-gemm``).
   ``keep_imported_grids``: CLE and SmoothQuant rescale weights and activations, so the imported grids
   would no longer fit them; they are skipped, and said, unless the model is re-quantized from scratch.
   Bias correction is skipped without calibration samples (nothing to measure it on).
2. ``pin_for_plan``: after annotation, planned activations take the imported ranges (``retarget``); a
   tensor that has none needs calibration data, else one line names it. On a symmetric target that also
   lists unsigned codes (bm1684x), a non-negative range keeps them (zero point 0) rather than a step twice
   as coarse.
3. Bias correction (``bias_correction_judge``): when every grid was kept the retarget is the source and
   there is nothing to correct (skipped, said); when the target's rules snapped or calibrated a grid,
   the correction runs and is kept only if it brings the outputs closer to the source's.
4. ``finish_report``: the per-tensor changes and, with calibration samples, the retargeted model's outputs
   against the source model's.
"""

from __future__ import annotations

__all__ = [
    "refuse_narrow_activations",
    "import_for_quantize",
    "keep_imported_grids",
    "bias_correction_judge",
    "pin_for_plan",
    "finish_report",
    "grid_changes",
]

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import onnx
import onnx_ir as ir

from zonnx.errors import OptionError
from zonnx.quantization.plan import QuantPlan
from zonnx.quantization.prequant.importer import ImportedModel, import_prequantized
from zonnx.quantization.prequant.retarget import (
    GridChange,
    RetargetReport,
    compare_outputs,
    grid_changes,
    keep_unsigned,
    pin_ranges,
    source_outputs,
)
from zonnx.quantization.schemes import qdtype

logger = logging.getLogger(__name__)


def import_for_quantize(model: ir.Model, has_data: bool) -> ImportedModel | None:
    """Import a pre-quantized model in place (None for a float model); dynamic ones need data."""
    from zonnx.quantization.prequant.detect import quantized_form

    form = quantized_form(model)
    if form == "dynamic" and not has_data:
        raise OptionError(
            "this model is dynamically quantized (DynamicQuantizeLinear): it carries no activation ranges; "
            "give calibration data (--calib / a calibration_data_reader) to fix them for the target."
        )
    imported = import_prequantized(model)
    if imported is not None and imported.dynamic:
        from zonnx.passes.catalog import make_pass

        for name in ("shape-inference", "constant-folding", "fold-conv-affine", "canonicalize-gemm"):
            make_pass(name)(model)
        _follow_renamed_weights(model, imported)
    if imported is not None:
        logger.warning(
            "input is a pre-quantized %s model: its grids are imported and re-expressed in this run's scheme "
            "(no second layer of quantizers is added)",
            imported.form,
        )
    return imported


def keep_imported_grids(cfg: Any, imported: ImportedModel | None, has_reader: bool) -> Any:
    """``cfg`` without IncludeCLE and SmoothQuant for a pre-quantized model whose grids are kept (not
    ``PrequantRequantize``): they rescale channels the imported grids were fitted to. Without calibration
    samples BiasCorrection goes too (it is measured against the source on them). Logged when dropped."""
    extra = cfg.extra
    dropped = [
        k
        for k, on in (
            ("IncludeCLE", extra.include_cle),
            ("SmoothQuant", extra.smooth_quant),
            ("BiasCorrection", extra.bias_correction and not has_reader),
        )
        if on
    ]
    if imported is None or extra.prequant_requantize or not dropped:
        return cfg
    logger.warning(
        "%s skipped: the pre-quantized model's own grids are kept%s; pass PrequantRequantize "
        "(--requantize) to quantize from scratch with %s",
        " and ".join(dropped),
        " (and no calibration samples to measure a bias correction on)" if not has_reader else "",
        "them" if len(dropped) > 1 else "it",
    )
    return dataclasses.replace(
        cfg,
        extra=dataclasses.replace(
            extra,
            include_cle=False,
            smooth_quant=False,
            bias_correction=extra.bias_correction and has_reader,
        ),
    )


def bias_correction_judge(
    source: onnx.ModelProto | str,
    model: ir.Model,
    rows: Sequence[GridChange],
    feeds: Sequence[dict[str, Any]],
    providers: Sequence[str] | None,
) -> tuple[str, list[list[Any]]] | None:
    """What a retarget's bias correction is judged against: the source model's outputs on ``feeds``; None
    when every grid was kept or propagated (the retarget reproduces the source: nothing to correct)."""
    changed = [r for r in rows if r.action not in ("kept", "propagated")]
    if not changed:
        logger.warning(
            "BiasCorrection skipped: the retarget keeps every grid of the pre-quantized model, so its "
            "outputs are the source's and there is no error to correct"
        )
        return None
    names = [o.name for o in model.graph.outputs]
    path = str(source) if not isinstance(source, onnx.ModelProto) else source
    return "source model", source_outputs(path, names, feeds, providers)


def _follow_renamed_weights(model: ir.Model, imported: ImportedModel) -> None:
    """Folding passes write a weight under a derived name (``W_affine``); its source grid follows it (the
    report then measures the target's codes against the weight as folded)."""
    inits = model.graph.initializers
    for old in [n for n in imported.weights if n not in inits]:
        grid = imported.weights.pop(old)
        new = next((n for n in inits if n.startswith(old) and n not in imported.weights), None)
        if new is not None:
            imported.weights[new] = grid


def pin_for_plan(
    plan: QuantPlan,
    imported: ImportedModel,
    model: ir.Model,
    has_data: bool,
    activation_dtypes: Sequence[str] = (),
) -> dict[str, str]:
    """Pin imported ranges on the plan; without data every planned activation must have one. Non-negative
    ranges keep unsigned codes where the target's ``activation_dtypes`` allow them (``keep_unsigned``)."""
    refuse_narrow_activations(imported, activation_dtypes)
    actions = pin_ranges(plan, imported, model)
    if activation_dtypes:
        n = keep_unsigned(plan, imported, activation_dtypes)
        if n:
            logger.info("%d non-negative activation range(s) keep unsigned codes with zero point 0", n)
    missing = [n for n, a in actions.items() if a == "calibrated"]
    if missing and not has_data:
        raise OptionError(
            f"{len(missing)} quantized tensor(s) have no range in the pre-quantized model, e.g. {missing[0]!r}; "
            "give calibration data (--calib) to calibrate them."
        )
    return actions


def refuse_narrow_activations(imported: ImportedModel, activation_dtypes: Sequence[str]) -> None:
    """Rule: an imported activation grid narrower than every activation type the target has (4-bit
    codes on an 8/16-bit NPU) is one the target can never take: its accuracy was trained or calibrated
    for those few levels, and widening them changes the model. Refused; ``--requantize`` starts from float."""
    if not activation_dtypes:
        return
    narrowest = min(qdtype(d).bits for d in activation_dtypes)
    narrow = {name: g for name, g in imported.activations.items() if g.bits < narrowest}
    if narrow:
        name, grid = next(iter(narrow.items()))
        raise OptionError(
            f"{len(narrow)} activation(s) of the pre-quantized model have {grid.bits}-bit grids, e.g. {name!r} "
            f"({grid.dtype}), and the target's activations are {', '.join(activation_dtypes)}: it cannot take "
            "them. Quantize from float instead (zonnx quantize ... --requantize), or pick a target with "
            f"{grid.bits}-bit activations."
        )


def finish_report(
    imported: ImportedModel,
    rows: list[GridChange],
    source: Any,
    result: onnx.ModelProto,
    feeds: list[dict[str, Any]],
    providers: Any = None,
) -> RetargetReport:
    """The retargeting report; outputs compared with the source model when ``feeds`` are given."""
    report = RetargetReport(imported.form, rows, notes=list(imported.notes))
    if feeds:
        src = source if isinstance(source, onnx.ModelProto) else str(source)
        report.outputs = compare_outputs(src, result, feeds, providers)
        report.checked = True
    logger.warning("%s", report.summary())
    return report
