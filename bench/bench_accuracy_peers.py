"""Quantization accuracy of zonnx beside NNCF (and AIMET-ONNX), same run, same calibration and test data.

The peers never enter zonnx's environment: each runs in its own virtualenv under ``bench/.peers-venv``
(see ``bench/peer_venv.py``; made on the first run, which then takes a few minutes longer), through a
script in ``bench/peers`` that reads the float model and the calibration feeds (.npz) and writes the
quantized model. A peer that cannot be installed is skipped with the reason printed.

Every model is evaluated here by the same ORT (zonnx's pinned version), CPU provider,
``ORT_ENABLE_BASIC``: QDQ pairs run as float fake-quant and are never fused into integer kernels, so the
figures do not depend on the host's integer kernels (VNNI or not).

Peers get the float model after the preparation zonnx's quantize_static does itself (opset 13, shape
inference, constant folding, no-op removal, BatchNorm folding): PP-OCRv4 rec ships at opset 12 with
weights in Constant nodes, where NNCF would fall back to per-tensor weights. zonnx gets the zoo model.

Metrics: PP-OCRv4 rec, character accuracy (``char_accuracy``) strict and with every space removed from
prediction and truth (spaces between words are the model's weakest output); the trained BERT classifier
(``bert_encoder``), topic accuracy on held-out sentences, the mean cosine of its logits against float's
and the top-1 agreement with float; other models, the mean cosine between the quantized and the float
outputs (all outputs flattened) and the top-1 agreement.
"Act. Q" counts QuantizeLinear nodes whose input is not a constant (initializer or Constant node).
Times are the quantize call only (peers: inside their process, after imports).
"""

from __future__ import annotations

__all__ = ["MODELS", "CONFIGS", "ModelCase", "PeerConfig", "activation_quantizers", "bench_accuracy_peers"]

import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import zonnx
from bench.peer_venv import PEERS, PeerUnavailable, ensure_venv, run_peer, save_feeds
from bench.runner import HIGHER, LOWER, BenchContext, Measurement
from zonnx import zoo
from zonnx.errors import OptionError
from zonnx.quantization.calibration.readers import ListReader
from zonnx.zoo.bert_trained import topic_batch
from zonnx.zoo.text_images import char_accuracy, ctc_greedy_decode, rec_samples

logger = logging.getLogger(__name__)

Feed = dict[str, np.ndarray]
#: "rec": PP-OCR rec character accuracy on rendered lines; "topic": the BERT classifier's topic accuracy
#: and logits against float's; "cosine": outputs against float's.
METRICS = ("rec", "topic", "cosine")


@dataclasses.dataclass(frozen=True)
class ModelCase:
    """A zoo model, its metric (one of METRICS), sample counts."""

    zoo_name: str
    metric: str
    calib: int
    test: int
    quick_calib: int
    quick_test: int

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise OptionError(f"ModelCase {self.zoo_name!r}: metric {self.metric!r} is not one of {METRICS}.")


# ---- The models compared: one line each. A new zoo model with sample inputs needs only a line here,
# ---- e.g. a model compared by output cosine:  ModelCase("<zoo name>", "cosine", 64, 256, 32, 64),
MODELS: list[ModelCase] = [
    ModelCase("ppocr_rec", "rec", calib=48, test=300, quick_calib=48, quick_test=100),
    ModelCase("bert_encoder", "topic", calib=64, test=256, quick_calib=32, quick_test=64),
]


@dataclasses.dataclass(frozen=True)
class PeerConfig:
    """One quantization: zonnx (``peer`` None, ``zonnx`` the quantize_static keywords) or a peer script's flags."""

    label: str
    peer: str | None = None
    flags: tuple[str, ...] = ()
    zonnx: dict[str, Any] = dataclasses.field(default_factory=dict)
    quick: bool = True


ZONNX_DEFAULT = "zonnx default"
NNCF_DEFAULT = "NNCF defaults"
#: The configurations, in table order. quick=False ones run only without --quick.
CONFIGS: list[PeerConfig] = [
    PeerConfig(ZONNX_DEFAULT, zonnx={"per_channel": True, "extra_options": {"QuantPlacement": "kernels"}}),
    PeerConfig(
        "zonnx QuantPlacement=ort", zonnx={"per_channel": True, "extra_options": {"QuantPlacement": "ort"}}
    ),
    PeerConfig(NNCF_DEFAULT, "nncf"),
    PeerConfig(
        "NNCF TRANSFORMER, SmoothQuant off",
        "nncf",
        ("--model-type", "transformer", "--smooth-quant-matmul", "-1"),
        quick=False,
    ),
    PeerConfig("NNCF TRANSFORMER (SmoothQuant MatMul 0.95)", "nncf", ("--model-type", "transformer")),
    PeerConfig("AIMET defaults (min_max)", "aimet"),
    PeerConfig("AIMET tf_enhanced", "aimet", ("--quant-scheme", "tf_enhanced"), quick=False),
]

