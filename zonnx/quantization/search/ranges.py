"""Per-tensor range search: clip the ranges of the most sensitive shared-scale groups where it lowers the output noise.

Rule (TPU-MLIR ``search_threshold``-like, but judged on the model's outputs): for the first ``groups``
shared-scale groups of ``order`` (the most sensitive first, e.g. ``measure.measure_groups`` sorted by
noise), try each range ratio ``r`` of ``ratios``: the group's scale becomes ``r`` times the calibrated
one (zero point and saturation codes unchanged), so its range is ``r`` times the calibrated range.
Greedy, group by group: every quantizer on, the ratios chosen so far kept, a group takes the ratio with
the least output noise (``output_noise`` against the float model, on the logits of a Softmax output)
when it is below the current noise, else keeps 1. One ``GatedModel`` session serves every trial (its
per-quantizer ratio inputs), so nothing is re-quantized during the search.

Candidates: ``RATIOS`` (1.0 down to 0.5 of the range) for float scales; for power-of-two scales only
ratios that keep a power of two, ``POF2_RATIOS`` (the calibrated position, one step wider, one and two
steps narrower).

Result: per-tensor overrides in ORT's ``TensorQuantOverrides`` form, ``{tensor: [{"scale": s *
r, "zero_point": z}]}`` on one tensor of each changed group (fixed parameters hold for its whole
shared group), so ``quantize_static(extra_options={"TensorQuantOverrides": ...})`` rebuilds the searched
model and a config file carries it.

Validation: a clipped range fitted to a few samples can be worse on others (on PP-OCRv4 rec, 4 lines
picked a residual Add at half its range: noise 0.166 -> 0.104 there, 0.073 -> 0.090 on other lines).
With ``validate`` samples, the choice is kept only when it also lowers the output noise there;
otherwise the search says so and changes nothing (no overrides).

Cost: ``1 + groups * (len(ratios) - 1)`` runs of the gated model on each sample, 2 on each validation one.
"""

from __future__ import annotations

__all__ = ["RATIOS", "POF2_RATIOS", "RangeChoice", "RangeSearch", "search_ranges", "range_ratios"]

import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from zonnx.errors import OptionError
from zonnx.quantization.search.gated import GatedModel, output_noise
from zonnx.quantization.search.measure import float_outputs, measured_outputs

logger = logging.getLogger(__name__)

RATIOS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)
POF2_RATIOS = (1.0, 2.0, 0.5, 0.25)


@dataclasses.dataclass
class RangeChoice:
    """One searched group: its tensors, the ratio chosen and the output noise before and after it."""

    tensors: list[str]
    ratio: float
    noise_before: float
    noise_after: float


@dataclasses.dataclass
class RangeSearch:
    """What the range search measured: noise of the plain model, of the searched one, each group's choice."""

    plain_noise: float
    noise: float
    choices: list[RangeChoice]
    overrides: dict[str, list[dict[str, Any]]]
    seconds: float = 0.0
    validation: tuple[float, float] | None = None  # (plain, searched) noise on the validation samples
    kept: bool = True  # False: the validation samples rejected the choice, nothing is overridden

    @property
    def changed(self) -> int:
        return sum(1 for c in self.choices if c.ratio != 1.0) if self.kept else 0


def range_ratios(power_of_two: bool) -> tuple[float, ...]:
    """The candidate ratios: powers of two for power-of-two scales, else 1.0 down to 0.5."""
    return POF2_RATIOS if power_of_two else RATIOS


def _override(plan: Any, group: Sequence[str], ratio: float) -> dict[str, list[dict[str, Any]]]:
    """The group's first tensor with parameters, its scale times ``ratio`` (zero point unchanged)."""
    for name in group:
        params = plan.tensors[name].params
        if params is None or np.ndim(params.scale) != 0:
            continue
        scale = float(np.float32(float(params.scale) * ratio))
        return {name: [{"scale": scale, "zero_point": int(params.zero_point)}]}
    return {}


def search_ranges(
    quant_model: onnx.ModelProto,
    float_model: onnx.ModelProto,
    plan: Any,
    order: Sequence[Sequence[str]],
    samples: Sequence[Mapping[str, np.ndarray]],
    *,
    groups: int = 16,
    ratios: Sequence[float] | None = None,
    keep: Iterable[str] = (),
    validate: Sequence[Mapping[str, np.ndarray]] = (),
) -> RangeSearch:
    """Greedy per-group ratio search of the module docstring on the first ``groups`` groups of ``order``
    (groups of ``plan``, whose parameters ``quant_model`` was written with); ``ratios``: the candidates
    (default ``range_ratios`` for the plan's spec); ``keep``: quantizers never switched off; ``validate``:
    samples the choice must also help on (module docstring)."""
    if groups < 1:
        raise OptionError(f"range search groups={groups}: search at least 1 group.")
    if not samples:
        raise OptionError("range search: give at least 1 evaluation sample.")
    start = time.perf_counter()
    pof2 = any(tp.spec.power_of_two for tp in plan.tensors.values() if tp.params is not None)
    cands = list(dict.fromkeys([1.0, *(ratios if ratios is not None else range_ratios(pof2))]))
    if any(not (r > 0) for r in cands):
        raise OptionError(f"range search ratios {cands}: give ratios > 0.")
    outputs = measured_outputs(float_model)
    known = [t for g in order for t in g]
    gated = GatedModel(quant_model, known=known, outputs=outputs, keep=keep)
    names = {i.name for i in float_model.graph.input}
    feeds = [{k: v for k, v in s.items() if k in names} for s in samples]
    reference = float_outputs(float_model, outputs, feeds)

    def noise(ratios_now: Mapping[str, float]) -> float:
        return output_noise(reference, gated.run(feeds, on=None, ratios=ratios_now))

    chosen: dict[str, float] = {}
    plain = current = noise(chosen)
    choices: list[RangeChoice] = []
    overrides: dict[str, list[dict[str, Any]]] = {}
    for group in [g for g in order if any(t in gated.units for t in g)][:groups]:
        present = [t for t in group if t in gated.units]
        best_r, best = 1.0, current
        for r in cands[1:]:
            got = noise({**chosen, **dict.fromkeys(present, r)})
            if got < best:
                best_r, best = r, got
        choices.append(RangeChoice(list(group), best_r, current, best))
        if best_r != 1.0:
            chosen.update(dict.fromkeys(present, best_r))
            overrides.update(_override(plan, group, best_r))
            current = best
    validation = None
    kept = True
    if validate and chosen:
        vfeeds = [{k: v for k, v in s.items() if k in names} for s in validate]
        vref = float_outputs(float_model, outputs, vfeeds)
        validation = tuple(output_noise(vref, gated.run(vfeeds, on=None, ratios=r)) for r in ({}, chosen))
        if not validation[1] < validation[0]:
            kept, overrides = False, {}
            logger.warning(
                "range search: the clipped ranges lower the output noise on the %d search sample(s) (%.4g -> "
                "%.4g) but not on the %d validation sample(s) (%.4g -> %.4g); ranges left as calibrated",
                len(feeds), plain, current, len(vfeeds), *validation,
            )  # fmt: skip
    seconds = time.perf_counter() - start
    logger.info(
        "range search: %d of %d group(s) clipped, output noise %.4g -> %.4g on %d sample(s) in %.0f s",
        sum(1 for c in choices if c.ratio != 1.0), len(choices), plain, current, len(feeds), seconds,
    )  # fmt: skip
    return RangeSearch(plain, current, choices, overrides, seconds, validation, kept)
