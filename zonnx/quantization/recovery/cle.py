"""Cross-layer equalization (Nagel et al. 2019, data-free quantization): balance channel ranges of two layers.

A *pair* is ``L1 -> A -> L2``: L1 and L2 are Conv (any group, depthwise included), Gemm (transA=0) or
MatMul with a constant 2-D weight, and A is nothing or one activation that commutes with a positive
per-channel scale, ``A(x / s) = A(x) / s``. Scaling L1's output channel i by ``1 / s_i`` and L2's input
channel i by ``s_i`` then leaves the function unchanged::

    W1'[i] = W1[i] / s_i      b1'[i] = b1[i] / s_i      W2'[:, i] = W2[:, i] * s_i

With the per-channel ranges ``r1_i = max |W1[i]|`` (and ``|b1_i|`` too when ``CLEScaleAppendBias``) and
``r2_i = max |W2[:, i]|``::

    s_i = sqrt(r1_i * r2_i) / r2_i        =>   r1_i / s_i = r2_i * s_i = sqrt(r1_i * r2_i)

so both layers see the same range on channel i, which is what per-tensor weight quantization needs
(depthwise convolutions have widely spread channel ranges). ``s_i = 1`` where either range is 0. One
*step* equalizes every pair once in graph order; in a chain L1 -> L2 -> L3 the middle layer is rescaled
by both of its pairs, so more steps (``CLESteps``, vai_q_onnx default 1) move closer to the balance.

The bias is left out of ``r1`` by default (``CLEScaleAppendBias`` False; vai_q_onnx's default is True): a
bias is quantized on its own grid, and a folded BatchNorm bias larger than its weight row made the balance
shrink that row below the weights' own balance point. Measured for dpu-b4096 (power-of-two per-tensor,
MinMSE, 4 steps, logits SQNR on 450 held-out digits): zoo ``digits_cnn`` 32.80 dB plain, 32.24 with the
bias counted, 32.81 without; a MobileNetV2 trained on the same digits 18.08, 17.79, 18.41 (AVX-512 VNNI
host). Which balance wins depends on the weights: the ``digits_cnn`` trained on an AVX2 host (torch's
training differs across CPUs) gives 30.69 plain and without the bias, 31.36 with it.

Channel axes: Conv weights ``[M, C/g, k...]`` (output channel = row, input channel i = column i % (C/g) of
the rows of group i // (C/g)); Gemm B ``[K, N]`` (``[N, K]`` when transB=1) and MatMul W ``[K, N]``.
Conv pairs with Conv, Gemm/MatMul with Gemm/MatMul (the channel is axis 1, resp. the last axis).

Power-of-two weight grids (``power_of_two=True``; dpu-b4096 and every PowerOfTwoMethod / Vitis format).
A per-tensor grid's step is a power of two, ``step(W) = 2^ceil(log2(max |W| / 127))``, so shrinking a
tensor's largest value moves nothing until it crosses a power of two. The relative noise that channel i
gets from both layers is ``step1 * s_i / r1_i`` and ``step2 / (r2_i * s_i)``; the best ``s_i`` makes them
equal, and the sum of their squares is then ``2 * step1 * step2 / (r1_i * r2_i)``. Equalization can therefore only
help when it lowers that product, and the smallest product any ``s`` reaches is
``2^ceil(log2(max_i r1_i r2_i / 127^2))``. A pair whose product is already that small is left as it is
(counted in ``CLERecord.kept_pow2``): equalizing it would trade one layer's precision for the other's and
move the activation grid between them at random. Measured (dpu-b4096 MinMSE, logits SQNR on 450
held-out digits, AMD Zen 3 host's trained networks): plain CLE lowered zoo ``digits_cnn`` 32.51 -> 31.31
dB and ``mobilenetv2_digits`` 20.61 -> 20.08 dB; digits_cnn's one pair and the MobileNetV2 pair that
cost it 0.5 dB are such pairs, and with the rule the two read 32.51 and 20.62 dB. Otherwise the
two steps are chosen with product P (the split whose scales have a geometric mean closest to 1, so the
activations keep their magnitude) and ``s_i = sqrt(r1_i * step2 / (r2_i * step1))``, which puts both
layers' largest values just under their grids' limits.

Activations, the choice made here:

- accepted: none, Relu, LeakyRelu, PRelu (positively homogeneous for any slope shape: both branches are
  linear), Clip with min 0 and no max (a Relu);
- refused, with the reason: Clip with a finite max, e.g. ReLU6 = Clip(0, 6). ``Clip(x / s, 0, 6) * s`` is
  ``Clip(x, 0, 6 s)``, a per-channel bound ONNX Clip cannot hold, so equalizing through it changes the
  model. Vitis AI replaces ReLU6 by ReLU before CLE (``replace_relu6``; vai_q_onnx ``ReplaceClip6Relu``);
  zonnx does so only when ``ReplaceClip6Relu=True`` is given (see ``relu6.py``), a change of the float
  function the user opts into. An exact rule was tried and dropped: a channel whose input to Clip provably
  stays below ``6 min(1, s_i)`` may be scaled (a data-free bound exists when L1 reads another ReLU6:
  ``b_i + 6 * sum(max(W1[i], 0))``), but on a MobileNetV2 trained on digits that bound let 185 of the 7136
  channels of the 17 depthwise -> ReLU6 -> projection pairs move, and equalizing those few alone lowered
  the held-out logits SQNR (18.41 -> 17.83 dB).

A pair is refused (reason recorded) when the tensor between the layers (or after the activation) has more
than one reader or is a graph output, or a weight or bias is shared with another node, is not a float
constant, or the channel counts differ.
"""

