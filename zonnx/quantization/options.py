"""Strict parsing of ``extra_options``: ORT's and vai_q_onnx's documented keys plus zonnx's own.

An unknown key is an error that lists the known ones (with a close match), never silently ignored;
a known key of ORT's that zonnx does not implement is an error that says so.
"""

from __future__ import annotations

__all__ = [
    "ExtraOptions",
    "FastFinetuneOptions",
    "parse_extra_options",
    "parse_fast_finetune",
    "KNOWN_KEYS",
    "FAST_FINETUNE_KEYS",
]

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from zonnx.errors import OptionError, did_you_mean, type_names
from zonnx.quantization.finetune_options import FAST_FINETUNE_KEYS, FastFinetuneOptions, parse_fast_finetune
from zonnx.quantization.placement import PLACEMENTS


@dataclasses.dataclass(frozen=True)
class ExtraOptions:
    """Parsed ``extra_options`` with their defaults (ORT's defaults unless noted)."""

    # ORT / vai_q_onnx keys
    activation_symmetric: bool = False
    activation_restricted_asymmetric: bool = False
    # None = ORT's rule: symmetric for signed weight types (int4/int8/int16), asymmetric for unsigned ones
    weight_symmetric: bool | None = None
    force_quantize_no_input_check: bool = False
    matmul_const_b_only: bool = False
    add_qdq_pair_to_weight: bool = False
    op_types_to_exclude_output_quantization: tuple[str, ...] = ()
    dedicated_qdq_pair: bool = False
    per_channel_axis: Mapping[str, int] = dataclasses.field(default_factory=dict)
    calib_tensor_range_symmetric: bool = False
    calib_moving_average: bool = False
    calib_moving_average_constant: float = 0.01
    calib_percentile: float = 99.999
    minimum_real_range: float | None = None
    tensor_quant_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    keep_removable_activations: bool = False
    use_qdq_contrib_ops: bool = False
    enable_subgraph: bool = False
    # True keeps weight scales even when an int32 bias code overflows (schemes.fit_weight_to_bias)
    disable_weight_adjust_for_int32_bias: bool = False
    # False keeps Conv/Gemm biases float (no int32 DequantizeLinear)
    quantize_bias: bool = True
    # ORT's blocked weight quantization (block size along the input-channel axis); 0 = off
    block_size: int = 0
    # zonnx keys
    weight_calibrate_method: str = "minmax"
    # ORT's Distribution scenario key; ORT's quantize_static never applies it ("same"): checked and warned
    calib_scenario: str = "same"
    # histogram bins; None = the method's ORT default (Entropy 128 over [-t, t], else 2048)
    calib_num_bins: int | None = None
    calib_num_quantized_bins: int = 128
    # values per tensor and batch counted in histograms (a strided in-graph sample); None counts all
    calib_histogram_sample: int | None = 16384
    calib_nstd: float = 3.0
    calib_momentum: float = 0.9
    # calibration batches cut into this many shards, run through quantize_static's calibration_executor
    calib_shards: int = 1
    # samples of batch 1 per calibration run (calibration.batching); 1 = one at a time (the default: on
    # CNNs at 224x224 batches of 8 ran slower on the 2-core reference host, docs/benchmarks.md)
    calib_batch: int = 1
    # None = ORT's rule: symmetric signed types use the restricted range [-(2^(b-1)-1), 2^(b-1)-1],
    # except power-of-two quantization, which uses the full range as vai_q_onnx does.
    activation_restricted_range: bool | None = None
    weight_restricted_range: bool | None = None
    target: str | None = None
    auto_upgrade_opset: bool = True
    opset: int | None = None
    report_path: str | None = None
    save_stats: str | None = None
    load_stats: str | None = None
    export_calibration_table: str | None = None
    load_calibration_table: str | None = None
    fix_round_mode: str | None = None
    # which edges carry quantizers: "ort" (every tensor of quantizable ops) or "kernels" (placement.py)
    quant_placement: str = "ort"
    # int16 activations for the residual stream: LayerNorm inputs/outputs and the Adds feeding them (traps.py)
    residual_stream_16: bool = False
    # calibration samples, spread over the whole set, kept for the per-layer report and the collapse check
    report_samples: int = 4
    # hold the last report_samples calibration samples out of calibration for the report (holdout.py);
    # off in quantize_static (every sample calibrates, as in ORT), on in `zonnx quantize`
    report_holdout: bool = False
    # warn when a model output's cosine against float falls below this on those samples (collapse.py)
    warn_below_cosine: float = 0.99
    # a pre-quantized input: dequantize it and calibrate from scratch instead of importing its grids
    prequant_requantize: bool = False
    # accuracy recovery (vai_q_onnx / Quark names)
    include_cle: bool = False
    cle_steps: int = 1
    # False: unlike vai_q_onnx (True), folded biases do not count in the channel ranges CLE balances
    # (they have their own grid); with True, CLE lowered held-out SQNR on the trained zoo CNNs (cle.py)
    cle_scale_append_bias: bool = False
    replace_clip6_relu: bool = False
    bias_correction: bool = False
    include_fast_ft: bool = False
    fast_finetune: FastFinetuneOptions = dataclasses.field(default_factory=FastFinetuneOptions)
    # SmoothQuant (ORT / neural-compressor names), run on the float model before annotation
    smooth_quant: bool = False
    smooth_quant_alpha: float = 0.5
    smooth_quant_folding: bool = True


