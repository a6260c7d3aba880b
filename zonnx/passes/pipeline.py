"""Run passes in order, optionally to a fixed point, timing each and verifying after each on request."""

from __future__ import annotations

__all__ = ["VerifyOptions", "PassRecord", "PipelineReport", "Pipeline"]

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from zonnx.errors import PassFailedError, VerificationError, ZonnxError
from zonnx.passes.base import Changes, ZonnxPass
from zonnx.verify import OutputDiff, check_loadable, compare_outputs, make_inputs, run_ort

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class VerifyOptions:
    """What to check after every pass.

    Attributes:
        checker: run onnx.checker and create an ORT session (default True).
        numeric: compare ORT outputs with the original model's on generated inputs (default True).
        rtol: largest allowed max-abs error divided by the reference output's range (default 1e-5).
        seed: seed for the generated inputs (default 0).
        shapes: concrete shapes for inputs with symbolic dims (default: batch 1, others 64).
    """

    checker: bool = True
    numeric: bool = True
    rtol: float = 1e-5
    seed: int = 0
    shapes: Mapping[str, tuple[int, ...]] | None = None


@dataclasses.dataclass
class PassRecord:
    """One pass's run inside a pipeline (summed over fixed-point rounds)."""

    name: str
    seconds: float = 0.0
    nodes_before: int = 0
    nodes_after: int = 0
    added: Counter[str] = dataclasses.field(default_factory=Counter)
    removed: Counter[str] = dataclasses.field(default_factory=Counter)
    changes: Changes = dataclasses.field(default_factory=Changes)
    max_error: float | None = None

    @property
    def modified(self) -> bool:
        return self.changes.total > 0


@dataclasses.dataclass
class PipelineReport:
    """One record per pass position, rounds run, and the final numeric comparison if verification was on."""

    records: list[PassRecord]
    rounds: int
    seconds: float
    nodes_before: int
    nodes_after: int
    final_diffs: list[OutputDiff] | None = None

    @property
    def max_error(self) -> float | None:
        if self.final_diffs is None:
            return None
        return max((d.relative for d in self.final_diffs), default=0.0)


def _nodes_by_id(model: ir.Model) -> dict[int, ir.Node]:
    """Map id -> node; holding the nodes keeps ids from being reused while we diff two snapshots."""
    return {id(n): n for n in ir.traversal.RecursiveGraphIterator(model.graph)}


class Pipeline:
    """A list of passes run in order; ``fixed_point`` repeats the list until no pass changes anything.

    Options: ``max_rounds`` (default 4) bounds the fixed-point iteration; ``verify`` (default None)
    checks the model after every pass and fails with the name of the pass that broke it.
    """

    def __init__(
        self,
        passes: Sequence[ZonnxPass],
        *,
        fixed_point: bool = False,
        max_rounds: int = 4,
        verify: VerifyOptions | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.passes = list(passes)
        self.fixed_point = fixed_point
        self.max_rounds = max_rounds if fixed_point else 1
        self.verify = verify
        self.progress = progress

    def _reference(self, model: ir.Model) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None:
        if self.verify is None or not self.verify.numeric:
            return None
        proto = ir.serde.serialize_model(model)
        feeds = make_inputs(proto, seed=self.verify.seed, shapes=self.verify.shapes)
        return feeds, run_ort(proto, feeds)

    def _check(self, model: ir.Model, pass_name: str, ref, record: PassRecord) -> list[OutputDiff] | None:
        assert self.verify is not None
        proto = ir.serde.serialize_model(model)
        try:
            if self.verify.checker:
                check_loadable(proto, full_check=False)
            if ref is None:
                return None
            feeds, expected = ref
            diffs = compare_outputs(expected, run_ort(proto, feeds))
        except VerificationError as e:
            raise VerificationError(f"after pass {pass_name!r}: {e}") from None
        record.max_error = max([record.max_error or 0.0] + [d.relative for d in diffs])
        for d in diffs:
            if not d.within(self.verify.rtol):
                raise VerificationError(
                    f"after pass {pass_name!r}: output {d.name!r} differs by {d.max_abs:.3g} "
                    f"({d.relative:.3g} of its range, bound {self.verify.rtol:g}); "
                    f"skip the pass with --skip {pass_name} and report the model."
                )
        return diffs

    def run(self, model: ir.Model) -> PipelineReport:
        """Run the passes on ``model`` in place and return the report."""
        start = time.perf_counter()
        ref = self._reference(model) if self.verify else None
        records = [PassRecord(p.name) for p in self.passes]
        nodes_before = len(_nodes_by_id(model))
        final_diffs = None
        rounds = 0
        for rounds in range(1, self.max_rounds + 1):
            changed = False
            for p, rec in zip(self.passes, records, strict=True):
                before = _nodes_by_id(model)
                if self.progress:
                    self.progress(p.name)
                t0 = time.perf_counter()
                try:
                    result = p(model)
                except ZonnxError:
                    raise
                except Exception as e:
                    raise PassFailedError(
                        f"pass {p.name!r} failed on graph {model.graph.name!r}: {type(e).__name__}: {e}; "
                        f"skip it with --skip {p.name} and report the model."
                    ) from e
                rec.seconds += time.perf_counter() - t0
                after = _nodes_by_id(model)
                if rounds == 1:
                    rec.nodes_before = len(before)
                rec.nodes_after = len(after)
                rec.removed.update(before[k].op_type for k in before.keys() - after.keys())
                rec.added.update(after[k].op_type for k in after.keys() - before.keys())
                rec.changes.merge(result.changes)
                changed |= result.modified
                if self.verify and result.modified:
                    final_diffs = self._check(model, p.name, ref, rec) or final_diffs
            if not changed:
                break
        if self.verify and ref is not None and final_diffs is None:
            final_diffs = compare_outputs(ref[1], run_ort(ir.serde.serialize_model(model), ref[0]))
        return PipelineReport(
            records=records,
            rounds=rounds,
            seconds=time.perf_counter() - start,
            nodes_before=nodes_before,
            nodes_after=len(_nodes_by_id(model)),
            final_diffs=final_diffs,
        )
