"""Graph passes on onnx-ir models: the pass contract, the registry of passes and the pipeline runner."""

from zonnx.passes.base import Changes, ZonnxPass, ZonnxPassResult
from zonnx.passes.catalog import PASSES, PIPELINES, make_pass, pass_class, resolve_pass_names
from zonnx.passes.pipeline import PassRecord, Pipeline, PipelineReport, VerifyOptions

__all__ = [
    "Changes",
    "ZonnxPass",
    "ZonnxPassResult",
    "PASSES",
    "PIPELINES",
    "make_pass",
    "pass_class",
    "resolve_pass_names",
    "Pipeline",
    "PipelineReport",
    "PassRecord",
    "VerifyOptions",
]