#: extra_options key -> (field name, expected python type(s)).
KNOWN_KEYS: dict[str, tuple[str, type | tuple[type, ...]]] = {
    "ActivationSymmetric": ("activation_symmetric", bool),
    "ActivationRestrictedAsymmetric": ("activation_restricted_asymmetric", bool),
    "WeightSymmetric": ("weight_symmetric", (bool, type(None))),
    "ForceQuantizeNoInputCheck": ("force_quantize_no_input_check", bool),
    "MatMulConstBOnly": ("matmul_const_b_only", bool),
    "AddQDQPairToWeight": ("add_qdq_pair_to_weight", bool),
    "OpTypesToExcludeOutputQuantization": ("op_types_to_exclude_output_quantization", (list, tuple)),
    "DedicatedQDQPair": ("dedicated_qdq_pair", bool),
    "QDQOpTypePerChannelSupportToAxis": ("per_channel_axis", dict),
    "CalibTensorRangeSymmetric": ("calib_tensor_range_symmetric", bool),
    "CalibMovingAverage": ("calib_moving_average", bool),
    "CalibMovingAverageConstant": ("calib_moving_average_constant", (int, float)),
    "CalibPercentile": ("calib_percentile", (int, float)),
    "MinimumRealRange": ("minimum_real_range", (int, float, type(None))),
    "TensorQuantOverrides": ("tensor_quant_overrides", dict),
    "QDQKeepRemovableActivations": ("keep_removable_activations", bool),
    "UseQDQContribOps": ("use_qdq_contrib_ops", bool),
    "EnableSubgraph": ("enable_subgraph", bool),
    "QuantizeBias": ("quantize_bias", bool),
    "BlockSize": ("block_size", int),
    "WeightCalibrateMethod": ("weight_calibrate_method", str),
    "CalibNumBins": ("calib_num_bins", int),
    "scenario": ("calib_scenario", str),
    "CalibNumQuantizedBins": ("calib_num_quantized_bins", int),
    "CalibHistogramSample": ("calib_histogram_sample", (int, type(None))),
    "CalibNStd": ("calib_nstd", (int, float)),
    "CalibMomentum": ("calib_momentum", (int, float)),
    "CalibShards": ("calib_shards", int),
    "CalibBatch": ("calib_batch", int),
    "ActivationRestrictedRange": ("activation_restricted_range", (bool, type(None))),
    "WeightRestrictedRange": ("weight_restricted_range", (bool, type(None))),
    "Target": ("target", (str, type(None))),
    "AutoUpgradeOpset": ("auto_upgrade_opset", bool),
    "Opset": ("opset", (int, type(None))),
    "ReportPath": ("report_path", (str, type(None))),
    "SaveStats": ("save_stats", (str, type(None))),
    "LoadStats": ("load_stats", (str, type(None))),
    "ExportCalibrationTable": ("export_calibration_table", (str, type(None))),
    "LoadCalibrationTable": ("load_calibration_table", (str, type(None))),
    "FixRoundMode": ("fix_round_mode", (str, type(None))),
    "QuantPlacement": ("quant_placement", str),
    "ResidualStream16": ("residual_stream_16", bool),
    "ReportSamples": ("report_samples", int),
    "ReportHoldOut": ("report_holdout", bool),
    "WarnBelowCosine": ("warn_below_cosine", (int, float)),
    "PrequantRequantize": ("prequant_requantize", bool),
    "IncludeCLE": ("include_cle", bool),
    "CLESteps": ("cle_steps", int),
    "CLEScaleAppendBias": ("cle_scale_append_bias", bool),
    "ReplaceClip6Relu": ("replace_clip6_relu", bool),
    "BiasCorrection": ("bias_correction", bool),
    "IncludeFastFT": ("include_fast_ft", bool),
    "FastFinetune": ("fast_finetune", dict),
    "SmoothQuant": ("smooth_quant", bool),
    "SmoothQuantAlpha": ("smooth_quant_alpha", (int, float)),
    "SmoothQuantFolding": ("smooth_quant_folding", bool),
    "QDQDisableWeightAdjustForInt32Bias": ("disable_weight_adjust_for_int32_bias", bool),
}
#: Keys that only tune cross-layer equalization: refused unless IncludeCLE is True.
_CLE_KEYS = ("CLESteps", "CLEScaleAppendBias")