#: What zonnx's quantize_static does to a model before quantizing (less its own node naming).
PEER_PREP = ("opset-upgrade", "shape-inference", "constant-folding", "remove-noops", "fold-batchnorm")
PEER_PREP += ("dead-code", "shape-inference")


def activation_quantizers(path: Path) -> int:
    """QuantizeLinear nodes whose input is computed (not an initializer nor a Constant node's output)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    constants = {i.name for i in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    return sum(1 for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in constants)


def _session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.intra_op_num_threads = int(os.environ.get("ZONNX_THREADS", "0"))
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _no_spaces(texts: list[str]) -> list[str]:
    return [t.replace(" ", "") for t in texts]


@dataclasses.dataclass
class _Data:
    """A model's calibration feeds, test feeds and what the metric compares against."""

    calib: list[Feed]
    test: list[Feed]
    truth: list[str] | None = None
    float_outputs: list[np.ndarray] | None = None
    topics: np.ndarray | None = None


def _load_data(case: ModelCase, quick: bool) -> _Data:
    n_calib, n_test = (case.quick_calib, case.quick_test) if quick else (case.calib, case.test)
    if case.metric == "rec":
        samples = rec_samples(n_calib + n_test, seed=11)
        return _Data(
            [f for _, f in samples[:n_calib]],
            [f for _, f in samples[n_calib:]],
            [t for t, _ in samples[n_calib:]],
        )
    calib = zoo.sample_inputs(case.zoo_name, n_calib, seed=1)
    if case.metric == "topic":
        batch, topics = topic_batch(n_test, seed=2)
        test = [{k: v[i : i + 1] for k, v in batch.items()} for i in range(n_test)]
        return _Data(calib, test, topics=topics)
    return _Data(calib, zoo.sample_inputs(case.zoo_name, n_test, seed=2))


def _outputs(path: Path, feeds: list[Feed], first_only: bool = False) -> list[np.ndarray]:
    sess = _session(path)
    runs = (sess.run(None, f)[:1] if first_only else sess.run(None, f) for f in feeds)
    return [np.concatenate([o.ravel() for o in outs]).astype(np.float64) for outs in runs]


def _metrics(case: ModelCase, path: Path, data: _Data) -> dict[str, float]:
    if case.metric == "rec":
        sess = _session(path)
        preds = [p for f in data.test for p in ctc_greedy_decode(sess.run(None, f)[0])]
        truth = data.truth or []
        return {
            "char acc": char_accuracy(preds, truth),
            "char acc, no spaces": char_accuracy(_no_spaces(preds), _no_spaces(truth)),
        }
    outs = _outputs(path, data.test, first_only=case.metric == "topic")
    ref = data.float_outputs or []
    extra = {}
    if case.metric == "topic":
        extra["topic acc"] = float(
            np.mean([np.argmax(o) == t for o, t in zip(outs, data.topics, strict=True)])
        )
    cos = [
        float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30)) for a, b in zip(outs, ref, strict=True)
    ]
    agree = [int(np.argmax(a) == np.argmax(b)) for a, b in zip(outs, ref, strict=True)]
    return {**extra, "cosine": float(np.mean(cos)), "top-1 agree": float(np.mean(agree))}


@dataclasses.dataclass
class _Row:
    config: str
    metrics: dict[str, float] | None = None
    act_q: int | None = None
    seconds: float | None = None
    error: str = ""


def _quantize_zonnx(cfg: PeerConfig, src: Path, out: Path, calib: list[Feed]) -> float:
    start = time.perf_counter()
    zonnx.quantize_static(src, out, ListReader(calib), **cfg.zonnx)
    return time.perf_counter() - start


def _run_config(
    cfg: PeerConfig,
    index: int,
    case: ModelCase,
    paths: dict[str, Path],
    data: _Data,
    peer_python: Callable[[str], Path],
    versions: dict[str, str],
) -> _Row:
    out = paths["tmp"] / f"{case.zoo_name}-{index}-{cfg.peer or 'zonnx'}.onnx"
    try:
        if cfg.peer is None:
            seconds = _quantize_zonnx(cfg, paths["float"], out, data.calib)
        else:
            python = peer_python(cfg.peer)
            args = [str(paths["peer_input"]), str(paths["calib"]), str(out), *cfg.flags]
            summary = run_peer(python, PEERS[cfg.peer], args)
            seconds = float(summary["seconds"])
            versions.update({k: str(v) for k, v in summary.items() if k in ("nncf", "aimet_onnx")})
    except PeerUnavailable as e:
        return _Row(cfg.label, error=str(e))
    return _Row(cfg.label, _metrics(case, out, data), activation_quantizers(out), seconds)


