"""Fast finetune (Vitis AI's ``IncludeFastFT``): AdaRound or AdaQuant, layer by layer, on a quantized model.

For every quantized Conv / Gemm / MatMul with a constant weight (``finetune_layers``), in topological
order:

1. capture, on the calibration samples, the layer's input and its float output (after the Relu/Clip that
   follows it, when there is one) from the float model, and its input from the *quantized* model as it is
   after the earlier layers were tuned, so each layer makes up for the errors before it
   (``graph_runs.GraphRuns``: each node runs once, in stretches, never once per layer);
2. learn new weight codes in torch on the fixed grid (``finetune_optimize``: AdaRound chooses floor or
   ceiling per weight, AdaQuant moves weights, and with ``UpdateBias`` the bias, freely on the grid),
   minimizing the squared error to the float output;
3. write the codes back into the quantized model's weight initializer (integer codes, or grid values of
   the float weight a FixNeuron reads) and the bias when it changed (re-quantized on its own grid).

Scales, positions, zero points, code ranges and every quantizer's rounding mode are kept, so a model
refined for a target still meets the target's rules. Bounds: ``DataSize`` samples at most (memory: the
captured tensors of one layer plus the graph's frontier, times the samples), ``NumIterations`` steps per
layer, ``MaxSeconds`` in all (each layer gets an equal share of the time left; layers reached after it
are left alone, with a warning).
"""

from __future__ import annotations

__all__ = ["fast_finetune", "FastFinetuneResult", "LayerOutcome"]

import dataclasses
import functools
import logging
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import torch

from zonnx.errors import first_line
from zonnx.ir.io import to_ir, to_proto
from zonnx.quantization.calibration.readers import CalibrationError
from zonnx.quantization.finetune_options import FastFinetuneOptions
from zonnx.quantization.recovery.finetune_capture import segment_session
from zonnx.quantization.recovery.finetune_layers import Layer, find_layers
from zonnx.quantization.recovery.finetune_optimize import LayerData, LayerOp, TuneSettings, tune_layer
from zonnx.quantization.recovery.graph_runs import GraphRuns

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class LayerOutcome:
    """One tuned layer: plain MSE of its output against float before and after, what changed, the cost."""

    name: str
    op_type: str
    samples: int
    loss_before: float
    loss_after: float
    codes_changed: int
    codes_total: int
    iterations: int
    seconds: float
    kept: bool  # False: SelectiveUpdate kept the old weights (the loss did not go down)


@dataclasses.dataclass
class FastFinetuneResult:
    """What fast finetune did: per-layer outcomes, the layers left alone with reasons, the time spent."""

    algorithm: str
    samples: int
    iterations: int
    layers: list[LayerOutcome] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    capture_seconds: float = 0.0
    peak_layer_mb: float = 0.0  # largest captured data of one layer (inputs and target)

    @property
    def tuned(self) -> int:
        return sum(1 for o in self.layers if o.kept)

    def summary(self) -> str:
        """One line: layers tuned, loss before/after, time."""
        if not self.layers:
            return f"fast finetune ({self.algorithm}): no layer tuned ({len(self.skipped)} left alone)"
        ratios = [o.loss_after / o.loss_before for o in self.layers if o.kept and o.loss_before > 0]
        before = sum(o.loss_before for o in self.layers)
        after = sum(o.loss_after if o.kept else o.loss_before for o in self.layers)
        median = f"{statistics.median(ratios):.3f}" if ratios else "n/a"
        return (
            f"fast finetune ({self.algorithm}): {self.tuned} of {len(self.layers) + len(self.skipped)} layers "
            f"tuned on {self.samples} samples, layer MSE vs float summed {before:.4g} -> {after:.4g} "
            f"(median ratio {median}), up to {self.iterations} steps per layer, {self.seconds:.1f} s "
            f"({self.capture_seconds:.1f} s capturing, largest layer data {self.peak_layer_mb:.0f} MB)"
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"tuned": self.tuned}


