"""Retargeting already-quantized models to every NPU target: models quantized by ONNX Runtime (static
QOperator / QDQ and dynamic), by TensorFlow's TFLite converter, and by torch QAT (sources made by
``bench.prequant_sources``).

Per (source, target): the share of MACs the partitioner puts on the NPU after ``zonnx quantize --target``
(target >= 95%; note: the source compiled as it is, which is what users got before), compiled with the
samples' static input shapes; and the output cosine of the retargeted model against the source model, both
run by ORT on held-out samples (target >= 0.99), as written and exactly on every CPU (``verify.ort_session``;
with ORT's default fusions, x86 hosts without VNNI saturate u8 x s8 sums and the cosines measure that). For the QAT model also the task metric: top-1 on the
digits test split of the retargeted QAT model against PTQ from float (the same network before QAT,
quantized by ``zonnx quantize --target`` on the same calibration images; target ratio >= 1). Where the
float network is at hand (ORT sources: the model ORT quantized, after its pre-processing; QAT: the network
before QAT), the retargeted and the source model are both compared with it too (no target): an untrained
network amplifies any rounding difference, and this says whether retargeting or the source's own
quantization costs the accuracy. MobileNetV2 is the zoo's ``mobilenetv2_digits`` (trained here on digits
upscaled to 32x32; calibrated on the digits ``calib`` split, cosines on test images): for it also the
top-1 of every retargeted model on the 450 test images, against the source's own top-1 in ORT.
"""

from __future__ import annotations

__all__ = ["bench_prequant"]

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench import prequant_sources as src
from bench.runner import HIGHER, BenchContext, Measurement

TARGETS = ("dpu-b4096", "zhouyi-x2", "bm1684x")
MOBILENET = "mobilenetv2_digits"
#: Calibration / held-out samples of the zoo models (seeds 0 and 1, as ``zoo.sample_inputs`` draws them).
CALIB, HELD = 8, 8
#: The trained MobileNetV2: calibration images (digits calib split) and held-out test images for cosines.
M_CALIB, M_HELD = 32, 64

Feeds = list[dict[str, np.ndarray]]


def _share(model: object, target: str, feeds: Feeds) -> float:
    from zonnx.backend.compile_api import compile_model
    from zonnx.errors import ZonnxError

    shapes = {k: tuple(v.shape) for k, v in feeds[0].items()}
    try:
        return compile_model(model, target, input_shapes=shapes).partition.mac_share
    except ZonnxError:
        return 0.0


def _cosine(a: Path, b: Path, feeds: Feeds) -> float:
    """Output cosine of two models, each run by ORT as written, exactly on every CPU (``ort_session``: no
    QDQ fusion; on x86 without VNNI, integer ops with int8 weights in ORT's exact u8 x u8 form)."""
    from zonnx.verify import ort_session

    sa, sb = ort_session(a), ort_session(b)
    x = np.concatenate([sa.run(None, f)[0].ravel() for f in feeds]).astype(np.float64)
    y = np.concatenate([sb.run(None, f)[0].ravel() for f in feeds]).astype(np.float64)
    return float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))


def _retarget(source: Path, target: str, calib: Feeds, dst: Path) -> object:
    from zonnx import quantize_static
    from zonnx.build_npu import target_quantize_kwargs
    from zonnx.quantization.calibration.readers import ListReader

    return quantize_static(source, dst, ListReader(calib), **target_quantize_kwargs(target))


def _rows(
    label: str, source: Path, calib: Feeds, held: Feeds, folder: Path, float_model: Path | None = None
) -> list[Measurement]:
    """Share and cosine of ``source`` retargeted to every target; with ``float_model`` (the network before
    quantization) also both models' output cosine against it (no target: what the source itself costs)."""
    out = []
    src_vs_float = _cosine(float_model, source, held) if float_model is not None else None
    for target in TARGETS:
        dst = folder / f"{source.stem}_{target}.onnx"
        res = _retarget(source, target, calib, dst)
        before, after = _share(source, target, calib), _share(dst, target, calib)
        counts = ", ".join(f"{k} {v}" for k, v in sorted(res.prequant.counts().items()))
        out.append(Measurement(f"{label} -> {target}: NPU MAC share", 100 * after, "%", HIGHER, target=95.0,
                               note=f"compiled as it is: {100 * before:.1f}%; {counts}"))  # fmt: skip
        out.append(Measurement(f"{label} -> {target}: output cosine vs source", _cosine(source, dst, held), "cos",
                               HIGHER, target=0.99, note=f"{len(held)} held-out samples, both run by ORT"))  # fmt: skip
        if float_model is not None:
            out.append(Measurement(f"{label} -> {target}: output cosine vs float model", _cosine(float_model, dst, held),
                                   "cos", HIGHER, peer="source vs float", peer_value=src_vs_float))  # fmt: skip
    return out


def _qat_rows(folder: Path) -> list[Measurement]:
    """Digits CNN: retargeted QAT against PTQ from float, top-1 on the test split, per target."""
    from zonnx.zoo.digits import CALIB_SIZE, digits_data, evaluate_top1

    qat, flt = src.qat_digits(folder)
    x_cal, _ = digits_data("calib")
    calib = [{"input": x_cal[i : i + 1]} for i in range(CALIB_SIZE)]
    x_te, y_te = digits_data("test")
    held = [{"input": x_te[i : i + 1]} for i in range(64)]
    out = _rows("digits CNN torch QAT", qat, calib, held, folder, flt)
    base = (
        f"source QAT in ORT {evaluate_top1(qat, x_te, y_te):.4f}, float {evaluate_top1(flt, x_te, y_te):.4f}"
    )
    for target in TARGETS:
        ptq = folder / f"digits_ptq_{target}.onnx"
        _retarget(flt, target, calib, ptq)
        got = evaluate_top1(folder / f"{qat.stem}_{target}.onnx", x_te, y_te)
        out.append(Measurement(f"digits CNN -> {target}: test top-1, retargeted QAT vs PTQ from float", got, "top1",
                               HIGHER, peer="PTQ from float", peer_value=evaluate_top1(ptq, x_te, y_te), target=1.0,
                               note=f"{len(y_te)} test images, run by ORT; {base}"))  # fmt: skip
    return out


