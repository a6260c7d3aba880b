"""AdaRound and AdaQuant on one layer, in torch on the CPU, with the quantization grid held fixed.

A layer computes ``y = act(f(x, w, b))`` (``f`` a convolution, ``x @ W^T``/``x @ W`` + b, or a MatMul;
``act`` the float model's Relu/Clip after it, when there is one). The weight grid is
``w = (q - zp) * s`` with ``q`` in ``[qmin, qmax]``; ``s``, ``zp`` and the range never change. The
data are the layer input of the quantized model ``X_q``, of the float model ``X_f``, and the float
target ``Y``.

**AdaRound** (Nagel et al., 2020, arXiv:2004.10568) learns for every weight whether it rounds down or up::

    q(V) = clamp(floor(w_f / s) + zp + h(V), qmin, qmax)
    h(V) = clamp(sigmoid(V) * (zeta - gamma) + gamma, 0, 1),   zeta = 1.1, gamma = -0.1
    loss = mean_positions( sum_channels (act(f(x, w(V), b)) - Y)^2 ) + lambda * sum(1 - |2 h(V) - 1|^beta)

``V`` starts where ``h(V) = frac(w_f / s)`` (the soft weight is the float weight); the regularizer is
off for the first ``WarmStart`` fraction of steps, then ``beta`` falls linearly from ``BetaRange[0]`` to
``BetaRange[1]``, pushing every ``h`` to 0 or 1. The final code is ``floor(w_f/s) + zp + [V >= 0]``,
clipped: the floor or the ceiling of ``w_f/s``, so at most one step from round-to-nearest.

**AdaQuant** (Hubara et al., 2020, arXiv:2006.10518), weights only (scales fixed): the weight is learned
continuously in code units ``u = p / 100`` (start ``w_f / s``; ``p`` is what Adam moves, so a step moves
a weight by ``LearningRate / 100`` of a quantization step at most) through a straight-through fake
quantizer ``q = clamp(round(u) + zp, qmin, qmax)`` (gradient 1 inside the range), and with ``UpdateBias``
the bias as ``b = b_0 + d * rms(Y) / 1000`` (on its own grid, straight through, when it is quantized); the
loss is the reconstruction term alone. Final codes: ``clamp(rint(u) + zp)``; the bias is rounded on its
grid and kept only when it lowers the layer's loss beside the final codes (else ``b_0`` stays): on a
coarse grid the straight-through bias moves nothing until it jumps a whole step, so the weights never
learned around the bias it lands on (PP-OCRv4 rec's first convolution for dpu-b4096, 8-bit power-of-two
biases: its loss rose from 0.064 to 0.110 with the learned bias, and fell to 0.039 without it).

Each step takes ``BatchSize`` random samples; with ``DropRatio`` p, every input element comes from
``X_f`` instead of ``X_q`` with probability p (QDrop, Wei et al., 2022). The optimizer is Adam with
``LearningRate``. The reported losses are the plain mean
squared error over all samples with ``X_q`` only: before (the model's current codes) and after.
"""

from __future__ import annotations

__all__ = ["LayerOp", "LayerData", "TuneSettings", "TuneResult", "tune_layer", "layer_mse"]

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from zonnx.quantization.recovery.finetune_layers import Grid

_ZETA, _GAMMA = 1.1, -0.1
_EVAL_CHUNK = 8  # samples per forward pass when measuring the loss
#: AdaQuant learns weights in 1/_STEP_UNITS of a quantization step (LearningRate 0.1 -> 0.001 step per step).
_STEP_UNITS = 100.0


