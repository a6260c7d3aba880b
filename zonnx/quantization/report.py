"""Per-layer accuracy of a quantized model: each quantized activation against its float tensor, worst first.

Which quantized value is compared with which float tensor: ``report_trace`` (its docstring holds the
rules).

Metrics over all samples, streamed as float64 sums (x float, q dequantized, e = x - q):
cosine ``sum(xq) / sqrt(sum(x^2) sum(q^2))`` (1 when both are zero); SQNR
``10 log10(sum(x^2) / sum(e^2))`` dB (inf when e is zero); TPU-MLIR's euclidean similarity
``1 - ||e|| / ||(x + q) / 2||``; max and mean of |e|. Non-finite elements count in ``nonfinite`` and are
compared as 0 (as TPU-MLIR's npz compare does). Both models run with ORT's graph optimizations off, as
written.
"""

from __future__ import annotations

__all__ = ["TensorStats", "LayerReport", "layer_report", "REPORT_VERSION"]

import itertools
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from zonnx.errors import OptionError, VerificationError, first_line
from zonnx.ir.io import ModelLike, load_proto, to_proto
from zonnx.ir.large import deserialize
from zonnx.quantization.report_render import REPORT_VERSION, LayerReport, MetricSums, TensorStats
from zonnx.quantization.report_trace import Match, Tracer, dequantize_codes
from zonnx.verify import exact_integer_form

logger = logging.getLogger(__name__)


def _session(
    proto: onnx.ModelProto, extra: Iterable[str], providers: Sequence[str], what: str
) -> ort.InferenceSession:
    """A session (optimizations off: the graph runs as written) with ``extra`` values as added outputs."""
    proto = exact_integer_form(proto)  # QOperator ops: exact on every host (zonnx.hostcpu)
    keep = len(proto.graph.output)
    have = {o.name for o in proto.graph.output}
    proto.graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(extra) if n not in have)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    # no spin-waiting between ops: on a loaded host ORT's spinning threads took the CPU that the Python
    # work between runs needs; same threads and work split, so the same values
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = int(os.environ.get("ZONNX_THREADS", "0"))
    from zonnx.ir.large import ort_session

    try:
        return ort_session(proto, opts, providers, weights_as_values=True)  # weights not serialized
    except Exception as e:  # ORT's exception classes share no public base
        raise VerificationError(f"{what}: onnxruntime cannot load it ({first_line(e)}).") from None
    finally:
        del proto.graph.output[keep:]


def _run(
    sess: ort.InferenceSession, sample: Mapping[str, np.ndarray], order: list[str], what: str, index: int
) -> dict[str, np.ndarray]:
    """Run one sample (inputs by name, else by the float model's input order); outputs and inputs by name."""
    feeds = {}
    for i, inp in enumerate(sess.get_inputs()):
        key = inp.name if inp.name in sample else (order[i] if i < len(order) else None)
        if key not in sample:
            raise OptionError(
                f"sample {index}: no value for input {inp.name!r} of the {what}; "
                f"the sample has {sorted(sample)}."
            )
        feeds[inp.name] = np.asarray(sample[key])
    names = [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, feeds)
    except Exception as e:
        raise VerificationError(f"sample {index}: the {what} failed to run ({first_line(e)}).") from None
    return {**feeds, **dict(zip(names, values, strict=True))}


def _samples(feeds_list: Any, max_samples: int) -> Iterable[Mapping[str, np.ndarray]]:
    if max_samples < 1:
        raise OptionError(f"max_samples={max_samples}: compare at least 1 sample.")
    if hasattr(feeds_list, "get_next"):  # a CalibrationDataReader
        return itertools.islice(iter(feeds_list.get_next, None), max_samples)
    return itertools.islice(feeds_list, max_samples)


def _load(model: ModelLike) -> tuple[onnx.ModelProto, str | None]:
    if isinstance(model, str | os.PathLike):
        return load_proto(model), str(model)
    return to_proto(model), None


