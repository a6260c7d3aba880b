"""SmoothQuant on the BERT zoo encoder: int8 embedding fidelity with SmoothQuant against without it.

Fidelity is the mean cosine between quantized and float sentence embeddings of held-out sentences
after removing the float batch mean (the raw cosine is dominated by the 4 outlier channels every
sentence shares). Settings: symmetric int8 activations and ORT's u8 activations, per-channel int8
weights, with MatMul only quantized (the usual transformer recipe) and with the default op types.
"""

from __future__ import annotations

__all__ = ["bench_smooth_quant"]

import numpy as np

from bench.runner import HIGHER, BenchContext, Measurement
from zonnx import zoo
from zonnx.quantization.api import quantize_static
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.enums import QuantType
from zonnx.verify import ort_session

MODEL = "bert_encoder-random"


def _centered_cosine(got: np.ndarray, ref: np.ndarray) -> float:
    a, b = got - ref.mean(0), ref - ref.mean(0)
    return float(np.mean(np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))


def bench_smooth_quant(ctx: BenchContext) -> list[Measurement]:
    n_calib, n_held = (8, 8) if ctx.quick else (16, 32)
    ctx.describe([MODEL], {"calibration": n_calib, "held out": n_held}, {"calibration": 0, "held out": 1})
    path = str(zoo.get(MODEL))
    calib = zoo.sample_inputs(MODEL, 8 if ctx.quick else 16, seed=0)
    held = zoo.sample_inputs(MODEL, 8 if ctx.quick else 32, seed=1)
    batch = {k: np.concatenate([f[k] for f in held]) for k in held[0]}
    ref = ort_session(path).run(None, batch)[0]
    settings = {
        "s8 sym, MatMul": ({"activation_type": QuantType.QInt8}, {"ActivationSymmetric": True}, ["MatMul"]),
        "u8 asym, MatMul": ({"activation_type": QuantType.QUInt8}, {}, ["MatMul"]),
        "s8 sym, default ops": ({"activation_type": QuantType.QInt8}, {"ActivationSymmetric": True}, None),
    }
    alphas = [0.5] if ctx.quick else [0.3, 0.5, 0.7]
    out = []
    for name, (kw, extra, ops) in settings.items():
        if ctx.quick and ops is None:
            continue

        def cosine(sq: dict, kw=kw, extra=extra, ops=ops) -> float:
            r = quantize_static(
                path, None, ListReader(calib), per_channel=True, op_types_to_quantize=ops, **kw,
                extra_options={**extra, **sq},
            )  # fmt: skip
            return _centered_cosine(ort_session(r.model).run(None, batch)[0], ref)

        plain = cosine({})
        found = {a: cosine({"SmoothQuant": True, "SmoothQuantAlpha": a}) for a in alphas}
        best = max(found, key=found.get)
        note = ", ".join(f"alpha {a}: {c:.4f}" for a, c in found.items())
        out.append(
            Measurement(
                f"BERT int8 ({name}): centered embedding cosine, SmoothQuant 0.5",
                found[0.5],
                "cos",
                HIGHER,
                peer="no SmoothQuant",
                peer_value=plain,
                note=f"{note}; best alpha {best}",
            )
        )
    return out