@dataclasses.dataclass(frozen=True)
class LayerOp:
    """The layer's computation: ``kind`` conv/gemm/matmul, its attributes, and the activation after it."""

    kind: str
    attrs: dict
    activation: tuple[str, float, float] | None = None

    def __call__(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if self.kind == "conv":
            conv = (F.conv1d, F.conv2d, F.conv3d)[w.dim() - 3]
            y = conv(x, w, b, self.attrs["strides"], 0, self.attrs["dilations"], self.attrs["group"])
        elif self.kind == "gemm":
            y = F.linear(x, w if self.attrs["trans_b"] else w.t(), b)
        else:
            y = torch.matmul(x, w)
        if self.activation is not None:
            _, lo, hi = self.activation
            y = torch.clamp(y, min=None if math.isinf(lo) else lo, max=None if math.isinf(hi) else hi)
        return y

    @property
    def channel_dim(self) -> int:
        return 1 if self.kind == "conv" else -1


@dataclasses.dataclass
class LayerData:
    """The samples of one layer (first axis): quantized and float inputs (conv inputs padded) and target."""

    x_q: torch.Tensor
    x_f: torch.Tensor | None
    y: torch.Tensor

    @property
    def samples(self) -> int:
        return int(self.x_q.shape[0])


@dataclasses.dataclass(frozen=True)
class TuneSettings:
    """What one layer's optimization uses (see FastFinetuneOptions for the meaning of each)."""

    algorithm: str
    iterations: int
    learning_rate: float
    batch_size: int
    reg_param: float
    beta_range: tuple[float, float]
    warm_start: float
    drop_ratio: float
    update_bias: bool
    seed: int


@dataclasses.dataclass
class TuneResult:
    """New weight codes (and bias values when learned), plain MSE before/after, steps run and seconds."""

    codes: np.ndarray
    bias: np.ndarray | None
    loss_before: float
    loss_after: float
    iterations: int
    seconds: float


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(a, dtype=np.float32, order="C"))  # a writable copy


def layer_mse(op: LayerOp, data: LayerData, w: torch.Tensor, b: torch.Tensor | None) -> float:
    """Mean squared error of ``op(X_q)`` against the target over all samples."""
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, data.samples, _EVAL_CHUNK):
            diff = op(data.x_q[i : i + _EVAL_CHUNK], w, b) - data.y[i : i + _EVAL_CHUNK]
            total += float(torch.sum(diff.double() ** 2))
            count += diff.numel()
    return total / max(count, 1)


def _recon(pred: torch.Tensor, target: torch.Tensor, channel_dim: int) -> torch.Tensor:
    return (pred - target).pow(2).sum(channel_dim).mean()


def _h(v: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.sigmoid(v) * (_ZETA - _GAMMA) + _GAMMA, 0.0, 1.0)


def _ste_round(u: torch.Tensor) -> torch.Tensor:
    return u + (torch.round(u) - u).detach()


def _fake_quant(x: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor, grid: Grid) -> torch.Tensor:
    q = torch.clamp(_ste_round(x / scale) + zp, grid.qmin, grid.qmax)
    return (q - zp) * scale


class _Batches:
    """Random batches of samples, with input elements dropped to the float input (QDrop)."""

    def __init__(self, data: LayerData, settings: TuneSettings) -> None:
        self.data, self.settings = data, settings
        self.gen = torch.Generator().manual_seed(settings.seed)

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        d, s = self.data, self.settings
        idx = torch.randint(d.samples, (min(s.batch_size, d.samples),), generator=self.gen)
        x = d.x_q[idx]
        if d.x_f is not None and s.drop_ratio > 0:
            mask = torch.rand(x.shape, generator=self.gen) < s.drop_ratio
            x = torch.where(mask, d.x_f[idx], x)
        return x, d.y[idx]


def _optimize(
    params: list[torch.Tensor],
    loss_fn: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
    batches: _Batches,
    settings: TuneSettings,
    deadline: float,
) -> int:
    """Adam over ``params`` for up to ``settings.iterations`` steps or until ``deadline``; steps run."""
    opt = torch.optim.Adam(params, lr=settings.learning_rate)
    for step in range(settings.iterations):
        if time.perf_counter() > deadline:
            return step
        x, y = batches()
        opt.zero_grad(set_to_none=True)
        loss_fn(step, x, y).backward()
        opt.step()
    return settings.iterations