def _samples(feeds: Sequence[Mapping[str, np.ndarray]]) -> int:
    """Samples in the feeds: the first axis of each feed's first array (1 for scalars)."""
    total = 0
    for feed in feeds:
        first = next(iter(feed.values()), None)
        total += int(np.shape(first)[0]) if first is not None and np.ndim(first) else 1
    return total


def _layer_data(
    layer: Layer, x_f: list[np.ndarray], y: list[np.ndarray], x_q: list[np.ndarray], drop: bool
) -> LayerData:
    """Concatenate the feeds' tensors on the first axis; pad convolution inputs with the node's pads."""

    def cat(arrays: list[np.ndarray]) -> torch.Tensor:
        a = np.concatenate([np.asarray(v, np.float32) for v in arrays], axis=0)
        if layer.kind == "conv":
            pads = layer.attrs["pads"]
            half = len(pads) // 2
            a = np.pad(a, [(0, 0), (0, 0)] + [(pads[i], pads[i + half]) for i in range(half)])
        return torch.from_numpy(np.ascontiguousarray(a))

    y_t = torch.from_numpy(
        np.ascontiguousarray(np.concatenate([np.asarray(v, np.float32) for v in y], axis=0))
    )
    return LayerData(cat(x_q), cat(x_f) if drop else None, y_t)


def _bytes(data: LayerData) -> int:
    tensors = [data.x_q, data.y] + ([data.x_f] if data.x_f is not None else [])
    return sum(t.numel() * t.element_size() for t in tensors)


def _check_shapes(op: LayerOp, data: LayerData, weight: np.ndarray, bias: np.ndarray | None) -> str | None:
    """Why the captured tensors do not fit the layer (None when they do)."""
    try:
        with torch.no_grad():
            out = op(data.x_q[:1], torch.from_numpy(weight), None if bias is None else torch.from_numpy(bias))
    except RuntimeError as e:
        return f"the captured input does not fit the layer ({first_line(e)})"
    if tuple(out.shape[1:]) != tuple(data.y.shape[1:]) or data.x_q.shape[0] != data.y.shape[0]:
        return f"output shape {tuple(out.shape)} differs from the float target's {tuple(data.y.shape)}"
    return None


def _write_back(layer: Layer, codes: np.ndarray, bias: np.ndarray | None, runner: GraphRuns) -> None:
    runner.set_initializer(layer.weight.write(codes))
    if bias is not None and layer.bias is not None:
        grid = layer.bias.grid
        stored = grid.nearest(bias) if grid is not None else bias
        runner.set_initializer(layer.bias.write(stored))


