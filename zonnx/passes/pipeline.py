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
        feeds: real inputs to compare on instead of generated ones (default None). Generated
            inputs can give outputs with a tiny range (a detector on noise finds nothing), which
            makes the relative bound meaningless: give real inputs for such models.
    """

    checker: bool = True
    numeric: bool = True
    rtol: float = 1e-5
    seed: int = 0
    shapes: Mapping[str, tuple[int, ...]] | None = None
    feeds: Mapping[str, np.ndarray] | None = None


@dataclasses.dataclass
class PassRecord:
    """One pass's runs inside a pipeline: node counts of its first run; op types removed/added,
    changes and misses summed over every fixed-point round."""

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


def _op_histogram(model: ir.Model) -> Counter[str]:
    """Op types of every node, subgraphs included.

    Passes are compared by histogram, not node identity: a pass that rebuilds nodes one for one
    (onnx's version converter does) has removed and added nothing a user would call a change.
    """
    return Counter(n.op_type for n in ir.traversal.RecursiveGraphIterator(model.graph))


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
        feeds = (
            dict(self.verify.feeds)
            if self.verify.feeds is not None
            else make_inputs(proto, seed=self.verify.seed, shapes=self.verify.shapes)
        )
        try:
            return feeds, run_ort(proto, feeds)
        except VerificationError as e:
            if self.verify.feeds is not None:
                raise
            shown = ", ".join(f"{k} {list(v.shape)} {v.dtype}" for k, v in feeds.items())
            raise VerificationError(
                f"the input model fails on generated inputs ({shown}): {e} Give real inputs with "
                "--inputs FILE.npz, or the shapes the model needs with --input-shape NAME:D1,D2,..."
            ) from None

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
                    f"({d.relative:.3g} of its range {d.ref_range:.3g}, bound {self.verify.rtol:g}); "
                    + (
                        "generated inputs give this output a tiny range: verify on real inputs (--inputs FILE.npz)."
                        if self.verify.feeds is None and d.ref_range < 1e-3
                        else f"skip the pass with --skip {pass_name} and report the model."
                    )
                )
        return diffs

    def run(self, model: ir.Model) -> PipelineReport:
        """Run the passes on ``model`` in place and return the report."""
        start = time.perf_counter()
        ref = self._reference(model) if self.verify else None
        records = [PassRecord(p.name) for p in self.passes]
        nodes_before = sum(_op_histogram(model).values())
        final_diffs = None
        rounds = 0
        for rounds in range(1, self.max_rounds + 1):
            changed = False
            for p, rec in zip(self.passes, records, strict=True):
                before = _op_histogram(model)
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
                after = _op_histogram(model)
                if rounds == 1:
                    rec.nodes_before, rec.nodes_after = sum(before.values()), sum(after.values())
                rec.removed.update(before - after)
                rec.added.update(after - before)
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
            nodes_after=sum(_op_histogram(model).values()),
            final_diffs=final_diffs,
        )