def _top1_rows(label: str, source: Path, float_model: Path, folder: Path) -> list[Measurement]:
    """Test top-1 of ``source`` retargeted to every target (written by ``_rows``) against the source's own."""
    from zonnx.zoo.digits import evaluate_top1
    from zonnx.zoo.mobilenet_digits import mobilenet_digits_data

    x_te, y_te = mobilenet_digits_data("test")
    peer, flt = evaluate_top1(source, x_te, y_te), evaluate_top1(float_model, x_te, y_te)
    return [Measurement(f"{label} -> {target}: test top-1", evaluate_top1(folder / f"{source.stem}_{target}.onnx", x_te, y_te),
                        "top1", HIGHER, peer="source in ORT", peer_value=peer, note=f"{len(y_te)} test images; float {flt:.4f}")
            for target in TARGETS]  # fmt: skip


def _describe(ctx: BenchContext, quick: bool) -> None:
    from zonnx.zoo import provenance

    models = [
        f"resnet18-random: {provenance('resnet18-random')}; quantized by ORT quantize_static (QOperator, QDQ: "
        "u8 activations, per-channel s8 weights, MinMax) and quantize_dynamic (s8 weights), after quant_pre_process",
        f"{MOBILENET}: {provenance(MOBILENET)}; quantized by ORT quantize_static as above",
        f"bert_encoder: {provenance('bert_encoder')}; quantized by ORT quantize_dynamic (s8 weights)",
        "Keras MobileNetV2 (alpha 0.35, 96x96, 10 classes, seeded random weights, BN statistics randomized): "
        "TFLiteConverter full-integer int8 (per-channel weights, float I/O), converted by zonnx convert",
        f"digits CNN: the zoo's digits_cnn network trained in float (seed 0), then {src.QAT_EPOCHS} epochs of torch "
        "eager QAT (fbgemm qconfig), converted by torch and exported by zonnx convert (QDQ)",
    ]
    samples = {"zoo calibration": CALIB, "zoo held-out": HELD, f"{MOBILENET} calibration (calib split)": M_CALIB,
               f"{MOBILENET} held-out (test split; top-1 on all 450)": M_HELD, "tflite calibration": 16, "tflite held-out": 8,
               "digits calibration (calib split)": 256, "digits held-out (cosine)": 64, "digits test (top-1)": 450}  # fmt: skip
    ctx.describe(
        models[1:2] if quick else models,
        samples,
        {"zoo calibration": 0, "zoo held-out": 1, "tflite calibration": 0, "tflite held-out": 1, "qat": 0},
        note="retargeted with zonnx quantize_static(**target_quantize_kwargs(T)); NPU share compiled with the "
        "samples' static input shapes; cosines and top-1 of the QDQ models run by ORT",
    )


def bench_prequant(ctx: BenchContext) -> list[Measurement]:
    import zonnx.zoo as zoo

    _describe(ctx, ctx.quick)

    def zoo_feeds(name: str) -> tuple[Feeds, Feeds]:
        if name == MOBILENET:  # a trained model: calibrate on training images, compare on test images
            from zonnx.zoo.mobilenet_digits import mobilenet_digits_data

            (x_cal, _), (x_te, _) = mobilenet_digits_data("calib"), mobilenet_digits_data("test")
            return [{"input": x_cal[i : i + 1]} for i in range(M_CALIB)], [
                {"input": x_te[i : i + 1]} for i in range(M_HELD)
            ]
        return zoo.sample_inputs(name, CALIB), zoo.sample_inputs(name, CALIB + HELD, seed=1)[CALIB:]

    out: list[Measurement] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        Case = tuple[str, Callable[[], tuple[Path, Feeds, Feeds]], Path | None]
        cases: list[Case] = []
        for name, label, forms in (("resnet18-random", "ResNet-18", ("QOperator", "QDQ", "dynamic")),
                                   (MOBILENET, "MobileNetV2", ("QOperator", "QDQ")),
                                   ("bert_encoder", "BERT encoder", ("dynamic",))):  # fmt: skip
            for form in forms:

                def make(name: str = name, form: str = form) -> tuple[Path, Feeds, Feeds]:
                    calib, held = zoo_feeds(name)
                    if form == "dynamic":
                        return src.ort_dynamic(name, folder), calib, held
                    return src.ort_static(name, folder, form, calib), calib, held

                # the float model ORT quantized (after its pre-processing), written by the first maker
                cases.append((f"{label} ORT {form}", make, folder / f"{name}_pre.onnx"))
        tfl_calib, tfl_held = src.tflite_feeds(16, 0), src.tflite_feeds(8, 1)
        cases.append(("MobileNetV2 TFLite int8", lambda: (src.tflite_int8(folder, tfl_calib), tfl_calib, tfl_held), None))  # fmt: skip
        for label, make, float_model in cases[3:4] if ctx.quick else cases:
            source, calib, held = make()
            out += _rows(label, source, calib, held, folder, float_model)
            if label.startswith("MobileNetV2 ORT") and float_model is not None:
                out += _top1_rows(label, source, float_model, folder)
        if not ctx.quick:
            out += _qat_rows(folder)
    return out