def fast_finetune(
    float_model: onnx.ModelProto | ir.Model,
    model: ir.Model,
    feeds: Sequence[Mapping[str, np.ndarray]],
    options: FastFinetuneOptions,
    *,
    ranges: Mapping[str, tuple[int, int]] | None = None,
) -> FastFinetuneResult:
    """Tune the weights of ``model`` (quantized, changed in place) towards ``float_model`` on ``feeds``.

    ``float_model`` is the prepared float model the quantized one was written from (same node names);
    ``ranges``: code range by float tensor name (the plan's), so restricted ranges are kept. Raises
    CalibrationError when there are fewer samples than one batch.
    """
    start = time.perf_counter()
    feeds = list(feeds)[: options.data_size]
    samples = _samples(feeds)
    if samples < options.batch_size or not feeds:
        raise CalibrationError(
            f"fast finetune needs at least {options.batch_size} calibration sample(s) (FastFinetune BatchSize "
            f"{options.batch_size}) and got {samples}: give more calibration data or lower BatchSize."
        )
    result = FastFinetuneResult(options.optim_algorithm, samples, options.num_iterations)
    float_ir = float_model if isinstance(float_model, ir.Model) else to_ir(float_model)
    layers, result.skipped = find_layers(float_ir, model, options.target_op_types, ranges)
    if not layers:
        first = next(iter(result.skipped.items()), None)
        logger.warning(
            "fast finetune: no layer to tune (%d %s node(s) left alone%s); the model is unchanged.",
            len(result.skipped),
            "/".join(options.target_op_types),
            f", e.g. {first[0]}: {first[1]}" if first else "",
        )
        return result
    seed = options.fixed_seed
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (2**31))
        logger.info("fast finetune: FixedSeed None, using seed %d", seed)
    drop = options.drop_ratio > 0
    opener = functools.partial(segment_session, threads=options.threads)
    float_runner = GraphRuns(
        to_proto(float_ir),
        feeds,
        opener,
        what="float model",
        wanted=[n for layer in layers for n in (layer.float_input, layer.float_target)],
    )
    quant_runner = GraphRuns(
        to_proto(model), feeds, opener, what="quantized model", wanted=[layer.quant_input for layer in layers]
    )
    deadline = start + options.max_seconds if options.max_seconds is not None else float("inf")
    threads = torch.get_num_threads()
    torch.set_num_threads(options.threads)
    try:
        for k, layer in enumerate(layers):
            now = time.perf_counter()
            if now >= deadline:
                for rest in layers[k:]:
                    result.skipped[rest.name] = f"MaxSeconds ({options.max_seconds:g} s) reached first"
                logger.warning(
                    "fast finetune: MaxSeconds %g s reached; %d of %d layers were not tuned (the result "
                    "depends on this machine's speed: MaxSeconds inf repeats on every run).",
                    options.max_seconds,
                    len(layers) - k,
                    len(layers),
                )
                break
            t0 = time.perf_counter()
            fl = float_runner.tensors([layer.float_input, layer.float_target])
            xq = quant_runner.tensors([layer.quant_input])[layer.quant_input]
            data = _layer_data(layer, fl[layer.float_input], fl[layer.float_target], xq, drop)
            result.capture_seconds += time.perf_counter() - t0
            result.peak_layer_mb = max(result.peak_layer_mb, _bytes(data) / 2**20)
            op = LayerOp(layer.kind, layer.attrs, layer.activation)
            current = layer.weight.codes()
            bias = layer.bias.values() if layer.bias is not None else None
            problem = _check_shapes(op, data, layer.weight.grid.values(current), bias)
            if problem:
                result.skipped[layer.name] = problem
                logger.debug("fast finetune: %s left alone: %s", layer.name, problem)
                continue
            settings = TuneSettings(
                options.optim_algorithm,
                options.num_iterations,
                float(options.learning_rate),
                options.batch_size,
                float(options.reg_param),
                tuple(options.beta_range),
                float(options.warm_start),
                float(options.drop_ratio),
                options.update_bias,
                seed + k,
            )
            tuned = tune_layer(
                op,
                data,
                layer.float_weight,
                layer.weight.grid,
                current,
                bias,
                layer.bias.grid if layer.bias is not None else None,
                settings,
                now + (deadline - now) / (len(layers) - k),
            )
            kept = not (options.selective_update and tuned.loss_after >= tuned.loss_before)
            if kept:
                _write_back(layer, tuned.codes, tuned.bias, quant_runner)
            outcome = LayerOutcome(
                layer.name,
                layer.node.op_type,
                data.samples,
                tuned.loss_before,
                tuned.loss_after,
                int(np.count_nonzero(tuned.codes != current)),
                int(current.size),
                tuned.iterations,
                tuned.seconds,
                kept,
            )
            result.layers.append(outcome)
            logger.debug(
                "fast finetune [%d/%d] %s %s: MSE %.4g -> %.4g, %d of %d codes changed, %d steps, %.2f s%s",
                k + 1,
                len(layers),
                outcome.op_type,
                outcome.name,
                outcome.loss_before,
                outcome.loss_after,
                outcome.codes_changed,
                outcome.codes_total,
                outcome.iterations,
                outcome.seconds,
                "" if kept else " (worse: kept the old weights)",
            )
            del data, fl, xq
    finally:
        torch.set_num_threads(threads)
    short = [o.name for o in result.layers if o.iterations < options.num_iterations]
    if short:
        logger.warning(
            "fast finetune: %d layer(s) stopped before NumIterations to stay within MaxSeconds %g s (e.g. %s); "
            "the result depends on this machine's speed: MaxSeconds inf repeats on every run.",
            len(short),
            options.max_seconds,
            short[0],
        )
    result.seconds = time.perf_counter() - start
    logger.info("%s", result.summary())
    return result
