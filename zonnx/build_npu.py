"""The build's deployment stages: quantize for a target, compile for its NPU, run and evaluate the NPU session.

The quantization follows the target's rules: power-of-two targets get FixNeuron with MinMSE positions
and bias correction (vai_q_onnx's DPU recipe; Vitis AI's default configuration has ``include_bias_corr``)
and the target's refinement; float-scale targets get QDQ with the target's symmetry and weight
granularity, and symmetric ones clipped (MSE) thresholds instead of min/max.

Measured on the zoo PP-OCRv4 recognizer (48 calibration and 100 held-out rendered lines, character
accuracy; float 1.0): dpu-b4096 0.002 without bias correction, 0.982 with it (per-tensor power-of-two
weights and 8-bit power-of-two biases shift every channel's mean; the correction measures and removes
that shift); bm1684x 0.69 with min/max thresholds, 0.990 with MSE ones (one outlier widens a symmetric
grid for every value of the tensor). TPU-MLIR's own default, KLD thresholds, gave 0.0 here (16
calibration, 40 held-out lines) without its auto-tune. Asymmetric targets keep min/max (zhouyi-x2, 48
calibration and 40 held-out lines: 0.995 min/max, 0.989 MSE).
"""

from __future__ import annotations

__all__ = ["quantize_for_target", "compile_and_run", "npu_evaluation", "calibration_feeds"]

from pathlib import Path
from typing import Any

import numpy as np
import onnx

from zonnx import zoo
from zonnx.errors import OptionError
from zonnx.ir.io import external_data_locations, load_proto
from zonnx.quantization.calibration.readers import ListReader


def calibration_feeds(model_name: str, calib: str | None, model: onnx.ModelProto) -> Any:
    """A reader: ``calib`` (folder, .npz, FILE.py:FUNC) if given, else the zoo model's own samples."""
    if calib:
        from zonnx.quantization.sources import reader_from_source

        return reader_from_source(calib, model)
    if model_name == "digits_cnn":
        from zonnx.zoo.digits import digits_data

        x, _ = digits_data("calib")
        return ListReader([{"input": x[i : i + 1]} for i in range(64)])
    if model_name in zoo.names():
        return ListReader(zoo.sample_inputs(model_name, 16, seed=1))
    raise OptionError(
        f"{model_name}: give calibration data with --calib to quantize it (or --no-deploy to stop after optimizing)."
    )


#: Recovery a power-of-two target with per-tensor weights gets by default: CLE, Vitis AI's DPU default
#: (``include_cle``). One scale per weight tensor leaves the channels far below the tensor's largest a
#: few codes, and CLE balances the pairs it can reach (through ReLU or nothing). SmoothQuant would move
#: more of that spread into the activations but is not a default: measured on dpu-b4096 it lifted PP-OCRv4
#: rec (char accuracy 0.9833 -> 0.9902 on 200 lines) and cost MobileNetV2 about 2 dB of logits SQNR
#: (one-off runs in docs/benchmarks.md); add it with ``--smooth-quant`` where it helps.
PER_TENSOR_WEIGHT_RECOVERY = {"IncludeCLE": True}


def target_quantize_kwargs(target_name: str, quant_format: Any = None) -> dict[str, Any]:
    """``quantize_static`` keyword arguments that give the scheme ``target_name`` accepts.

    Power-of-two targets: FixNeuron (or ``quant_format``, e.g. QDQ) with MinMSE power-of-two scales and
    ``BiasCorrection``; with per-tensor weights also ``IncludeCLE`` (Vitis AI's default for a DPU,
    ``PER_TENSOR_WEIGHT_RECOVERY``). Others: QDQ with the target's
    activation symmetry/dtype and weight granularity, MSE thresholds when activations are symmetric
    (min/max otherwise), and ``BiasCorrection`` (TPU-MLIR's ``--bc``; undone when it lowers the output
    SQNR on its samples): on PP-OCRv4 rec the choice of 32 calibration lines alone moved char accuracy
    by 2 points without it (zhouyi-x2 0.9730 / 0.9935 on 1000 other lines), by 0.2 with it (0.9951 /
    0.9929). ``ResidualStream16`` (int16 around each LayerNorm) when the target takes int16
    activations. ``Target`` is set.
    """
    from zonnx.backend.targets import load_target
    from zonnx.quantization.enums import (
        PowerOfTwoMethod,
        QuantFormat,
        VitisQuantFormat,
        ZonnxCalibrationMethod,
    )

    rules = load_target(target_name).quant
    if rules.scale == "power_of_two":
        kwargs: dict[str, Any] = dict(
            quant_format=quant_format or VitisQuantFormat.FixNeuron,
            calibrate_method=PowerOfTwoMethod.MinMSE,
            extra_options={},
        )
        if rules.weight_granularity == "per_tensor":
            kwargs["extra_options"].update(PER_TENSOR_WEIGHT_RECOVERY)
    else:
        kwargs = dict(
            quant_format=quant_format or QuantFormat.QDQ,
            per_channel=rules.weight_granularity == "per_channel",
            activation_type="int8" if rules.activation_symmetric else "uint8",
            extra_options={
                "ActivationSymmetric": rules.activation_symmetric,
                "WeightSymmetric": rules.weight_symmetric,
            },
        )
        if rules.activation_symmetric:
            kwargs["calibrate_method"] = ZonnxCalibrationMethod.MSE
    # QOperator models are converted from QDQ afterwards; bias correction refuses them
    kwargs["extra_options"]["BiasCorrection"] = quant_format != QuantFormat.QOperator
    if "int16" in rules.activation_dtypes:
        # the LayerNorm/residual-Add trap (zonnx.quantization.traps): int16 where the target has it
        kwargs["extra_options"]["ResidualStream16"] = True
    kwargs["extra_options"]["Target"] = target_name
    return kwargs


