"""No silent collapse: judge a quantized model by its output similarity on the samples it kept.

Rule: when any model output's cosine against float (over the report's samples) is below the threshold
(``extra_options["WarnBelowCosine"]``, default 0.99), the run says so in one warning that names the
output, the first tensors in the float model's topological order whose cosine is below the threshold
(where the loss starts, not where it is largest), and what to try, limited to what this call can
change: the "kernels" placement without a target, 16-bit activations (when the target has them),
leaving the named nodes float (``--exclude``), the accuracy-budget search, and ``zonnx compare``.
"""

from __future__ import annotations

__all__ = ["similarity_warning", "first_divergent"]

import onnx

from zonnx.quantization.report_render import LayerReport, TensorStats


def first_divergent(
    report: LayerReport, float_model: onnx.ModelProto, threshold: float, limit: int = 3
) -> list[TensorStats]:
    """The first ``limit`` reported tensors, in the float model's node order, with cosine < threshold."""
    order = {out: i for i, node in enumerate(float_model.graph.node) for out in node.output}
    low = [s for s in report.layers if s.cosine < threshold]
    return sorted(low, key=lambda s: (order.get(s.tensor, -1), s.tensor))[:limit]


def similarity_warning(
    report: LayerReport,
    float_model: onnx.ModelProto,
    threshold: float,
    *,
    target: str | None,
    placement: str,
    int16: bool = False,
) -> str | None:
    """One warning line when an output's cosine is below ``threshold``; None when every output holds."""
    worst = min(report.outputs, key=lambda s: s.cosine, default=None)
    if worst is None or worst.cosine >= threshold:
        return None
    first = first_divergent(report, float_model, threshold)
    where = ", ".join(f"{s.tensor} ({s.op_type} {s.node}, cosine {s.cosine:.3f})" for s in first)
    fixes = []
    if target is None and placement != "kernels":
        fixes.append("quantize only what integer kernels read (extra_options QuantPlacement='kernels')")
    if target is not None and int16:
        fixes.append("16-bit activations for those nodes (--config with per-node activation_type int16)")
    fixes.append("`zonnx quantize ... --accuracy-budget 1` to find the fewest layers to raise")
    if first:
        fixes.append(f"leave {', '.join(repr(s.node) for s in first if s.node)} float (--exclude)")
    fixes.append("`zonnx compare FLOAT QUANT --inputs X.npz` to see every tensor")
    return (
        f"quantized output {worst.tensor!r} has cosine {worst.cosine:.4f} against float on {report.samples} "
        f"{'held-out' if report.data.startswith('held out') else 'calibration'} sample(s), below {threshold}"
        + (f"; similarity first falls at {where}" if where else "")
        + "; try: "
        + "; ".join(fixes)
        + "."
    )
