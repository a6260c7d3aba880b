"""``zonnx.optimize``: run a named pass pipeline on a model and report what each pass changed."""

from __future__ import annotations

__all__ = ["OptimizeOptions", "OptimizeResult", "optimize", "optimize_with_report"]

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

import onnx
import onnx_ir as ir

from zonnx.errors import OptionError
from zonnx.ir.io import MIN_OPSET, ModelLike, to_ir, to_proto
from zonnx.passes.catalog import make_pass, resolve_pass_names
from zonnx.passes.pipeline import Pipeline, PipelineReport, VerifyOptions

logger = logging.getLogger(__name__)

#: Opset the pre-quantization pipeline upgrades to unless told otherwise.
DEFAULT_OPSET = 17


@dataclasses.dataclass(frozen=True)
class OptimizeOptions:
    """Options of ``optimize``.

    Attributes:
        target_opset: default-domain opset to upgrade to (default 17; 13 or newer).
        pipeline: named pipeline to run (default "pre_quant"; see ``zonnx.passes.PIPELINES``).
        passes: explicit pass or pipeline names instead of ``pipeline`` (default None).
        skip: pass names to leave out (default empty).
        fixed_point: repeat the pass list until nothing changes (default True).
        max_rounds: bound on fixed-point rounds (default 4).
        verify: check the model after each pass (default None: no checks).
    """

    target_opset: int = DEFAULT_OPSET
    pipeline: str = "pre_quant"
    passes: tuple[str, ...] | None = None
    skip: tuple[str, ...] = ()
    fixed_point: bool = True
    max_rounds: int = 4
    verify: VerifyOptions | None = None

    def __post_init__(self) -> None:
        if not 13 <= self.target_opset <= onnx.defs.onnx_opset_version():
            raise OptionError(
                f"--opset {self.target_opset}: choose an opset from 13 to {onnx.defs.onnx_opset_version()} "
                f"(ORT 1.31 runs up to 23; models older than opset {MIN_OPSET} cannot be upgraded)."
            )
        if self.max_rounds < 1:
            raise OptionError(f"max_rounds={self.max_rounds}: must be at least 1.")

    def pass_names(self) -> list[str]:
        return resolve_pass_names(self.pipeline, self.passes, self.skip)


@dataclasses.dataclass
class OptimizeResult:
    """The optimized model (same kind as the input) and the pipeline's report."""

    model: onnx.ModelProto | ir.Model
    report: PipelineReport
    pass_names: list[str]


def optimize_with_report(
    model: ModelLike,
    options: OptimizeOptions | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> OptimizeResult:
    """Run the pipeline; an ``ir.Model`` is rewritten in place, anything else is loaded and copied."""
    options = options or OptimizeOptions()
    names = options.pass_names()
    passes = [make_pass(n, target_opset=options.target_opset) for n in names]
    work = model if isinstance(model, ir.Model) else to_ir(model)
    pipeline = Pipeline(
        passes,
        fixed_point=options.fixed_point,
        max_rounds=options.max_rounds,
        verify=options.verify,
        progress=progress,
    )
    report = pipeline.run(work)
    out: onnx.ModelProto | ir.Model = work if isinstance(model, ir.Model) else to_proto(work)
    return OptimizeResult(out, report, names)


def optimize(
    model: ModelLike,
    *,
    opset: int = DEFAULT_OPSET,
    pipeline: str = "pre_quant",
    passes: Sequence[str] | None = None,
    skip: Sequence[str] = (),
    verify: bool = False,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> onnx.ModelProto | ir.Model:
    """Optimize a model for quantization; returns a ModelProto (an ir.Model when given one).

    ``verify=True`` checks the model after every pass (onnx.checker, ORT load, outputs within 1e-5 of
    their range on generated inputs) and raises VerificationError naming the pass that broke it.
    """
    options = OptimizeOptions(
        target_opset=opset,
        pipeline=pipeline,
        passes=tuple(passes) if passes else None,
        skip=tuple(skip),
        verify=VerifyOptions(shapes=input_shapes) if verify else None,
    )
    return optimize_with_report(model, options).model