from __future__ import annotations

__all__ = ["CLERecord", "Pair", "equalize", "find_pairs", "DEFAULT_STEPS"]

import dataclasses
import logging
import math
from typing import Literal

import numpy as np
import onnx_ir as ir

from zonnx.passes.fusion.matching import const_array, label

logger = logging.getLogger(__name__)

#: vai_q_onnx's default number of equalization steps (``CLESteps``).
DEFAULT_STEPS = 1
_ACTIVATIONS = frozenset({"Relu", "LeakyRelu", "PRelu", "Clip"})
_LINEAR = frozenset({"Conv", "Gemm", "MatMul"})
_FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16})
Kind = Literal["conv", "gemm", "matmul"]


@dataclasses.dataclass
class CLERecord:
    """What ``equalize`` did: pairs equalized, steps run, and the spread of channel ranges before/after.

    ``kept_pow2``: pairs left unchanged because equalizing could not lower the product of their
    power-of-two weight steps (counted once per pair, in the first step). ``range_ratio_*``: the largest max/min ratio of output-channel weight ranges over the equalized
    weights; ``weight_sqnr_*``: their mean SQNR (dB) under int8 symmetric per-tensor quantization.
    """

    pairs: int = 0
    steps: int = 0
    skipped: list[str] = dataclasses.field(default_factory=list)
    kept_pow2: int = 0
    range_ratio_before: float = 0.0
    range_ratio_after: float = 0.0
    weight_sqnr_before: float = 0.0
    weight_sqnr_after: float = 0.0

    def summary(self) -> str:
        if not self.pairs:
            return "cross-layer equalization: no equalizable pair; model unchanged"
        kept = (
            f"; {self.kept_pow2} of them left as they were (equalizing could not make their power-of-two "
            "weight steps finer)"
            if self.kept_pow2
            else ""
        )
        return (
            f"cross-layer equalization: {self.pairs} pairs x {self.steps} step(s){kept}; worst channel range "
            f"ratio {self.range_ratio_before:.3g} -> {self.range_ratio_after:.3g}; mean int8 per-tensor weight "
            f"SQNR {self.weight_sqnr_before:.2f} -> {self.weight_sqnr_after:.2f} dB"
        )


@dataclasses.dataclass(frozen=True)
class _Layer:
    node: ir.Node
    kind: Kind
    weight: ir.Value
    bias: ir.Value | None

    @property
    def trans_b(self) -> bool:
        return self.kind == "gemm" and bool(self.node.attributes.get_int("transB", 0))

    @property
    def group(self) -> int:
        return self.node.attributes.get_int("group", 1) if self.kind == "conv" else 1