def tune_layer(
    op: LayerOp,
    data: LayerData,
    float_weight: np.ndarray,
    grid: Grid,
    current_codes: np.ndarray,
    bias: np.ndarray | None,
    bias_grid: Grid | None,
    settings: TuneSettings,
    deadline: float,
) -> TuneResult:
    """Learn new weight codes (and, for AdaQuant with UpdateBias, a new bias) for one layer."""
    start = time.perf_counter()
    scale = _t(np.broadcast_to(grid.scale, float_weight.shape))
    zp = _t(np.broadcast_to(grid.zero_point, float_weight.shape))
    b0 = _t(bias) if bias is not None else None
    w_now = _t(grid.values(current_codes))
    before = layer_mse(op, data, w_now, b0)
    batches = _Batches(data, settings)
    ratio = _t(float_weight) / scale
    if settings.algorithm == "adaround":
        # base + h(V) in code units relative to zp; weights whose floor and ceiling clip to one code are
        # frozen (base = that code, V far negative so h = 0 with zero gradient): no clamp in the loop
        floor = torch.floor(ratio)
        lo, hi = grid.qmin - zp, grid.qmax - zp
        frozen = (floor < lo) | (floor >= hi)
        base = torch.where(frozen, torch.clamp(floor, lo, hi), floor)
        rest = ratio - floor  # in [0, 1): V is finite since gamma < 0 < 1 < zeta
        v = torch.where(frozen, torch.full_like(rest, -100.0), torch.log((rest - _GAMMA) / (_ZETA - rest)))
        v.requires_grad_(True)
        warm = int(settings.warm_start * settings.iterations)
        beta0, beta1 = settings.beta_range

        def loss_fn(step: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            h = _h(v)
            loss = _recon(op(x, (base + h) * scale, b0), y, op.channel_dim)
            if step >= warm and settings.reg_param > 0:
                t = (step - warm) / max(settings.iterations - warm, 1)
                beta = beta1 + (beta0 - beta1) * (1 - t)
                loss = loss + settings.reg_param * torch.sum(1 - torch.abs(2 * h - 1).pow(beta))
            return loss

        steps = _optimize([v], loss_fn, batches, settings, deadline)
        with torch.no_grad():
            codes = base + (v >= 0).float() + zp
        new_bias = None
    else:
        p = (ratio * _STEP_UNITS).requires_grad_(True)
        learn_bias = settings.update_bias and b0 is not None
        unit = float(torch.sqrt(torch.mean(data.y.double() ** 2))) / 1000 or 1e-6
        d = torch.zeros_like(b0).requires_grad_(True) if learn_bias else None
        if learn_bias and bias_grid is not None:
            b_scale = _t(np.broadcast_to(bias_grid.scale, b0.shape))
            b_zp = _t(np.broadcast_to(bias_grid.zero_point, b0.shape))

        def current_bias() -> torch.Tensor | None:
            if d is None:
                return b0
            b = b0 + d * unit
            return _fake_quant(b, b_scale, b_zp, bias_grid) if bias_grid is not None else b

        def loss_fn(step: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            q = torch.clamp(_ste_round(p / _STEP_UNITS) + zp, grid.qmin, grid.qmax)
            return _recon(op(x, (q - zp) * scale, current_bias()), y, op.channel_dim)

        steps = _optimize([p] + ([d] if d is not None else []), loss_fn, batches, settings, deadline)
        with torch.no_grad():
            codes = torch.clamp(torch.round(p / _STEP_UNITS) + zp, grid.qmin, grid.qmax)
            new_bias = None
            if d is not None:
                b = (b0 + d * unit).numpy().astype(np.float64)
                new_bias = (
                    bias_grid.values(bias_grid.nearest(b)) if bias_grid is not None else b.astype(np.float32)
                )
    codes_np = codes.numpy().astype(np.int64)
    w_after = _t(grid.values(codes_np))
    after = layer_mse(op, data, w_after, b0)
    if new_bias is not None:  # the learned bias stays only when it lowers the loss beside the new weights
        with_bias = layer_mse(op, data, w_after, _t(new_bias))
        if with_bias < after:
            after = with_bias
        else:
            new_bias = None
    return TuneResult(codes_np, new_bias, before, after, steps, time.perf_counter() - start)
