"""Retargeting ResNet-18 quantized by ONNX Runtime itself (QOperator, QDQ, dynamic) to every NPU target.

Per (form, target): the share of MACs the partitioner puts on the NPU after ``zonnx quantize --target``
(peer: the same source compiled as it is, which is what users got before), and the output cosine of
the retargeted model against the source model run by ORT on 8 held-out samples (target >= 0.99).
"""

from __future__ import annotations

__all__ = ["bench_prequant"]

import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.runner import HIGHER, BenchContext, Measurement

FORMS = ("QOperator", "QDQ", "dynamic")
TARGETS = ("dpu-b4096", "zhouyi-x2", "bm1684x")


class _Reader:
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.it, None)


def _sources(folder: Path, feeds: list[dict[str, np.ndarray]]) -> dict[str, Path]:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    import zonnx.zoo as zoo

    pre = folder / "r18_pre.onnx"
    quant_pre_process(str(zoo.get("resnet18-random")), str(pre))
    out = {}
    for fmt in ("QOperator", "QDQ"):
        out[fmt] = folder / f"r18_{fmt}.onnx"
        quantize_static(str(pre), str(out[fmt]), _Reader(feeds), quant_format=getattr(QuantFormat, fmt),
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
    out["dynamic"] = folder / "r18_dynamic.onnx"
    quantize_dynamic(str(pre), str(out["dynamic"]), weight_type=QuantType.QInt8)
    return out


def _share(model: object, target: str) -> float:
    from zonnx.backend.compile_api import compile_model
    from zonnx.errors import ZonnxError

    try:
        return compile_model(model, target).partition.mac_share
    except ZonnxError:
        return 0.0


def _cosine(a: Path, b: Path, feeds: list[dict[str, np.ndarray]]) -> float:
    sa, sb = ort.InferenceSession(str(a)), ort.InferenceSession(str(b))
    x = np.concatenate([sa.run(None, f)[0].ravel() for f in feeds]).astype(np.float64)
    y = np.concatenate([sb.run(None, f)[0].ravel() for f in feeds]).astype(np.float64)
    return float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))


def bench_prequant(ctx: BenchContext) -> list[Measurement]:
    import zonnx.zoo as zoo
    from zonnx import quantize_static
    from zonnx.build_npu import target_quantize_kwargs
    from zonnx.quantization.calibration.readers import ListReader

    calib = zoo.sample_inputs("resnet18-random", 8)
    held = zoo.sample_inputs("resnet18-random", 16, seed=1)[8:]
    forms = FORMS[1:2] if ctx.quick else FORMS
    out: list[Measurement] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sources = _sources(folder, calib)
        for form in forms:
            for target in TARGETS:
                dst = folder / f"{form}_{target}.onnx"
                res = quantize_static(sources[form], dst, ListReader(calib), **target_quantize_kwargs(target))
                before, after = _share(sources[form], target), _share(dst, target)
                counts = ", ".join(f"{k} {v}" for k, v in sorted(res.prequant.counts().items()))
                out.append(Measurement(f"ResNet-18 ORT {form} -> {target}: NPU MAC share", 100 * after, "%", HIGHER,
                                       target=95.0, note=f"compiled as it is: {100 * before:.1f}%; {counts}"))  # fmt: skip
                out.append(Measurement(f"ResNet-18 ORT {form} -> {target}: output cosine vs source", _cosine(sources[form], dst, held),
                                       "cos", HIGHER, target=0.99, note="8 held-out samples, both run by ORT"))  # fmt: skip
    return out