def _peer_python_factory() -> tuple[Callable[[str], Path], dict[str, str]]:
    """A function returning each peer's venv interpreter (installed once), and the skip reasons seen."""
    cache: dict[str, Path | PeerUnavailable] = {}
    skipped: dict[str, str] = {}

    def python(name: str) -> Path:
        if name not in cache:
            start = time.perf_counter()
            try:
                cache[name] = ensure_venv(PEERS[name])
                logger.info("peer %s ready in %.0f s", name, time.perf_counter() - start)
            except PeerUnavailable as e:
                cache[name] = e
                skipped[name] = str(e)
                print(f"skipping {name}: {e}")
        found = cache[name]
        if isinstance(found, PeerUnavailable):
            raise found
        return found

    return python, skipped


def _fmt(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _print_table(case: ModelCase, n_calib: int, n_test: int, rows: list[_Row]) -> None:
    names = next((list(r.metrics) for r in rows if r.metrics), [])
    print(f"\n{case.zoo_name}: {n_calib} calibration samples, {n_test} test samples")
    print("| model | configuration | " + " | ".join(names) + " | act. Q | quantize s |")
    print("|---|---|" + "---|" * len(names) + "---|---|")
    for r in rows:
        if r.error:
            print(f"| {case.zoo_name} | {r.config} | failed: {r.error} |")
            continue
        vals = " | ".join(_fmt((r.metrics or {}).get(n)) for n in names)
        print(f"| {case.zoo_name} | {r.config} | {vals} | {r.act_q} | {_fmt(r.seconds, 1)} |")


def _measurements(case: ModelCase, rows: list[_Row]) -> list[Measurement]:
    """Per metric: the metric and its complement (the error: 1 - accuracy or 1 - cosine), zonnx vs NNCF."""
    by = {r.config: r.metrics for r in rows if r.metrics}
    ours, peer = by.get(ZONNX_DEFAULT), by.get(NNCF_DEFAULT)
    if ours is None or peer is None:
        print(f"{case.zoo_name}: no ratio, {ZONNX_DEFAULT!r} or {NNCF_DEFAULT!r} did not run")
        return []
    out = []
    for name, a in ours.items():
        b = peer[name]
        label = f"{case.zoo_name} {{}}: zonnx default vs NNCF default"
        out.append(Measurement(label.format(name), a, name, HIGHER, NNCF_DEFAULT, b))
        out.append(Measurement(label.format(f"1 - {name}"), 1 - a, f"1-{name}", LOWER, NNCF_DEFAULT, 1 - b))
        error_ratio = f"{(1 - a) / (1 - b):.3f}" if b != 1 else "n/a (NNCF error 0)"
        print(
            f"{case.zoo_name}: zonnx default / NNCF default: {name} {a / b:.4f}, (1 - {name}) {error_ratio}"
        )
    return out


def _bench_model(
    case: ModelCase, quick: bool, tmp: Path, peer_python: Callable[[str], Path]
) -> list[Measurement]:
    data = _load_data(case, quick)
    src = Path(zoo.get(case.zoo_name))
    paths = {"tmp": tmp, "float": src, "peer_input": tmp / f"{case.zoo_name}-prepared.onnx"}
    zonnx.save_model(zonnx.optimize(src, opset=13, passes=list(PEER_PREP)), paths["peer_input"])
    paths["calib"] = save_feeds(data.calib, tmp / f"{case.zoo_name}-calib.npz")
    if case.metric != "rec":
        data.float_outputs = _outputs(src, data.test, first_only=case.metric == "topic")
    rows = [_Row("float", _metrics(case, src, data), 0, None)]
    versions: dict[str, str] = {}
    for i, cfg in enumerate(CONFIGS):
        if quick and not cfg.quick:
            continue
        rows.append(_run_config(cfg, i, case, paths, data, peer_python, versions))
        logger.info("%s / %s done", case.zoo_name, cfg.label)
    _print_table(case, len(data.calib), len(data.test), rows)
    print("peers: " + (", ".join(f"{k} {v}" for k, v in sorted(versions.items())) or "none ran"))
    return _measurements(case, rows)


def bench_accuracy_peers(ctx: BenchContext) -> list[Measurement]:
    """zonnx's quantization accuracy beside NNCF's and AIMET's on every model of MODELS."""
    print(
        f"evaluation: onnxruntime {ort.__version__} CPU, ORT_ENABLE_BASIC (QDQ as float fake-quant, no "
        "integer kernels, so host VNNI does not matter); peers get the model after zonnx's own preparation"
    )
    ctx.describe(
        [case.zoo_name for case in MODELS],
        {
            f"{c.zoo_name} {role}": getattr(c, f"quick_{role}" if ctx.quick else role)
            for c in MODELS
            for role in ("calib", "test")
        },
        {"rec lines": 11, "calibration": 1, "test": 2},
    )
    peer_python, skipped = _peer_python_factory()
    out: list[Measurement] = []
    with tempfile.TemporaryDirectory(prefix="zonnx-peers-") as d:
        for case in MODELS:
            out += _bench_model(case, ctx.quick, Path(d), peer_python)
    for name, reason in skipped.items():
        print(f"{name} skipped: {reason}")
    return out