#: ORT keys accepted for compatibility whose effect zonnx already has built in (value ignored, no warning).
_ACCEPTED_NOOP = {
    "extra.Sigmoid.nnapi",
    "CalibMaxIntermediateOutputs",
    "CalibStridedMinMax",
}
#: ORT keys zonnx does not implement.
_UNSUPPORTED: dict[str, str] = {}


#: Histogram bins collected when CalibNumBins is not given (Entropy then searches ORT's 128 over [-t, t]).
DEFAULT_NUM_BINS = 2048
#: Largest histogram accepted for CalibNumBins (its memory is per calibrated tensor).
MAX_BINS = 1 << 16
#: Most samples kept in memory for the per-layer report.
MAX_REPORT_SAMPLES = 256


def parse_extra_options(extra: Mapping[str, Any] | None) -> ExtraOptions:
    """Validate every key and value type; unknown keys raise OptionError listing the known ones."""
    values: dict[str, Any] = {}
    for key, value in (extra or {}).items():
        if key in _ACCEPTED_NOOP:
            continue
        if key in _UNSUPPORTED:
            raise OptionError(f"extra_options[{key!r}]: {_UNSUPPORTED[key]}; remove the key.")
        if key not in KNOWN_KEYS:
            known = sorted([*KNOWN_KEYS, *_ACCEPTED_NOOP])
            raise OptionError(
                f"extra_options: unknown key {key!r}.{did_you_mean(key, known)} Known keys: {', '.join(known)}."
            )
        field, types = KNOWN_KEYS[key]
        tupled = types if isinstance(types, tuple) else (types,)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in tupled):
            raise OptionError(f"extra_options[{key!r}] = {value!r}: expected {type_names(types)}.")
        if isinstance(value, list):
            value = tuple(value)
        values[field] = value
    if "fast_finetune" in values:
        if not values.get("include_fast_ft"):
            raise OptionError(
                "extra_options['FastFinetune'] is set but IncludeFastFT is not True: set IncludeFastFT=True "
                "to run fast finetune, or remove FastFinetune."
            )
        values["fast_finetune"] = parse_fast_finetune(values["fast_finetune"])
    opts = ExtraOptions(**values)
    if (
        opts.calib_num_bins is not None and not 16 <= opts.calib_num_bins <= MAX_BINS
    ):  # bounded: histograms are kept per tensor
        raise OptionError(
            f"extra_options['CalibNumBins'] = {opts.calib_num_bins}: use 16 to {MAX_BINS} bins."
        )
    if not 1 <= opts.calib_num_quantized_bins <= (opts.calib_num_bins or DEFAULT_NUM_BINS):
        raise OptionError(
            f"extra_options['CalibNumQuantizedBins'] = {opts.calib_num_quantized_bins}: must be from 1 to "
            f"CalibNumBins ({opts.calib_num_bins})."
        )
    if not (math.isfinite(opts.calib_nstd) and opts.calib_nstd > 0):
        raise OptionError(f"extra_options['CalibNStd'] = {opts.calib_nstd}: must be a positive number.")
    if not 0 < opts.calib_moving_average_constant <= 1:
        raise OptionError(
            f"extra_options['CalibMovingAverageConstant'] = {opts.calib_moving_average_constant}: must be in "
            "(0, 1] (the weight of each new batch)."
        )
    if not 0 < opts.calib_percentile <= 100:
        raise OptionError(f"extra_options['CalibPercentile'] = {opts.calib_percentile}: must be in (0, 100].")
    if opts.calib_histogram_sample is not None and opts.calib_histogram_sample < 1024:
        raise OptionError(
            f"extra_options['CalibHistogramSample'] = {opts.calib_histogram_sample}: use at least "
            "1024, or None to count every value."
        )
    if opts.cle_steps < 1:
        raise OptionError(
            f"extra_options['CLESteps'] = {opts.cle_steps}: give a number of steps >= 1 (vai_q_onnx's -1, "
            "adaptive steps, is not implemented)."
        )
    tuned = [k for k in _CLE_KEYS if k in (extra or {})]
    if tuned and not opts.include_cle:
        raise OptionError(
            f"extra_options[{tuned[0]!r}] tunes cross-layer equalization, which is off; "
            "add IncludeCLE=True (or remove the key)."
        )
    if opts.quant_placement not in PLACEMENTS:
        raise OptionError(
            f"extra_options['QuantPlacement'] = {opts.quant_placement!r}: use one of {', '.join(PLACEMENTS)}."
        )
    if not 0 <= opts.report_samples <= MAX_REPORT_SAMPLES:
        raise OptionError(
            f"extra_options['ReportSamples'] = {opts.report_samples}: use 0 (no report) to {MAX_REPORT_SAMPLES}."
        )
    if not 0 <= opts.warn_below_cosine <= 1:
        raise OptionError(f"extra_options['WarnBelowCosine'] = {opts.warn_below_cosine}: must be in [0, 1].")
    given = sorted({"SmoothQuantAlpha", "SmoothQuantFolding"} & set(extra or {}))
    if given and not opts.smooth_quant:
        raise OptionError(
            f"extra_options[{given[0]!r}] has no effect without SmoothQuant; add SmoothQuant=True or remove it."
        )
    if not (math.isfinite(opts.smooth_quant_alpha) and 0 <= opts.smooth_quant_alpha <= 1):
        raise OptionError(
            f"extra_options['SmoothQuantAlpha'] = {opts.smooth_quant_alpha}: must be in [0, 1] (the share of "
            "the activation range moved into the weights)."
        )
    _refuse_unimplemented(opts)
    if opts.calib_batch < 1:
        raise OptionError(
            f"extra_options['CalibBatch'] = {opts.calib_batch}: give at least 1 sample per run."
        )
    if opts.calib_shards < 1:
        raise OptionError(f"extra_options['CalibShards'] = {opts.calib_shards}: give at least 1 shard.")
    if not 0 < opts.calib_momentum < 1:
        raise OptionError(f"extra_options['CalibMomentum'] = {opts.calib_momentum}: must be in (0, 1).")
    return opts


def _refuse_unimplemented(opts: ExtraOptions) -> None:
    """ORT options whose non-default value zonnx does not implement: refused, never ignored."""
    if opts.dedicated_qdq_pair:
        raise OptionError(
            "extra_options['DedicatedQDQPair'] = True: zonnx shares one QuantizeLinear/DequantizeLinear pair "
            "between the readers of a tensor and does not write dedicated pairs; remove the key."
        )
    if opts.enable_subgraph:
        raise OptionError(
            "extra_options['EnableSubgraph'] = True: zonnx does not quantize If/Loop/Scan bodies; remove the key "
            "(the subgraphs stay float)."
        )
    if opts.block_size < 0:
        raise OptionError(f"extra_options['BlockSize'] = {opts.block_size}: must be 0 (off) or a block size.")
