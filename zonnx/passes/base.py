"""The pass contract every zonnx graph rewrite follows, built on onnx-ir's pass infrastructure."""

from __future__ import annotations

__all__ = ["Changes", "ZonnxPassResult", "ZonnxPass", "count_nodes"]

import abc
import dataclasses
from collections import Counter
from typing import ClassVar

import onnx_ir as ir


def count_nodes(graph: ir.Graph | ir.Function) -> int:
    """Count nodes in a graph including those inside subgraphs (If/Loop/Scan bodies)."""
    return sum(1 for _ in ir.traversal.RecursiveGraphIterator(graph))


@dataclasses.dataclass
class Changes:
    """What one pass run did: counts per kind of change and notes on rewrites it did not make.

    ``counts`` keys are short phrases ("folded Conv+BatchNormalization", "removed Identity");
    ``misses`` explain why a candidate was left alone ("Conv_3: W is also used by Conv_7").
    """

    counts: Counter[str] = dataclasses.field(default_factory=Counter)
    misses: list[str] = dataclasses.field(default_factory=list)

    def add(self, what: str, n: int = 1) -> None:
        if n:
            self.counts[what] += n

    def miss(self, reason: str) -> None:
        self.misses.append(reason)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def merge(self, other: Changes) -> None:
        """Add another run's counts; a miss already recorded (e.g. in an earlier round) is kept once."""
        self.counts.update(other.counts)
        seen = set(self.misses)
        self.misses.extend(m for m in other.misses if m not in seen and not seen.add(m))


@dataclasses.dataclass
class ZonnxPassResult(ir.passes.PassResult):
    """onnx-ir's PassResult plus what changed; ``modified`` is derived from a real count of changes."""

    changes: Changes = dataclasses.field(default_factory=Changes)


class ZonnxPass(ir.passes.InPlacePass):
    """Base class: a pass rewrites the model in place and reports what it changed.

    Subclasses set ``name`` (the id used by ``--passes``/``--skip``) and implement ``apply``, which
    mutates the model and returns a ``Changes``. A pass whose ``Changes`` is empty reports
    ``modified=False``, so a pipeline can run to a fixed point.
    """

    name: ClassVar[str] = ""
    #: Whether the pass may change numerics beyond float rounding (none of the pre-quant passes do).
    exact: ClassVar[bool] = True

    @abc.abstractmethod
    def apply(self, model: ir.Model) -> Changes:
        """Rewrite ``model`` in place and return what changed."""

    def call(self, model: ir.Model) -> ZonnxPassResult:
        changes = self.apply(model)
        return ZonnxPassResult(model=model, modified=changes.total > 0, changes=changes)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
