"""The quantizer's known traps on real models, per NPU target: fake-quant and simulated-NPU cosine vs float.

Models (static shapes, ``zonnx.optimize``-d as ``zonnx build`` does):

- ``bert_encoder-random`` (6 x 384 post-LN BERT, attention mask, GELU, 4 LayerNorm outlier channels):
  the mask Add + Softmax, LayerNorm inputs and the residual stream. Figure: embedding cosine (the
  issue's metric); the name adds the centered cosine (float batch mean removed), which on this
  untrained encoder is far stricter: its sentence embeddings differ by 0.7% of their norm, so a
  centered cosine of 0.99 asks for ~60 dB at the output. zhouyi-x2's recipe carries
  ``ResidualStream16``; its peer line is the same recipe without it.
- ``yolo_det`` (YOLO-style, decoded boxes in pixels concatenated with sigmoid scores): the
  detection-head trap. Figure: the lower of the box and the score cosines (each over its own channels).

Per (model, target): ``quantize_static(**target_quantize_kwargs(T))``; fake-quant outputs with ORT
(basic optimizations); ``compile_model`` + ``zonnx.InferenceSession`` with the NPU provider; the NPU
share of MACs from the compiled partition. The peer is the float model (cosine 1.0); target 0.99. The
measurement's name carries the fake-quant figure, the details (centered cosine, box and score cosines)
and the MAC share, since the printed tables show no notes.

Run alone: ``python -m bench.runner traps`` (``--quick``: fewer samples).
"""

from __future__ import annotations

__all__ = ["bench_traps", "TARGETS", "static_optimized"]

import dataclasses
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import zonnx
from bench.runner import HIGHER, BenchContext, Measurement
from zonnx import zoo
from zonnx.backend.compile_api import compile_model
from zonnx.backend.session import InferenceSession
from zonnx.build_npu import target_quantize_kwargs
from zonnx.inspection.macs import fix_input_shapes
from zonnx.quantization.calibration.readers import ListReader

logger = logging.getLogger(__name__)

TARGETS = ("dpu-b4096", "zhouyi-x2", "bm1684x")
_BERT, _YOLO = "bert_encoder-random", "yolo_det"
_BERT_SHAPES = {"input_ids": (1, 128), "attention_mask": (1, 128)}


def static_optimized(name: str, folder: Path) -> Path:
    """The zoo model with batch 1 (and BERT's sequence 128) fixed, ``zonnx.optimize``-d, saved in ``folder``."""
    model = onnx.load(zoo.get(name))
    fix_input_shapes(model, 1, _BERT_SHAPES if name == _BERT else None)
    out = folder / f"{name}.static.onnx"
    onnx.save(zonnx.optimize(model), out)
    return out


def _fake_quant(model: onnx.ModelProto | Path, feeds: list[dict]) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, f)[0] for f in feeds])


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b)))


def _row_cos(got: np.ndarray, ref: np.ndarray, center: np.ndarray | float = 0.0) -> float:
    """Mean over rows of the cosine of ``got - center`` and ``ref - center``."""
    a, b = got - center, ref - center
    return float(np.mean(np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


@dataclasses.dataclass
class _Case:
    name: str
    path: Path
    calib: list[dict]
    test: list[dict]
    score: Callable[[np.ndarray, np.ndarray], tuple[float, str]]  # (figure, details) of outputs vs float


def _bert_score(got: np.ndarray, ref: np.ndarray) -> tuple[float, str]:
    centered = _row_cos(got, ref, ref.mean(0))
    return _row_cos(got, ref), f"centered {centered:.4f}"


def _yolo_score(got: np.ndarray, ref: np.ndarray) -> tuple[float, str]:
    box, score = _cos(got[..., :4], ref[..., :4]), _cos(got[..., 4:], ref[..., 4:])
    return min(box, score), f"box {box:.4f} score {score:.4f}"


def _run_case(case: _Case, target: str, folder: Path, extra: dict | None = None) -> tuple[float, str]:
    """Quantize with the target's recipe (plus ``extra``), run fake-quant and NPU; (NPU figure, note)."""
    ref = _fake_quant(case.path, case.test)
    kwargs = target_quantize_kwargs(target)
    kwargs["extra_options"].update(extra or {})
    start = time.perf_counter()
    result = zonnx.quantize_static(case.path, None, ListReader(case.calib), **kwargs)
    qpath = folder / f"{case.name}.{target}.{len(extra or {})}.onnx"
    onnx.save(result.model, qpath)
    fq, fq_note = case.score(_fake_quant(result.model, case.test), ref)
    share = compile_model(qpath, target).partition.mac_share
    session = InferenceSession(
        str(qpath),
        providers=["ZonnxNPUExecutionProvider", "CPUExecutionProvider"],
        provider_options=[{"target": target, "cache_dir": str(folder / "cache")}, {}],
    )
    names = [o.name for o in session.get_outputs()]
    npu_out = np.concatenate(
        [dict(zip(names, session.run(None, f), strict=True))[names[0]] for f in case.test]
    )
    npu, npu_note = case.score(npu_out, ref)
    note = (
        f"fake-quant {fq:.4f} ({fq_note}); NPU {npu_note}; {100 * share:.1f}% of MACs on the NPU; "
        f"{time.perf_counter() - start:.0f} s"
    )
    return npu, note


def bench_traps(ctx: BenchContext) -> list[Measurement]:
    """Per model and target: NPU output cosine vs float (notes: fake-quant, centered, box/score, MAC share)."""
    n_calib, n_test = (8, 4) if ctx.quick else (16, 8)
    ctx.describe(
        [_BERT, _YOLO],
        {"calibration": n_calib, "test": n_test, "detector test": 2 * n_test},
        {"bert": 3, "yolo": 3},
    )
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        bert = zoo.sample_inputs(_BERT, n_calib + n_test, seed=3)
        yolo = zoo.sample_inputs(_YOLO, n_calib + 2 * n_test, seed=3)
        cases = [
            _Case(
                "BERT encoder", static_optimized(_BERT, folder), bert[:n_calib], bert[n_calib:], _bert_score
            ),
            _Case(
                "YOLO-style detector",
                static_optimized(_YOLO, folder),
                yolo[:n_calib],
                yolo[n_calib:],
                _yolo_score,
            ),
        ]
        for case in cases:
            for target in TARGETS:
                value, note = _run_case(case, target, folder)
                peer, peer_value = "float", 1.0
                if case.path.name.startswith(_BERT) and target == "zhouyi-x2":
                    peer_value, peer_note = _run_case(case, target, folder, {"ResidualStream16": False})
                    peer = f"recipe without ResidualStream16 ({peer_note})"
                figure = "embedding cosine" if case.path.name.startswith(_BERT) else "min(box, score) cosine"
                out.append(
                    Measurement(
                        f"{case.name} {target}: NPU {figure} vs float; {note}",
                        value,
                        "cos",
                        HIGHER,
                        peer=peer,
                        peer_value=peer_value,
                        target=0.99 if peer == "float" else None,
                        note=note,
                    )
                )
    return out


if __name__ == "__main__":
    import sys

    from bench.runner import main

    sys.exit(main(["traps", *sys.argv[1:]]))
