"""Fidelity of the compiled NPU model against the fake-quantized (QDQ / FixNeuron) model it came from, on
every zoo model and every target, with the float model as the common reference.

Per (model, target): the zoo model (PP-OCR and the transformer with fixed input shapes, then ``zonnx
optimize``) is quantized in the target's form (bm1684x: QDQ int8 symmetric per-channel; zhouyi-x2: QDQ
u8/s8 per-channel; dpu-b4096: FixNeuron power-of-two), compiled with ``compile_model`` and run through
``zonnx.InferenceSession`` (NPU provider, ORT-native lowering; the numpy reference executor when the
lowering refuses a program, said in the note). The peer is plain ORT running the quantized model with
graph optimizations off (ORT's QDQ fusions would change its rounding): the model's own semantics.

Figures per output: the largest difference in output codes (LSB of the output's quantization grid; a
float output computed on the CPU after the NPU is compared in absolute value), how many codes differ;
per layer, each NPU op run (numpy reference) on the QDQ model's own input codes against the QDQ
model's output codes (``layer max``: where only the target's rounding differs from ORT's); cosine of
NPU and QDQ outputs against the float model; the NPU share of MACs. Task level: digits top-1 on the
450-image test set (float, QDQ, NPU), the trained BERT's topic accuracy on 128 held-out sentences and
PP-OCRv4 rec character accuracy on rendered lines. ``*-random`` models have untrained weights: their
LSB figures check exactness, their cosine is quantization error on an untrained network.

Run alone: ``python -m bench.bench_npu_fidelity [--quick] [--markdown]``.
"""

from __future__ import annotations

__all__ = [
    "bench_npu_fidelity",
    "FORMS",
    "MODELS",
    "STATIC_INPUTS",
    "static_model",
    "zoo_feeds",
    "quantize_zoo",
    "boundary_codes",
    "codes_of",
    "layer_diffs",
    "output_scales",
]

import dataclasses
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantFormat, QuantType

import zonnx
from bench.runner import HIGHER, LOWER, REGISTRY, BenchContext, Benchmark, Measurement, main
from zonnx import zoo
from zonnx.backend.compile_api import CompiledModel, compile_model
from zonnx.backend.compiler import Program, TensorInfo
from zonnx.backend.runtime.reference import execute_op
from zonnx.errors import ZonnxError
from zonnx.inspection.macs import fix_input_shapes
from zonnx.quantization.calibration.readers import ListReader
from zonnx.verify import cosine
from zonnx.zoo.digits import digits_data

logger = logging.getLogger(__name__)

NPU = ["ZonnxNPUExecutionProvider", "CPUExecutionProvider"]
#: target -> the quantized form compiled for it.
FORMS = {"bm1684x": "qdq_sym", "zhouyi-x2": "qdq", "dpu-b4096": "fix"}
MODELS = [
    "digits_cnn",
    "resnet18-random",
    "mobilenetv2-random",
    "bert_encoder",
    "yolo_det",
    "ppocr_det",
    "ppocr_rec",
    "ppocr_cls",
]
#: Zoo models with symbolic input dims: the fixed input shape compiled (the NPU compiles static shapes).
STATIC_INPUTS = {
    "ppocr_rec": ("x", (1, 3, 48, 320)),
    "ppocr_cls": ("x", (1, 3, 48, 192)),
    "ppocr_det": ("x", (1, 3, 160, 320)),
    "transformer-random": ("input_ids", (1, 32)),
    "bert_encoder": ("input_ids", (1, 64)),  # attention_mask shares its dims
}


def static_model(name: str, folder: Path, shape: Sequence[int] | None = None) -> Path:
    """The zoo model with its input dims fixed (``STATIC_INPUTS`` or ``shape``) and ``zonnx.optimize``-d."""
    if name not in STATIC_INPUTS:
        return zoo.get(name)
    input_name, default = STATIC_INPUTS[name]
    dims = tuple(shape or default)
    out = folder / f"{name}_{'x'.join(map(str, dims))}.onnx"
    if not out.exists():
        model = onnx.load(zoo.get(name))
        fix_input_shapes(model, 1, {input_name: dims})
        onnx.save(zonnx.optimize(model), out)
    return out


