"""What every frontend ends with: the ``clean`` pipeline, kept I/O names, provenance metadata, and a
numeric check of the ONNX model against the source framework on the same inputs (TPU-MLIR's
``--test_input``/``--tolerance``).
"""

from __future__ import annotations

__all__ = [
    "ConversionError",
    "OutputCheck",
    "SourceInfo",
    "ConversionResult",
    "finish",
    "check_against_source",
    "render_checks",
    "DEFAULT_MIN_COSINE",
]

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from rich.console import Console
from rich.table import Table

from zonnx import __version__
from zonnx.errors import ZonnxError
from zonnx.ir.io import to_ir, to_proto
from zonnx.ir.large import copy_model
from zonnx.optimization import OptimizeOptions, optimize_with_report
from zonnx.verify import cosine, run_ort

logger = logging.getLogger(__name__)

#: Float conversions must reach this cosine similarity on every output (issue: > 0.9999).
DEFAULT_MIN_COSINE = 0.9999
#: ... unless every value is within this absolute error (a detector's map on noise is all ~0).
DEFAULT_ATOL = 1e-6
#: An output whose largest magnitude is below this is "all near zero" for the atol rule.
NEAR_ZERO = 1e-4


class ConversionError(ZonnxError):
    """A model could not be converted, or the converted model does not match its source."""


@dataclasses.dataclass(frozen=True)
class SourceInfo:
    """Provenance recorded in the output's metadata: source file, framework and version, options."""

    source: str
    framework: str
    framework_version: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def metadata(self) -> dict[str, str]:
        return {
            "zonnx.source": self.source,
            "zonnx.framework": self.framework,
            "zonnx.framework_version": self.framework_version,
            "zonnx.convert_options": json.dumps(dict(self.options), sort_keys=True, default=str),
            "zonnx.version": __version__,
        }


@dataclasses.dataclass(frozen=True)
class OutputCheck:
    """How one output of the ONNX model compares with the source framework's (worst over the samples).

    ``max_lsb`` is set for integer (quantized) outputs: the largest code difference.
    """

    name: str
    cosine: float
    max_abs: float
    max_lsb: int | None = None
    ref_max_abs: float = float("inf")
    #: What the output was compared with when not the source's own run (e.g. torch re-run exactly).
    reference: str = ""

    def passed(self, min_cosine: float, max_lsb: int | None, atol: float = 0.0) -> bool:
        """Integer outputs: within ``max_lsb`` codes. Float outputs: cosine at least ``min_cosine``; or,
        when the source's output is itself all near zero (|x| <= NEAR_ZERO, where cosine measures only
        rounding noise), every value within ``atol``."""
        if self.max_lsb is not None and max_lsb is not None:
            return self.max_lsb <= max_lsb
        return self.cosine >= min_cosine or (self.ref_max_abs <= NEAR_ZERO and self.max_abs <= atol)


@dataclasses.dataclass
class ConversionResult:
    """What a frontend returns: the cleaned model, the numeric check per output, and the provenance."""

    model: onnx.ModelProto
    checks: list[OutputCheck]
    info: SourceInfo


def check_against_source(
    model: onnx.ModelProto,
    source_run: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]],
    feeds_list: Sequence[Mapping[str, np.ndarray]],
    *,
    min_cosine: float = DEFAULT_MIN_COSINE,
    max_lsb: int | None = 1,
    atol: float = DEFAULT_ATOL,
    reference: str = "",
    note: str = "",
) -> list[OutputCheck]:
    """Run the ONNX model (ORT) and the source on every feed and compare outputs by name.

    The rule: every output must reach ``min_cosine`` (float) or differ by at most ``max_lsb`` codes
    (integer outputs); otherwise ConversionError names the output and the numbers. Outputs are matched
    by name, or by position when the source returns unnamed outputs (keys "0", "1", ...).
    ``reference`` names what ``source_run`` is when not the source's own run (recorded in each check);
    ``note`` is appended to a mismatch's message (what the user must know about the source's numbers).
    """
    if not feeds_list:
        raise ConversionError("the numeric check needs at least one input sample.")
    worst: dict[str, OutputCheck] = {}
    out_names = [o.name for o in model.graph.output]
    for feeds in feeds_list:
        ours = run_ort(model, feeds)
        theirs = dict(source_run(feeds))
        for i, name in enumerate(out_names):
            ref = theirs.get(name, theirs.get(str(i)))
            if ref is None:
                raise ConversionError(
                    f"output {name!r}: the source model returned no output of that name or "
                    f"position (it returned {sorted(theirs)})."
                )
            got = ours[name]
            ref = np.asarray(ref)
            if ref.shape != got.shape:
                raise ConversionError(
                    f"output {name!r}: shape {got.shape} differs from the source's {ref.shape}."
                )
            lsb = None
            if ref.dtype.kind in "iu" and got.dtype.kind in "iu":
                lsb = int(np.max(np.abs(ref.astype(np.int64) - got.astype(np.int64)), initial=0))
            check = OutputCheck(
                name,
                cosine(ref, got),
                float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64)), initial=0.0)),
                lsb,
                float(np.max(np.abs(ref.astype(np.float64)), initial=0.0)),
                reference,
            )
            prev = worst.get(name)
            if prev is None or check.cosine < prev.cosine or (check.max_lsb or 0) > (prev.max_lsb or 0):
                worst[name] = check
    checks = list(worst.values())
    for c in checks:
        if not c.passed(min_cosine, max_lsb, atol):
            detail = (
                f"{c.max_lsb} LSB (allowed {max_lsb})"
                if c.max_lsb is not None
                else f"cosine {c.cosine:.6f} (needs {min_cosine}), max abs error {c.max_abs:.3g}"
            )
            against = f" ({reference})" if reference else ""
            raise ConversionError(
                f"output {c.name!r} does not match the source framework{against}: {detail}"
                + (f"; {note}." if note else ".")
            )
    return checks


def render_checks(checks: Sequence[OutputCheck], console: Console) -> None:
    """Print the per-output comparison table."""
    table = Table(title="numeric check against the source framework", title_justify="left")
    for col in ("output", "cosine", "max abs error", "max LSB"):
        table.add_column(col)
    for c in checks:
        table.add_row(
            c.name, f"{c.cosine:.8f}", f"{c.max_abs:.3g}", "-" if c.max_lsb is None else str(c.max_lsb)
        )
    console.print(table)


def finish(
    model: onnx.ModelProto,
    info: SourceInfo,
    *,
    opset: int = 17,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
) -> onnx.ModelProto:
    """Run the ``clean`` pipeline (opset normalized to ``opset`` or kept if newer), check that the
    graph's input/output names are still ``input_names``/``output_names`` when given, and record the
    provenance in the metadata. Returns a new ModelProto (IR version loadable by ORT 1.31)."""
    result = optimize_with_report(
        to_ir(copy_model(model)),  # a copy that never serializes (models past 2 GB)
        OptimizeOptions(target_opset=opset, pipeline="clean"),
    )
    cleaned = to_proto(result.model)
    for kind, wanted, actual in (
        ("input", input_names, [i.name for i in cleaned.graph.input]),
        ("output", output_names, [o.name for o in cleaned.graph.output]),
    ):
        if wanted is not None and list(wanted) != [a for a in actual if a in set(wanted)]:
            raise ConversionError(f"the {kind} names changed during clean-up: {list(wanted)} -> {actual}.")
    props = {p.key: p.value for p in cleaned.metadata_props}
    props.update(info.metadata())
    del cleaned.metadata_props[:]
    onnx.helper.set_model_props(cleaned, props)
    return cleaned