@dataclasses.dataclass(frozen=True)
class Pair:
    """``first -> act -> second``: two linear layers with at most one activation between them."""

    first: _Layer
    act: ir.Node | None
    second: _Layer


def _is_float_const(value: ir.Value | None) -> bool:
    return (
        value is not None
        and value.is_initializer()
        and not value.is_graph_input()
        and (value.dtype is None or value.dtype in _FLOATS)
        and const_array(value) is not None
    )


def _layer(node: ir.Node) -> _Layer | None:
    """The node as a linear layer with a constant float weight, else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in _LINEAR or len(node.inputs) < 2:
        return None
    weight = node.inputs[1]
    if not _is_float_const(weight):
        return None
    ndim = const_array(weight).ndim
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if node.op_type == "Conv":
        return _Layer(node, "conv", weight, bias) if ndim >= 3 else None
    if ndim != 2:
        return None
    if node.op_type == "Gemm":
        return None if node.attributes.get_int("transA", 0) else _Layer(node, "gemm", weight, bias)
    return _Layer(node, "matmul", weight, None)


def _out_rows(layer: _Layer, w: np.ndarray) -> np.ndarray:
    """The weight as [output channels, everything else]."""
    if layer.kind == "conv":
        return w.reshape(w.shape[0], -1)
    return w if layer.trans_b else w.T


def _scale_out(layer: _Layer, w: np.ndarray, f: np.ndarray) -> np.ndarray:
    if layer.kind == "conv":
        return w * f.reshape((-1,) + (1,) * (w.ndim - 1))
    return w * f[:, None] if layer.trans_b else w * f[None, :]


def _in_ranges(layer: _Layer, w: np.ndarray) -> np.ndarray:
    a = np.abs(w)
    if layer.kind == "conv":
        m, cpg, g = w.shape[0], w.shape[1], layer.group
        per = a.reshape(m, cpg, -1).max(axis=2)  # [M, C/g]
        return per.reshape(g, m // g, cpg).max(axis=1).reshape(-1)
    return a.max(axis=0) if layer.trans_b else a.max(axis=1)


def _scale_in(layer: _Layer, w: np.ndarray, f: np.ndarray) -> np.ndarray:
    if layer.kind == "conv":
        m, cpg, g = w.shape[0], w.shape[1], layer.group
        grid = np.broadcast_to(f.reshape(g, 1, cpg), (g, m // g, cpg)).reshape(m, cpg)
        return w * grid.reshape(grid.shape + (1,) * (w.ndim - 2))
    return w * f[None, :] if layer.trans_b else w * f[:, None]


def _out_channels(layer: _Layer, w: np.ndarray) -> int:
    return _out_rows(layer, w).shape[0]


def _in_channels(layer: _Layer, w: np.ndarray) -> int:
    if layer.kind == "conv":
        return w.shape[1] * layer.group
    return w.shape[1] if layer.trans_b else w.shape[0]


def _bias_per_channel(b: np.ndarray, n: int) -> np.ndarray:
    """A bias broadcast on the last axis as [n] values (the largest magnitude over other axes)."""
    full = np.broadcast_to(b, b.shape[:-1] + (n,)) if b.ndim else np.broadcast_to(b, (n,))
    return np.abs(full).reshape(-1, n).max(axis=0)


def _scaled_bias(b: np.ndarray, f: np.ndarray) -> np.ndarray:
    n = f.shape[0]
    full = np.broadcast_to(b, b.shape[:-1] + (n,)) if b.ndim else np.broadcast_to(b, (n,))
    return full * f


def _next(value: ir.Value) -> tuple[ir.Node | None, str | None]:
    """The only reader of ``value``, or why there is none (None, None when nothing reads it)."""
    readers = list(dict.fromkeys(value.consumers()))
    if not readers:
        return None, None
    if value.is_graph_output():
        return None, f"{value.name!r} is a graph output"
    if len(readers) != 1 or len(value.uses()) != 1:
        return None, f"{value.name!r} has {len(value.uses())} readers"
    return readers[0], None


def _activation_problem(node: ir.Node) -> str | None:
    """Why an activation does not commute with a positive per-channel scale (None when it does)."""
    if node.op_type != "Clip":
        return None
    ins = list(node.inputs) + [None, None]
    lo = const_array(ins[1]) if ins[1] is not None else None
    hi = const_array(ins[2]) if ins[2] is not None else None
    if ins[1] is None or lo is None or lo.size != 1 or float(lo.reshape(())) != 0.0:
        return f"{label(node)}: Clip without min 0 is not scale-equivariant"
    if ins[2] is not None and (hi is None or math.isfinite(float(hi.reshape(-1)[0]))):
        bound = "?" if hi is None else f"{float(hi.reshape(-1)[0]):g}"
        return (
            f"{label(node)}: Clip(0, {bound}) is not scale-equivariant (the bound would have to differ per "
            "channel); extra_options ReplaceClip6Relu=True replaces Clip(0, 6) by Relu first"
        )
    return None


def _shared(values: list[ir.Value | None], node: ir.Node) -> str | None:
    for v in values:
        if v is None:
            continue
        if v.is_graph_output() or any(u.node is not node for u in v.uses()):
            return f"{label(node)}: {v.name!r} is shared with another node"
        if not _is_float_const(v):
            return f"{label(node)}: {v.name!r} is not a float constant"
    return None


def find_pairs(model: ir.Model) -> tuple[list[Pair], list[str]]:
    """Equalizable pairs in graph order, and the reasons candidate pairs were refused."""
    pairs: list[Pair] = []
    refused: list[str] = []
    for node in model.graph:
        first = _layer(node)
        if first is None:
            continue
        reader, why = _next(node.outputs[0])
        act = None
        if reader is not None and reader.op_type in _ACTIVATIONS and reader.domain in ("", "ai.onnx"):
            act = reader
            reader, why = _next(act.outputs[0])
        if reader is None:
            users = [u.node for v in ((act or node).outputs[0],) for u in v.uses()]
            if why and any(_layer(u) is not None for u in users):
                refused.append(f"{label(node)}: {why}")
            continue
        second = _layer(reader)
        if second is None or reader.inputs[0] is not (act or node).outputs[0]:
            continue
        problem = _activation_problem(act) if act is not None else None
        if problem is None and (first.kind == "conv") != (second.kind == "conv"):
            problem = f"{label(node)} -> {label(reader)}: channel axes differ (Conv with {second.kind})"
        problem = problem or _shared([first.weight, first.bias], node) or _shared([second.weight], reader)
        if problem is None:
            w1, w2 = const_array(first.weight), const_array(second.weight)
            n1, n2 = _out_channels(first, w1), _in_channels(second, w2)
            if n1 != n2:
                problem = f"{label(node)} -> {label(reader)}: {n1} output channels feed {n2} input channels"
        if problem is not None:
            refused.append(problem)
            continue
        pairs.append(Pair(first, act, second))
    return pairs, refused


def _array(value: ir.Value) -> np.ndarray:
    return np.asarray(const_array(value), dtype=np.float64)


def _store(value: ir.Value, array: np.ndarray) -> None:
    dtype = const_array(value).dtype
    value.const_value = ir.tensor(array.astype(dtype), name=value.name)


def _pow2_step(r: float) -> float:
    """The int8 power-of-two grid step whose range holds ``r``: ``2^ceil(log2(r / 127))``."""
    return 2.0 ** math.ceil(math.log2(r / 127.0))


def _pow2_steps(r1: np.ndarray, r2: np.ndarray, ok: np.ndarray) -> tuple[float, float] | None:
    """The two grid steps equalization should aim at, or None when it cannot lower their product.

    The product aimed at, ``2^p``, is the smallest any scale reaches; of its splits ``2^k * 2^(p-k)``, the
    one whose scales have a geometric mean closest to 1 (ties: the finer first step). Channels left
    unscaled (a zero range) must fit both grids as they are, which bounds k from both sides.
    """
    log_p = math.ceil(math.log2(float((r1[ok] * r2[ok]).max()) / 127.0**2))
    if 2.0**log_p >= _pow2_step(float(r1.max())) * _pow2_step(float(r2.max())):
        return None
    # log2 of the scales' geometric mean squared is centre + log_p - 2k: nearest zero at k = (centre + log_p) / 2
    centre = float(np.mean(np.log2(r1[ok] / r2[ok])))
    lo = math.ceil(math.log2(r1[~ok].max() / 127)) if (r1[~ok] > 0).any() else -math.inf
    hi = log_p - math.ceil(math.log2(r2[~ok].max() / 127)) if (r2[~ok] > 0).any() else math.inf
    k1 = min(max(math.ceil((centre + log_p) / 2 - 0.5), lo), hi)
    if k1 < lo:
        return None
    return 2.0**k1, 2.0 ** (log_p - k1)


def _equalize_pair(pair: Pair, append_bias: bool, power_of_two: bool) -> bool:
    """Equalize one pair in place; False when a power-of-two pair is left as it is (no finer steps)."""
    first, second = pair.first, pair.second
    w1, w2 = _array(first.weight), _array(second.weight)
    b1 = _array(first.bias) if first.bias is not None else None
    r1 = np.abs(_out_rows(first, w1)).max(axis=1)
    if append_bias and b1 is not None:
        r1 = np.maximum(r1, _bias_per_channel(b1, r1.shape[0]))
    r2 = _in_ranges(second, w2)
    ok = (r1 > 0) & (r2 > 0)
    if not ok.any():
        return False
    target = 1.0
    if power_of_two:
        steps = _pow2_steps(r1, r2, ok)
        if steps is None:
            return False
        target = steps[1] / steps[0]
    s = np.where(ok, np.sqrt(np.where(ok, r1, 1.0) / np.where(ok, r2, 1.0) * target), 1.0)
    _store(first.weight, _scale_out(first, w1, 1.0 / s))
    if b1 is not None:
        _store(first.bias, _scaled_bias(b1, 1.0 / s))
    _store(second.weight, _scale_in(second, w2, s))
    return True


def _range_ratio(layer: _Layer) -> float:
    r = np.abs(_out_rows(layer, _array(layer.weight))).max(axis=1)
    r = r[r > 0]
    return float(r.max() / r.min()) if r.size else 1.0


def _weight_sqnr(w: np.ndarray) -> float:
    """SQNR (dB) of ``w`` under int8 symmetric per-tensor quantization (scale max|w| / 127)."""
    scale = float(np.abs(w).max()) / 127.0
    if scale == 0:
        return math.inf
    err = w - np.clip(np.rint(w / scale), -128, 127) * scale
    noise = float(np.square(err).sum())
    return math.inf if noise == 0 else 10.0 * math.log10(float(np.square(w).sum()) / noise)


def _measure(layers: list[_Layer]) -> tuple[float, float]:
    ratios = [_range_ratio(layer) for layer in layers]
    sqnrs = [_weight_sqnr(_array(layer.weight)) for layer in layers]
    finite = [s for s in sqnrs if math.isfinite(s)]
    return max(ratios, default=1.0), (sum(finite) / len(finite) if finite else math.inf)


def equalize(
    model: ir.Model, *, steps: int = DEFAULT_STEPS, append_bias: bool = False, power_of_two: bool = False
) -> CLERecord:
    """Equalize every pair ``steps`` times in place; a model without pairs is left unchanged (warning).

    ``power_of_two``: the weights get power-of-two per-tensor grids; a pair is equalized only when that
    makes the product of its two grid steps smaller (module docstring).
    """
    pairs, refused = find_pairs(model)
    record = CLERecord(skipped=refused)
    for reason in refused:
        logger.info("cross-layer equalization: %s", reason)
    if not pairs:
        logger.warning(
            "cross-layer equalization: no equalizable Conv/Gemm/MatMul pair in the model%s; nothing changed",
            f" ({len(refused)} refused, e.g. {refused[0]})" if refused else "",
        )
        return record
    layers = list({x.node: x for p in pairs for x in (p.first, p.second)}.values())
    record.range_ratio_before, record.weight_sqnr_before = _measure(layers)
    for step in range(steps):
        for pair in pairs:
            moved = _equalize_pair(pair, append_bias, power_of_two)
            record.kept_pow2 += int(power_of_two and step == 0 and not moved)
    record.pairs, record.steps = len(pairs), steps
    record.range_ratio_after, record.weight_sqnr_after = _measure(layers)
    return record