def quantize_for_target(
    optimized: Path, out: Path, target_name: str, reader: Any, *, external_data: bool = False
) -> dict[str, Any]:
    """Quantize ``optimized`` to ``out`` the way ``target_name`` needs (weights in ``out.data`` with
    ``external_data``, when ``optimized`` has external data, and past 2 GB); returns the stage's report."""
    from zonnx.quantization.api import quantize_static

    kwargs = target_quantize_kwargs(target_name)
    skeleton = load_proto(optimized, load_external_data=False)
    kwargs["use_external_data_format"] = external_data or bool(external_data_locations(skeleton))
    result = quantize_static(optimized, out, reader, **kwargs)
    worst = result.report.worst if result.report is not None else None
    return {
        "output": str(out),
        "format": result.config.quant_format.name,
        "method": result.config.calibrate_method.name,
        "quantized": dict(result.counts),
        "target_rules": dict(result.refinement.counts) if result.refinement is not None else {},
        "worst_layer": None if worst is None else {"tensor": worst.tensor, "sqnr_db": worst.sqnr_db},
    }


def compile_and_run(
    quantized: Path, out_dir: Path, target_name: str, *, external_data: bool = False
) -> tuple[Any, dict[str, Any]]:
    """Compile for the NPU (cached under out_dir/cache) and open the NPU session; returns it and a report.
    The compiled model keeps its weights in external data with ``external_data`` (else past 2 GB)."""
    from zonnx.backend.compile_api import compile_model
    from zonnx.backend.session import InferenceSession
    from zonnx.backend.targets import load_target

    compiled = compile_model(quantized, target_name)
    tag = load_target(target_name).name  # a target given as a .toml path names files by its own name
    compiled_path = compiled.save(
        out_dir / f"{quantized.stem}.{tag}.onnx", external_data=external_data or None
    )
    session = InferenceSession(
        str(quantized),
        providers=["ZonnxNPUExecutionProvider", "CPUExecutionProvider"],
        provider_options=[{"target": target_name, "cache_dir": str(out_dir / "cache")}, {}],
    )
    return session, {"compiled": str(compiled_path), "partition": compiled.report()}


def npu_evaluation(
    model_name: str,
    session: Any,
    float_path: Path,
    quant_path: Path,
    feeds: list[dict[str, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """Digits: top-1 of float, fake-quantized and NPU models; other zoo models: NPU vs float cosine; any
    other model: fake-quantized and NPU outputs vs float (cosine) on ``feeds`` (its calibration samples)."""
    from zonnx.verify import compare_outputs, run_ort

    if model_name == "digits_cnn":
        from zonnx.zoo.digits import digits_data, evaluate_top1

        x, y = digits_data("test")
        npu = np.concatenate([session.run(None, {"input": x[i : i + 64]})[0] for i in range(0, len(x), 64)])
        return {
            "task": "digits test top-1",
            "float_top1": evaluate_top1(float_path, x, y),
            "quantized_top1": evaluate_top1(quant_path, x, y),
            "npu_top1": float((npu.argmax(axis=1) == y).mean()),
        }
    names = [o.name for o in session.get_outputs()]
    if model_name in zoo.names():
        cosines = []
        for sample in zoo.sample_inputs(model_name, 4, seed=7):
            npu = dict(zip(names, session.run(None, sample), strict=True))
            cosines += [d.cosine for d in compare_outputs(run_ort(onnx.load(float_path), sample), npu)]
        return {"task": "NPU outputs vs float on sample inputs", "min_cosine": min(cosines)}
    if not feeds:
        raise OptionError(
            f"{model_name}: no samples to evaluate the NPU on; give calibration data with --calib."
        )
    float_model, quant_model = onnx.load(float_path), onnx.load(quant_path)
    npu_cos, quant_cos = [], []
    for sample in feeds:
        reference = run_ort(float_model, sample)
        npu = dict(zip(names, session.run(None, sample), strict=True))
        npu_cos.append(min(d.cosine for d in compare_outputs(reference, npu)))
        quant_cos.append(min(d.cosine for d in compare_outputs(reference, run_ort(quant_model, sample))))
    return {
        "task": "NPU and fake-quantized outputs vs float on calibration samples (no labelled set)",
        "samples": len(feeds),
        "quantized_cosine": float(np.mean(quant_cos)),
        "npu_cosine": float(np.mean(npu_cos)),
        "min_npu_cosine": float(min(npu_cos)),
    }