def _fit(x: np.ndarray, width: int) -> np.ndarray:
    """Crop or zero-pad the last axis to ``width`` (rec lines vary in width)."""
    x = x[..., :width]
    if x.shape[-1] < width:
        x = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])])
    return np.ascontiguousarray(x)


def zoo_feeds(name: str, n: int, seed: int = 0, shape: Sequence[int] | None = None) -> list[dict]:
    """``zoo.sample_inputs`` fitted to the static input shape (rec lines cropped or padded)."""
    feeds = zoo.sample_inputs(name, n, seed=seed)
    if name not in STATIC_INPUTS:
        return feeds
    input_name, default = STATIC_INPUTS[name]
    width = tuple(shape or default)[-1]
    return [{k: _fit(v, width) for k, v in f.items()} for f in feeds]


def quantize_zoo(
    name: str, form: str, folder: Path, n_calib: int = 4, shape: Sequence[int] | None = None
) -> Path:
    """The zoo model quantized in ``form`` ("qdq_sym", "qdq", "fix") from ``n_calib`` sample inputs."""
    out = folder / f"{name}_{form}{'_' + 'x'.join(map(str, shape)) if shape else ''}.onnx"
    if out.exists():
        return out
    if form == "fix":
        args = dict(
            quant_format=zonnx.VitisQuantFormat.FixNeuron,
            calibrate_method=zonnx.PowerOfTwoMethod.NonOverflow,
            extra_options={"Target": "dpu-b4096"},
        )
    else:
        args = dict(
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QInt8 if form == "qdq_sym" else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            extra_options={"ActivationSymmetric": True} if form == "qdq_sym" else {},
        )
    src = static_model(name, folder, shape)
    zonnx.quantize_static(str(src), str(out), ListReader(zoo_feeds(name, n_calib, 1, shape)), **args)
    return out


def _ort(model: onnx.ModelProto | Path, opt: bool = False) -> ort.InferenceSession:
    so = ort.SessionOptions()
    if not opt:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def boundary_codes(qpath: Path, names: Sequence[str], feed: dict) -> dict[str, np.ndarray]:
    """The quantized model's values of the tensors ``names`` (those it has) on ``feed``, optimizations off."""
    model = onnx.load(qpath)
    have = {o for n in model.graph.node for o in n.output}
    wanted = [t for t in dict.fromkeys(names) if t in have]
    known = {o.name for o in model.graph.output}
    for t in wanted:
        if t not in known:
            model.graph.output.append(onnx.helper.make_value_info(t, onnx.TypeProto()))
    sess = _ort(model)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed), strict=True))


def codes_of(v: np.ndarray, info: TensorInfo) -> np.ndarray:
    """Integer codes of a tensor the model holds as codes, or as floats on its grid (a FixNeuron output,
    or a code op's float output in a QDQ model): ``rint(v / S) + Z``."""
    if v.dtype.kind != "f":
        return v.astype(np.int64)
    return np.rint(v / info.scale[0]).astype(np.int64) + info.zero_point[0]


def layer_diffs(programs: list[Program], values: dict[str, np.ndarray]) -> tuple[int, int, int]:
    """(max |diff|, codes differing, codes) over the NPU ops whose inputs and output the QDQ model has."""
    worst, diff, total = 0, 0, 0
    for prog in programs:
        codes = {
            t: codes_of(values[t], prog.tensors[t])
            for t in prog.tensors
            if t in values and prog.tensors[t].axis is None
        }
        for op in prog.ops:
            if op.outputs[0] in codes and all(i in codes for i in op.inputs):
                d = np.abs(execute_op(op, [codes[i] for i in op.inputs]) - codes[op.outputs[0]])
                worst, diff, total = (
                    max(worst, int(d.max(initial=0))),
                    diff + int((d > 0).sum()),
                    total + d.size,
                )
    return worst, diff, total


def output_scales(qpath: Path) -> dict[str, float | None]:
    """Each graph output's grid step (its DequantizeLinear / FixNeuron), None for a float CPU result."""
    model = onnx.load(qpath)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    prod = {o: n for n in model.graph.node for o in n.output}
    out: dict[str, float | None] = {}
    for o in model.graph.output:
        node = prod.get(o.name)
        scale = None
        if node is not None and node.op_type == "DequantizeLinear" and node.input[1] in inits:
            s = inits[node.input[1]]
            scale = float(s.reshape(-1)[0]) if s.size == 1 else None
        elif node is not None and node.op_type == "FixNeuron":
            pos = next(a.i for a in node.attribute if a.name == "pos")
            scale = 2.0**-pos
        out[o.name] = scale
    return out


