"""Strict parsing of ``extra_options["FastFinetune"]``: Vitis AI's fast-finetune keys plus zonnx's own
(``MaxSeconds``, ``Threads``), every value typed and range-checked, unknown keys refused with a close
match, Vitis AI keys zonnx does not implement refused by name.
"""

from __future__ import annotations

__all__ = ["FastFinetuneOptions", "parse_fast_finetune", "FAST_FINETUNE_KEYS"]

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from zonnx.errors import OptionError, did_you_mean, type_names


@dataclasses.dataclass(frozen=True)
class FastFinetuneOptions:
    """``extra_options["FastFinetune"]`` (Vitis AI's keys and defaults unless noted).

    Attributes:
        optim_algorithm: ``OptimAlgorithm``, "adaround" (learned up/down rounding) or "adaquant"
            (weights learned continuously on the grid) (default "adaround").
        num_iterations: ``NumIterations``, optimizer steps per layer (1000).
        learning_rate: ``LearningRate``, Adam step size on AdaRound's rounding variables, and on
            AdaQuant's weights in 1/100 of a quantization step (0.1).
        batch_size: ``BatchSize``, calibration samples per step (1).
        data_size: ``DataSize``, calibration samples kept and used at most (zonnx default 32; Vitis uses
            all): it bounds memory, as every layer's input and output are held for these samples.
        fixed_seed: ``FixedSeed``, seed of the sample order and input dropping (zonnx default 0 so a run
            repeats; None draws a fresh seed and logs it).
        reg_param: ``RegParam``, AdaRound's rounding regularizer weight lambda (0.01).
        beta_range: ``BetaRange``, AdaRound's regularizer exponent annealed from the first to the
            second value ((20, 2)).
        warm_start: ``WarmStart``, fraction of the steps before the regularizer starts (0.2).
        drop_ratio: ``DropRatio``, probability that an input element is taken from the float model
            instead of the quantized one during a step (QDrop) (0.5).
        update_bias: ``UpdateBias``, AdaQuant also learns the bias (True); AdaRound keeps it.
        selective_update: ``SelectiveUpdate``, keep a layer's new weights only when its loss on the
            samples went down (False).
        target_op_types: ``TargetOpType``, op types tuned (Conv, Gemm, MatMul).
        max_seconds: ``MaxSeconds`` (zonnx), wall-time bound of the whole fine-tuning; layers reached
            after it keep their weights, and layers tuned under it may stop early, so a run that reaches
            it depends on the machine's speed (1800; ``inf`` or None: no bound, the same weights on
            every run).
        threads: ``Threads`` (zonnx), torch and ORT CPU threads while tuning (1).
    """

    optim_algorithm: str = "adaround"
    num_iterations: int = 1000
    learning_rate: float = 0.1
    batch_size: int = 1
    data_size: int = 32
    fixed_seed: int | None = 0
    reg_param: float = 0.01
    beta_range: tuple[float, float] = (20.0, 2.0)
    warm_start: float = 0.2
    drop_ratio: float = 0.5
    update_bias: bool = True
    selective_update: bool = False
    target_op_types: tuple[str, ...] = ("Conv", "Gemm", "MatMul")
    max_seconds: float | None = 1800.0
    threads: int = 1


#: FastFinetune key -> (field name, expected python type(s)).
FAST_FINETUNE_KEYS: dict[str, tuple[str, type | tuple[type, ...]]] = {
    "OptimAlgorithm": ("optim_algorithm", str),
    "NumIterations": ("num_iterations", int),
    "LearningRate": ("learning_rate", (int, float)),
    "BatchSize": ("batch_size", int),
    "DataSize": ("data_size", int),
    "FixedSeed": ("fixed_seed", (int, type(None))),
    "RegParam": ("reg_param", (int, float)),
    "BetaRange": ("beta_range", (list, tuple)),
    "WarmStart": ("warm_start", (int, float)),
    "DropRatio": ("drop_ratio", (int, float)),
    "UpdateBias": ("update_bias", bool),
    "SelectiveUpdate": ("selective_update", bool),
    "TargetOpType": ("target_op_types", (list, tuple)),
    "MaxSeconds": ("max_seconds", (int, float, type(None))),
    "Threads": ("threads", int),
    "OptimDevice": ("", str),
    "InferDevice": ("", str),
}
#: Vitis AI FastFinetune keys zonnx does not implement.
_FT_UNSUPPORTED = ("NumBatches", "LRAdjust", "EarlyStop", "LogPeriod", "OutputQDQ", "DynamicBatch",
                   "OutputIndex", "RefModelPath")  # fmt: skip
