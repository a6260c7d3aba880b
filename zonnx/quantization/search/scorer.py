"""Score one mixed-precision candidate: re-quantize from saved statistics, run it, apply the metric.

A candidate is a mapping node name -> precision: ``"int16"`` (16-bit activations for the node) or
``"float"`` (the node is left float; on an NPU target it runs on the CPU). Re-quantizing uses the
statistics saved by the baseline run, so no candidate calibrates again, and the per-layer report is
off. The float model's outputs on the evaluation samples are computed once.

Search samples: with ``search_samples`` N, candidates are scored on the first N evaluation samples
(cheaper); ``score(..., full=True)`` scores on all of them, for the final confirmation.

NPU share: for a target, the quantized candidate goes through the backend's capability check and
partitioner (no compilation), and the share of MACs in NPU subgraphs is recorded beside the metric.
With ``input_shapes`` the inputs' dims are fixed first and the shape arithmetic folded, as
``compile_model(input_shapes=)`` does: a model with a dynamic dim (PP-OCR rec's width) otherwise
keeps most of its layers off the NPU, so the share would not be the one the compiled model gets.
"""

from __future__ import annotations

__all__ = ["Candidate", "CandidateScorer", "PRECISIONS", "npu_mac_share", "npu_partition"]

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zonnx.errors import OptionError
from zonnx.metrics.evaluate import FloatReference
from zonnx.quantization.config import QuantConfig

logger = logging.getLogger(__name__)

PRECISIONS = ("int16", "float")


@dataclasses.dataclass
class Candidate:
    """One evaluated configuration: which nodes are not int8, its score and what it costs."""

    overrides: dict[str, str]
    score: float
    npu_mac_share: float | None = None
    seconds: float = 0.0
    full: bool = False  # scored on every evaluation sample (not only the search samples)
    #: SQNR (dB) of the candidate's outputs against float's on the samples it was scored on
    output_sqnr: float | None = None
    #: for a target: the nodes the partitioner leaves on the CPU (not written to the table)
    off_npu: frozenset[str] | None = dataclasses.field(default=None, repr=False)
    #: its outputs on the samples it was scored on, while the search compares it (``score(keep_outputs=)``)
    outputs: list[list[np.ndarray]] | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def raised(self) -> int:
        return len(self.overrides)

    def as_dict(self) -> dict[str, Any]:
        """The candidate as JSON-ready data (without ``off_npu`` and ``outputs``)."""
        skipped = ("off_npu", "outputs")
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skipped}
        out["overrides"] = dict(self.overrides)
        return out


