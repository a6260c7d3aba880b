"""The explicit registry of passes (name -> class) and the named pipelines built from them."""

from __future__ import annotations

__all__ = ["PASSES", "PIPELINES", "pass_class", "make_pass", "pipeline_names", "resolve_pass_names"]

import importlib
from collections.abc import Sequence
from typing import Any

from zonnx.errors import OptionError, did_you_mean
from zonnx.passes.base import ZonnxPass

#: pass name -> "module:Class". Imported on first use so that loading zonnx stays fast.
PASSES: dict[str, str] = {
    "opset-upgrade": "zonnx.passes.common.opset_upgrade:OpsetUpgradePass",
    "shape-inference": "zonnx.passes.common.shape_inference:ShapeInferencePass",
    "constant-folding": "zonnx.passes.common.constant_folding:ConstantFoldingPass",
    "remove-noops": "zonnx.passes.common.remove_noops:RemoveNoOpsPass",
    "dead-code": "zonnx.passes.common.dead_code:DeadCodeEliminationPass",
    "unshare-bias": "zonnx.passes.common.unshare_bias:UnshareBiasPass",
    "cse": "zonnx.passes.common.cse:CommonSubexpressionPass",
    "onnxslim": "zonnx.passes.common.onnxslim_pass:OnnxSlimPass",
    "fold-batchnorm": "zonnx.passes.fusion.batchnorm:FoldBatchNormPass",
    "fold-conv-affine": "zonnx.passes.fusion.conv_affine:FoldConvAffinePass",
    "fuse-hardswish": "zonnx.passes.fusion.hardswish:FuseHardSwishPass",
    "fuse-layernorm": "zonnx.passes.fusion.layernorm:FuseLayerNormPass",
    "fuse-gelu": "zonnx.passes.fusion.gelu:FuseGeluPass",
    "canonicalize-gemm": "zonnx.passes.fusion.gemm:CanonicalizeGemmPass",
    "cancel-transpose-reshape": "zonnx.passes.fusion.transpose_reshape:CancelTransposeReshapePass",
    # imports of models quantized elsewhere
    "qoperator-to-qdq": "zonnx.converters.qoperator_to_qdq:QOperatorToQDQPass",
    "dynamic-to-qdq": "zonnx.passes.common.dynamic_to_qdq:DynamicToQDQPass",
    # NPU constraint refinement of quantized models (option target=, default "dpu-b4096")
    "refine-leaky-relu": "zonnx.quantization.refine.leaky_relu:LeakyReluSlopePass",
    "refine-sigmoid": "zonnx.quantization.refine.sigmoid:SigmoidRangePass",
    "refine-eltwise": "zonnx.quantization.refine.eltwise:EltwiseShiftPass",
    "refine-shift-cut": "zonnx.quantization.refine.shift_cut:ShiftCutPass",
    "refine-shift-bias": "zonnx.quantization.refine.shift_bias:ShiftBiasPass",
    "refine-align-concat": "zonnx.quantization.refine.concat:AlignConcatPass",
    "refine-align-pool": "zonnx.quantization.refine.pool:AlignPoolPass",
    "refine-avgpool-factor": "zonnx.quantization.refine.avgpool:AvgPoolFactorPass",
}

#: Named pipelines. ``clean`` is what converters end with; ``pre_quant`` is ``zonnx optimize``'s default.
PIPELINES: dict[str, tuple[str, ...]] = {
    "clean": (
        "opset-upgrade",
        "shape-inference",
        "remove-noops",
        "constant-folding",
        "dead-code",
        "cse",
        "shape-inference",
    ),
    "pre_quant": (
        "opset-upgrade",
        "shape-inference",
        "remove-noops",
        "constant-folding",
        "fold-batchnorm",
        "fuse-layernorm",
        "fuse-gelu",
        "canonicalize-gemm",
        "cancel-transpose-reshape",
        "cse",
        "dead-code",
        "shape-inference",
    ),
    # vai_q_onnx's refinement order, for quantized models
    "npu_refine": (
        "refine-leaky-relu",
        "refine-sigmoid",
        "refine-eltwise",
        "refine-shift-cut",
        "refine-shift-bias",
        "refine-align-concat",
        "refine-align-pool",
        "refine-avgpool-factor",
    ),
}

#: Passes that take the target opset as an option.
_OPSET_AWARE = {"opset-upgrade", "fuse-layernorm", "fuse-gelu"}


def pass_class(name: str) -> type[ZonnxPass]:
    """Return the class registered under ``name``; an unknown name lists the known ones."""
    if name not in PASSES:
        raise OptionError(
            f"unknown pass {name!r}.{did_you_mean(name, PASSES)} Known passes: {', '.join(PASSES)}."
        )
    module_name, _, cls_name = PASSES[name].partition(":")
    return getattr(importlib.import_module(module_name), cls_name)


def make_pass(name: str, **options: Any) -> ZonnxPass:
    """Instantiate a pass; ``target_opset`` is passed only to the passes that use it."""
    cls = pass_class(name)
    if name not in _OPSET_AWARE:
        options.pop("target_opset", None)
    return cls(**options)


def pipeline_names() -> list[str]:
    return list(PIPELINES)


def resolve_pass_names(
    pipeline: str = "pre_quant", passes: Sequence[str] | None = None, skip: Sequence[str] = ()
) -> list[str]:
    """The pass list: ``passes`` if given (names or a pipeline name), else the pipeline, minus ``skip``."""
    if pipeline not in PIPELINES:
        raise OptionError(
            f"unknown pipeline {pipeline!r}.{did_you_mean(pipeline, PIPELINES)} "
            f"Known pipelines: {', '.join(PIPELINES)}."
        )
    names: list[str] = []
    for item in passes if passes else PIPELINES[pipeline]:
        names.extend(PIPELINES.get(item, (item,)))
    for name in [*names, *skip]:
        if name not in PASSES:
            pass_class(name)  # raises with a suggestion and the known names
    return [n for n in names if n not in set(skip)]
