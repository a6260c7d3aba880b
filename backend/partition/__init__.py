"""The GetCapability and partition steps of the NPU execution provider (zonnx.backend.partition).

``propose(model, target)`` marks every node as NPU-capable or not, with the rule it broke
(``capability``; operator-table limits in ``limits``); ``partition(model, capability, min_nodes=2)``
claims maximal connected, convex groups as NPU subgraphs with integer boundary tensors
(``partitioner``); ``coverage_advice``/``check_coverage`` say when the NPU is left (nearly) idle, why and
the fix (``coverage``); ``render_partition`` and ``to_dict`` show the result (``report``).
"""

from __future__ import annotations

__all__ = [
    "CapabilityResult",
    "NodeVerdict",
    "Partition",
    "Subgraph",
    "propose",
    "partition",
    "render_partition",
    "format_partition",
    "to_dict",
    "coverage_advice",
    "check_coverage",
    "LowCoverageError",
]

from .capability import CapabilityResult, NodeVerdict, propose
from .coverage import LowCoverageError, check_coverage, coverage_advice
from .partitioner import Partition, Subgraph, partition
from .report import format_partition, render_partition, to_dict