def node_overrides(overrides: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Candidate precisions as the per-node overrides of a quantization config file."""
    out: dict[str, dict[str, Any]] = {}
    for node, precision in overrides.items():
        if precision not in PRECISIONS:
            raise OptionError(
                f"node {node!r}: precision {precision!r} is not one of {', '.join(PRECISIONS)}."
            )
        out[node] = {"exclude": True} if precision == "float" else {"activation_type": precision}
    return out


def runs_on_samples(config: QuantConfig) -> bool:
    """True when quantizing with ``config`` runs the model on calibration samples even with statistics
    loaded: bias correction and fast finetune measure layers, SmoothQuant measures activation channels."""
    extra = config.extra
    return bool(extra.bias_correction or extra.include_fast_ft or extra.smooth_quant)


def npu_mac_share(model: Any, target: str, input_shapes: Mapping[str, Sequence[int]] | None = None) -> float:
    """Share of MACs the backend's partitioner would put on ``target`` (capability + partition only),
    with the inputs' dims fixed to ``input_shapes`` when given."""
    return npu_partition(model, target, input_shapes).mac_share


def npu_partition(model: Any, target: str, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Any:
    """The backend's partition of ``model`` for ``target`` (capability + partition, no compilation), with
    the inputs' dims fixed to ``input_shapes`` when given."""
    import onnx_ir as ir

    from zonnx.backend.compile_api import fix_input_shapes
    from zonnx.backend.partition.capability import propose
    from zonnx.backend.partition.partitioner import partition
    from zonnx.backend.targets import load_target

    if input_shapes:
        model = fix_input_shapes(model, input_shapes)
    ir_model = ir.serde.deserialize_model(model)
    capability = propose(ir_model, load_target(target), input_shapes=input_shapes)
    return partition(ir_model, capability)


class CandidateScorer:
    """Quantizes ``float_model`` with ``base`` plus a candidate's overrides and scores it on ``feeds``."""

    def __init__(
        self,
        float_model: str | Path,
        base: QuantConfig,
        stats_path: str | Path,
        feeds: Sequence[Mapping[str, np.ndarray]],
        metric: str,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        search_samples: int | None = None,
        calib_feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
    ) -> None:
        if not feeds:
            raise OptionError("the accuracy search needs at least one evaluation sample.")
        self.float_model = str(float_model)
        self.metric_spec = metric
        self.input_shapes = dict(input_shapes) if input_shapes else None
        # algorithms that run the model on samples (bias correction, fast finetune, SmoothQuant) need
        # them per candidate
        self.calib_feeds = [dict(f) for f in calib_feeds] if calib_feeds else None
        self.base = dataclasses.replace(
            base,
            extra=dataclasses.replace(
                base.extra, load_stats=str(stats_path), save_stats=None, report_samples=0, report_path=None
            ),
        )
        if search_samples is not None and search_samples < 1:
            raise OptionError(f"search_samples={search_samples}: score candidates on at least 1 sample.")
        self.full = FloatReference(self.float_model, feeds, metric, self.float_model)
        self.full.require_higher_is_better("the accuracy budget search")
        self.reference = self.full
        if search_samples is not None and search_samples < len(self.full.feeds):
            self.reference = FloatReference(
                self.float_model, self.full.feeds[:search_samples], metric, self.float_model
            )
        self.feeds = self.reference.feeds
        # with the metric's step on the samples that score candidates (None for a continuous metric)
        self.float_score, self.resolution = self.reference.self_score()
        # the step on every evaluation sample, where the configuration trials score
        self.full_resolution = self.full.self_score()[1] if self.subset else self.resolution

    def quantize(self, overrides: Mapping[str, str]) -> Any:
        """The quantized ModelProto of a candidate (nothing written)."""
        from zonnx.quantization.api import quantize_static

        cfg = dataclasses.replace(
            self.base, node_overrides={**self.base.node_overrides, **node_overrides(overrides)}
        )
        from zonnx.quantization.calibration.readers import ListReader

        reader = ListReader(self.calib_feeds) if self.calib_feeds and runs_on_samples(self.base) else None
        return quantize_static(self.float_model, None, reader, config=cfg).model

    @property
    def subset(self) -> bool:
        """True when candidates are scored on fewer samples than the full evaluation set."""
        return self.reference is not self.full

    def score(
        self, overrides: Mapping[str, str], *, full: bool = False, keep_outputs: bool = False
    ) -> Candidate:
        """Quantize, run and score one candidate (on every evaluation sample with ``full``, else on the
        search samples); the NPU share when the base config has a target; with ``keep_outputs`` the
        candidate holds its outputs (``Candidate.outputs``) for a comparison beyond noise."""
        start = time.perf_counter()
        model = self.quantize(overrides)
        reference = self.full if full else self.reference
        outputs = reference.run(model)
        score, sqnr = reference.score_outputs_with_sqnr(outputs)
        target = self.base.extra.target
        part = npu_partition(model, target, self.input_shapes) if target else None
        return Candidate(
            dict(overrides),
            score,
            part.mac_share if part is not None else None,
            time.perf_counter() - start,
            full,
            sqnr,
            frozenset(part.cpu_nodes) if part is not None else None,
            outputs if keep_outputs else None,
        )

    def search_outputs(self, candidate: Candidate) -> list[list[np.ndarray]]:
        """``candidate``'s outputs on the search samples: those it kept (the first of them when it was
        scored on every sample), else its model quantized and run again (then kept on the candidate)."""
        count = len(self.reference.feeds)
        if candidate.outputs is None or len(candidate.outputs) < count:
            candidate.outputs = self.reference.run(self.quantize(candidate.overrides))
        return candidate.outputs[:count]