_FT_OPS = ("Conv", "Gemm", "MatMul")


def parse_fast_finetune(options: Mapping[str, Any]) -> FastFinetuneOptions:
    """Validate ``extra_options["FastFinetune"]``: every key known, every value typed and in range."""
    values: dict[str, Any] = {}
    for key, value in options.items():
        where = f"extra_options['FastFinetune'][{key!r}]"
        if key in _FT_UNSUPPORTED:
            raise OptionError(f"{where}: a Vitis AI option zonnx does not implement; remove the key.")
        if key not in FAST_FINETUNE_KEYS:
            known = sorted(FAST_FINETUNE_KEYS)
            raise OptionError(
                f"extra_options['FastFinetune']: unknown key {key!r}.{did_you_mean(key, known)} "
                f"Known keys: {', '.join(known)}."
            )
        field, types = FAST_FINETUNE_KEYS[key]
        tupled = types if isinstance(types, tuple) else (types,)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in tupled):
            raise OptionError(f"{where} = {value!r}: expected {type_names(types)}.")
        if key in ("OptimDevice", "InferDevice"):
            if value.lower() != "cpu":
                raise OptionError(f"{where} = {value!r}: zonnx fine-tunes on the CPU only; use 'cpu'.")
            continue
        values[field] = tuple(value) if isinstance(value, list) else value
    opts = FastFinetuneOptions(**values)
    algo = opts.optim_algorithm.lower()
    if algo not in ("adaround", "adaquant"):
        raise OptionError(
            f"extra_options['FastFinetune']['OptimAlgorithm'] = {opts.optim_algorithm!r}: use 'adaround' or "
            f"'adaquant'.{did_you_mean(algo, ['adaround', 'adaquant'])}"
        )
    if algo == "adaround" and options.get("UpdateBias") is True:
        raise OptionError(
            "extra_options['FastFinetune']['UpdateBias'] = True: AdaRound only chooses weight rounding and "
            "keeps the bias; use OptimAlgorithm 'adaquant' to learn the bias."
        )
    _ft_check(opts)
    return dataclasses.replace(opts, optim_algorithm=algo, beta_range=tuple(map(float, opts.beta_range)))


def _ft_check(opts: FastFinetuneOptions) -> None:
    """Range checks of the FastFinetune values (one OptionError naming the key)."""
    key = "extra_options['FastFinetune']"
    for name, value in (("NumIterations", opts.num_iterations), ("BatchSize", opts.batch_size),
                        ("DataSize", opts.data_size), ("Threads", opts.threads)):  # fmt: skip
        if value < 1:
            raise OptionError(f"{key}[{name!r}] = {value}: must be at least 1.")
    if not (math.isfinite(opts.learning_rate) and opts.learning_rate > 0):
        raise OptionError(f"{key}['LearningRate'] = {opts.learning_rate}: must be a positive number.")
    if opts.max_seconds is not None and not opts.max_seconds > 0:  # inf (or None): no bound
        raise OptionError(
            f"{key}['MaxSeconds'] = {opts.max_seconds}: must be a positive number (inf: no bound)."
        )
    if not (math.isfinite(opts.reg_param) and opts.reg_param >= 0):
        raise OptionError(f"{key}['RegParam'] = {opts.reg_param}: must be >= 0.")
    if not 0 <= opts.warm_start < 1:
        raise OptionError(f"{key}['WarmStart'] = {opts.warm_start}: must be in [0, 1).")
    if not 0 <= opts.drop_ratio <= 1:
        raise OptionError(f"{key}['DropRatio'] = {opts.drop_ratio}: must be in [0, 1].")
    beta = opts.beta_range
    if (
        len(beta) != 2
        or not all(isinstance(b, int | float) and not isinstance(b, bool) for b in beta)
        or not (beta[0] >= beta[1] > 0)
    ):
        raise OptionError(
            f"{key}['BetaRange'] = {beta!r}: give two numbers [start, end] with start >= end > 0."
        )
    bad = [op for op in opts.target_op_types if op not in _FT_OPS]
    if bad or not opts.target_op_types:
        raise OptionError(
            f"{key}['TargetOpType'] = {list(opts.target_op_types)!r}: fast finetune tunes "
            f"{', '.join(_FT_OPS)}; give a non-empty list of them."
        )