def layer_report(
    float_model: ModelLike,
    quant_model: ModelLike,
    feeds_list: Any,
    *,
    max_samples: int = 4,
    providers: Sequence[str] = ("CPUExecutionProvider",),
) -> LayerReport:
    """Compare every quantized activation of ``quant_model`` with its float tensor on a few samples.

    ``feeds_list`` is an iterable of input dicts (shapes may differ between samples) or a
    CalibrationDataReader; the first ``max_samples`` are used. Each model runs once per sample in one
    session, with the matched tensors as extra outputs. See the module docstring for the rules.
    """
    fproto, fpath = _load(float_model)
    qproto, qpath = _load(quant_model)
    fmodel, qmodel = deserialize(fproto), deserialize(qproto)  # reads files a mapped model names
    tracer = Tracer(fmodel, qmodel)
    matches = tracer.run()
    fouts, qouts = [o.name for o in fmodel.graph.outputs], [o.name for o in qmodel.graph.outputs]
    pairs = [(f, f if f in qouts else qouts[i]) for i, f in enumerate(fouts) if f in qouts or i < len(qouts)]
    fsess = _session(
        fproto, [m.tensor for m in matches if m.tensor not in tracer.inputs], providers, "float model"
    )
    qsess = _session(qproto, [m.value for m in matches], providers, "quantized model")

    def entry(tensor: str, value: str, via: str) -> TensorStats:
        node = tracer.producer.get(tensor)
        if node is None:
            return TensorStats(tensor, value, "", "input", via)
        return TensorStats(tensor, value, node.name or "", node.op_type, via)

    items = [(m, entry(m.tensor, m.value, m.via), MetricSums()) for m in matches]
    n_layers = len(items)
    items += [(Match(f, q, "output"), entry(f, q, "output"), MetricSums()) for f, q in pairs]
    skipped: dict[int, str] = {}  # item index -> reason

    def fold(fvals: dict[str, np.ndarray], qvals: dict[str, np.ndarray]) -> None:
        for i, (match, stats, sums) in enumerate(items):
            if i in skipped:
                continue
            x, q = fvals[match.tensor], qvals[match.value]
            q = dequantize_codes(q, match.params) if match.params is not None else q
            reason = (
                "is not float"
                if x.dtype.kind != "f" or q.dtype.kind != "f"
                else f"shapes differ ({list(x.shape)} vs {list(q.shape)})"
                if x.shape != q.shape
                else ""
            )
            if reason:
                skipped[i] = f"tensor {match.tensor!r} vs {match.value!r}: {reason}"
                continue
            stats.shape = list(x.shape)
            sums.update(x, q)

    samples = 0
    # a sample's metrics are folded in a worker thread while the next sample runs (ORT and numpy release
    # the GIL); one fold at a time, in sample order, so the sums are those of a serial loop
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="zonnx-report") as pool:
        pending = None
        for index, sample in enumerate(_samples(feeds_list, max_samples)):
            fvals = _run(fsess, sample, tracer.inputs, "float model", index)
            qvals = _run(qsess, sample, tracer.inputs, "quantized model", index)
            samples += 1
            if pending is not None:
                pending.result()
            pending = pool.submit(fold, fvals, qvals)
            del fvals, qvals
        if pending is not None:
            pending.result()
    if samples == 0:
        raise OptionError("feeds_list gave no samples; pass at least one input dict.")
    kept = [sums.fill(stats) for i, (_, stats, sums) in enumerate(items) if i not in skipped]
    ranked = sorted(
        kept[: n_layers - sum(i < n_layers for i in skipped)], key=lambda s: (s.sqnr_db, s.cosine, s.tensor)
    )
    final = kept[len(ranked) :]
    logger.info(
        "layer report: %d tensors on %d samples; worst %s",
        len(ranked),
        samples,
        ranked[0].tensor if ranked else "-",
    )
    return LayerReport(
        samples, ranked, final, tracer.unmatched, [skipped[i] for i in sorted(skipped)], fpath, qpath
    )