@dataclasses.dataclass
class _Case:
    model: str
    target: str
    compiled: CompiledModel
    qpath: Path
    executor: str


def _session(case: _Case, cache: Path) -> zonnx.InferenceSession:
    data = case.compiled.model.SerializeToString()
    for executor in ("ort", "reference"):
        opts = {"target": case.target, "cache_dir": str(cache), "executor": executor}
        try:
            sess = zonnx.InferenceSession(data, providers=NPU, provider_options=[opts, {}])
            case.executor = executor
            return sess
        except ZonnxError as e:
            logger.warning("%s %s: executor %s refused (%s)", case.model, case.target, executor, e)
            last = e
    raise last


def _measure(case: _Case, fpath: Path, feeds: list[dict], cache: Path) -> list[Measurement]:
    label = f"{case.model} {case.target}"
    try:
        npu = _session(case, cache)
    except ZonnxError as e:  # reported as a failed row, the other cases still run
        return [
            Measurement(f"{label}: compiled model runs", 0.0, "ok", HIGHER, target=1.0, note=str(e)[:300])
        ]
    qdq, flt = _ort(case.qpath), _ort(fpath, opt=True)
    names = [o.name for o in qdq.get_outputs()]
    scales = output_scales(case.qpath)
    got = {n: [] for n in names}
    for feed in feeds:
        for store, sess in (("npu", npu), ("qdq", qdq), ("float", flt)):
            for n, v in zip(names, sess.run(names, feed), strict=True):
                got[n].append((store, np.asarray(v, np.float64)))
    programs = case.compiled.programs
    tensors = [t for p in programs for t in p.tensors]
    worst, ldiff, ltotal = 0, 0, 0
    for feed in feeds:
        w, d, t = layer_diffs(programs, boundary_codes(case.qpath, tensors, feed))
        worst, ldiff, ltotal = max(worst, w), ldiff + d, ltotal + t
    share = case.compiled.partition.mac_share
    where = f"executor {case.executor}"
    out = []
    for n in names:
        a = np.concatenate([v.ravel() for s, v in got[n] if s == "npu"])
        b = np.concatenate([v.ravel() for s, v in got[n] if s == "qdq"])
        f = np.concatenate([v.ravel() for s, v in got[n] if s == "float"])
        scale = scales.get(n)
        if scale is not None:
            delta = np.abs(np.rint(a / scale) - np.rint(b / scale))
            value, unit = float(delta.max(initial=0)), "LSB"
        else:
            delta = np.abs(a - b)
            value, unit = float(delta.max(initial=0)), "abs (float output)"
        differ = int((delta > 0).sum())
        out += [
            Measurement(f"{label} {n}: max diff vs QDQ", value, unit, LOWER, note=where),
            Measurement(
                f"{label} {n}: outputs differing from QDQ ({differ} of {delta.size})",
                differ / max(delta.size, 1),
                "share",
                LOWER,
                note=where,
            ),
            Measurement(
                f"{label} {n}: cosine vs float",
                cosine(a, f),
                "cos",
                HIGHER,
                "ORT QDQ",
                cosine(b, f),
                0.99,
                where,
            ),
        ]
    out += [
        Measurement(
            f"{label}: layer max diff vs QDQ ({ldiff} of {ltotal} codes differ)",
            float(worst),
            "LSB",
            LOWER,
            target=1.0,
            note=where,
        ),
        Measurement(f"{label}: NPU share of MACs", share, "share", HIGHER, note=where),
    ]
    return out


def _digits_top1(case: _Case, cache: Path) -> Measurement:
    x, y = digits_data("test")
    npu = _session(case, cache)
    top = lambda s: float(np.mean(np.argmax(s.run(None, {"input": x})[0], axis=1) == y))  # noqa: E731
    acc_npu, acc_qdq, acc_f = top(npu), top(_ort(case.qpath)), top(_ort(zoo.get("digits_cnn"), opt=True))
    note = f"QDQ {acc_qdq:.4f}; 450 test images; executor {case.executor}"
    return Measurement(
        f"digits_cnn {case.target}: top-1", acc_npu, "acc", HIGHER, "float", acc_f, target=0.98, note=note
    )


def _topic_accuracy(case: _Case, fpath: Path, cache: Path, n: int) -> Measurement:
    from zonnx.zoo.bert_trained import topic_batch

    batch, topics = topic_batch(n, seed=3)
    feeds = [{k: v[i : i + 1] for k, v in batch.items()} for i in range(n)]
    npu = _session(case, cache)

    def acc(sess: ort.InferenceSession | zonnx.InferenceSession) -> float:
        return float(
            np.mean([np.argmax(sess.run(None, f)[0]) == t for f, t in zip(feeds, topics, strict=True)])
        )

    acc_npu, acc_qdq, acc_f = acc(npu), acc(_ort(case.qpath)), acc(_ort(fpath, opt=True))
    note = f"QDQ {acc_qdq:.4f}; {n} held-out sentences; executor {case.executor}"
    return Measurement(
        f"bert_encoder {case.target}: topic accuracy (QDQ {acc_qdq:.4f})",
        acc_npu,
        "acc",
        HIGHER,
        "float",
        acc_f,
        note=note,
    )


def _rec_accuracy(case: _Case, fpath: Path, cache: Path, n: int) -> Measurement:
    from zonnx.zoo.text_images import char_accuracy, ctc_greedy_decode, rec_samples

    width = STATIC_INPUTS["ppocr_rec"][1][-1]
    samples = [(t, {"x": _fit(f["x"], width)}) for t, f in rec_samples(n, seed=11)]
    truth = [t for t, _ in samples]
    npu = _session(case, cache)
    read = lambda s: [ctc_greedy_decode(s.run(None, f)[0])[0] for _, f in samples]  # noqa: E731
    acc_npu, acc_qdq, acc_f = (
        char_accuracy(read(s), truth) for s in (npu, _ort(case.qpath), _ort(fpath, opt=True))
    )
    note = f"QDQ {acc_qdq:.4f}; {n} rendered lines cropped/padded to width {width}; executor {case.executor}"
    return Measurement(
        f"ppocr_rec {case.target}: char accuracy", acc_npu, "acc", HIGHER, "float", acc_f, note=note
    )


def bench_npu_fidelity(ctx: BenchContext) -> list[Measurement]:
    """NPU vs QDQ output differences (LSB), cosine vs float and NPU MAC share per zoo model and target."""
    models = ["digits_cnn", "mobilenetv2-random"] if ctx.quick else MODELS
    n_eval = 1 if ctx.quick else 2
    ctx.describe(models, {"evaluated inputs per model": n_eval}, {"inputs": 0, "rec lines": 11})
    results: list[Measurement] = []
    with tempfile.TemporaryDirectory(prefix="zonnx-npu-fidelity-") as d:
        folder = Path(d)
        for name in models:
            fpath = static_model(name, folder)
            feeds = zoo_feeds(name, n_eval, seed=5)
            for target, form in FORMS.items():
                try:
                    qpath = quantize_zoo(name, form, folder)
                    case = _Case(name, target, compile_model(qpath, target), qpath, "")
                except ZonnxError as e:  # a failed row; the other models and targets still run
                    logger.warning("%s %s: %s", name, target, e)
                    failed = f"{name} {target}: quantize ({form}) and compile: failed: {e}"[:300]
                    results.append(Measurement(failed, 0.0, "ok", HIGHER, target=1.0, note=str(e)[:300]))
                    continue
                results += _measure(case, fpath, feeds, folder / "cache")
                if name == "digits_cnn" and case.executor:  # executor is empty when the session failed
                    results.append(_digits_top1(case, folder / "cache"))
                if name == "bert_encoder" and case.executor:
                    results.append(_topic_accuracy(case, fpath, folder / "cache", 32 if ctx.quick else 128))
                if name == "ppocr_rec" and case.executor and not ctx.quick:
                    results.append(_rec_accuracy(case, fpath, folder / "cache", 16))
    return results


if __name__ == "__main__":
    entry = Benchmark("npu_fidelity", bench_npu_fidelity, "NPU vs QDQ fidelity on every zoo model and target")
    sys.exit(main(["npu_fidelity", *sys.argv[1:]], {**REGISTRY, entry.name: entry}))
