"""Average pooling: the hardware divides by kh*kw with a multiply and a shift, ``sum * k >> n``.

Rule (vai_q_tensorflow/vai_q_onnx DPU simulation; the factors come from ``[quant.avgpool]``)::

    1/(kh*kw) ~ k / 2^n        3x3: 7/64, 5x5: 10/256, 6x6: 7/256, 7x7: 21/1024, 14x14: 21/4096,
                               else the closest k/2^n (see ``AvgPoolFactor.factor``)
    mean * (kh*kw*k / 2^n)     what the NPU computes; e.g. 3x3: mean * 63/64

When the division is inexact the pass inserts ``Mul(pool_out, kh*kw*k/2^n)`` between the pool and
its output quantizer, so the quantized model computes what the NPU will, and records the factor on the
pool (metadata "zonnx.avgpool_factor" = "k/2^n") and in the changes. A pool whose output already goes
through such a Mul is left alone. GlobalAveragePool needs its input's spatial shape (run shape
inference first); padded windows are scaled like full ones, as the NPU does.

A model with dynamic spatial dimensions (PP-OCR's recognizer reads lines of any width) has no static
window for its global pools, yet the NPU compiles one fixed shape and scales by that window's factor.
``sample_pool_kernels`` reads the windows off the calibration samples' shapes (shape inference with the
inputs fixed to them, when every sample has the same shape); the pass then scales those pools as the NPU
will for inputs of that shape, and says so. Without it the fake-quant model would divide exactly where
the NPU multiplies by ``k/2^n``: on PP-OCRv4 rec for dpu-b4096 (two 6x80 squeeze-excite pools, factor
17/2^13) the two then differ by one code in places at each pool, which grows to a cosine of 0.93 deeper
in (one line), and every recovery step tuned on the fake-quant model aims at the wrong network.
"""

from __future__ import annotations

__all__ = ["AvgPoolFactorPass", "FACTOR_KEY", "sample_pool_kernels", "target_pool_kernels"]

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from zonnx.backend.targets import AvgPoolFactor, Target
from zonnx.passes.base import Changes
from zonnx.passes.fusion.matching import label
from zonnx.quantization.refine.base import DEFAULT_TARGET, RefinePass
from zonnx.quantization.refine.positions import REFINE_MARK, QuantGraph, is_refine_node

logger = logging.getLogger(__name__)

#: Pool metadata key recording the factor "k/2^n" the hardware multiplies the window sum by.
FACTOR_KEY = "zonnx.avgpool_factor"
_MARK_VALUE = "avgpool_factor"
_ALL_STATIC = "every pool's window is static"


def _kernel(node: ir.Node) -> tuple[int, int] | str:
    """(kh, kw) of a 2-D average pool, or why it has none."""
    if node.op_type == "AveragePool":
        kernel = node.attributes.get_ints("kernel_shape")
        if kernel is None or len(kernel) != 2:
            return f"kernel_shape {kernel} is not 2-D"
        return int(kernel[0]), int(kernel[1])
    shape = node.inputs[0].shape
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape[2:]):
        return f"input {node.inputs[0].name!r} has no static 4-D shape ({shape}); run shape-inference first"
    return int(shape[2]), int(shape[3])


class AvgPoolFactorPass(RefinePass):
    """Makes average pools compute the NPU's ``sum * k / 2^n`` instead of the exact mean.

    Acts when the target has ``[quant.avgpool]``. Options: see ``RefinePass``; ``pool_kernels``: the
    window (kh, kw) by pool name for pools whose input shape is not static (``sample_pool_kernels``).
    """

    name = "refine-avgpool-factor"
    rule_key = "avgpool"

    def __init__(
        self,
        target: Target | str | Path = DEFAULT_TARGET,
        *,
        max_sweeps: int = 8,
        pool_kernels: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        super().__init__(target, max_sweeps=max_sweeps)
        self.pool_kernels = dict(pool_kernels or {})

    def sweep(self, model: ir.Model, graph: QuantGraph, rule: AvgPoolFactor, changes: Changes) -> None:
        for node in list(model.graph):
            if node.op_type not in ("AveragePool", "GlobalAveragePool") or node.domain not in ("", "ai.onnx"):
                continue
            out = node.outputs[0]
            if any(
                is_refine_node(c) and c.metadata_props.get(REFINE_MARK) == _MARK_VALUE
                for c in out.consumers()
            ):
                continue
            kernel = _kernel(node)
            where = ""
            if isinstance(kernel, str) and node.name in self.pool_kernels:
                kernel, where = self.pool_kernels[node.name], ", the window of the calibration samples' shape"
            if isinstance(kernel, str):
                changes.miss(f"{label(node)}: {kernel}")
                continue
            kh, kw = kernel
            factor = rule.factor(kh, kw)
            if factor is None:
                continue
            k, n = factor
            scale = kh * kw * k / 2**n
            self._insert(model.graph, graph, node, np.float32(scale))
            node.metadata_props[FACTOR_KEY] = f"{k}/2^{n}"
            changes.add(
                f"{node.op_type} {label(node)} {kh}x{kw}{where}: NPU factor {k}/2^{n} (mean x {scale:.8g})"
            )

    @staticmethod
    def _insert(graph: ir.Graph, index: QuantGraph, pool: ir.Node, scale: np.float32) -> None:
        """Put ``Mul(out, scale)`` between the pool and every reader of its output."""
        out = pool.outputs[0]
        uses = list(out.uses())
        base = pool.name or out.name or "avgpool"
        cname = index.unique_name(f"{base}_npu_factor")
        const = ir.Value(
            name=cname,
            shape=ir.Shape([]),
            type=ir.TensorType(ir.DataType.FLOAT),
            const_value=ir.tensor(np.asarray(scale, np.float32), name=cname),
        )
        graph.register_initializer(const)
        mul = ir.node(
            "Mul",
            [out, const],
            name=index.unique_name(f"{base}_npu_factor_Mul"),
            metadata_props={REFINE_MARK: _MARK_VALUE},
        )
        scaled = mul.outputs[0]
        scaled.name = index.unique_name(f"{out.name}_npu")
        scaled.type, scaled.shape = out.type, out.shape
        graph.insert_after(pool, mul)
        for use in uses:
            use.node.replace_input_with(use.idx, scaled)
        if out.is_graph_output():
            original = out.name
            out.name = index.unique_name(f"{original}_mean")
            graph.outputs[:] = [scaled if o is out else o for o in graph.outputs]
            scaled.name = original


def _declared_dims(model: onnx.ModelProto) -> dict[str, list]:
    """Declared dims by tensor name (value_info and graph inputs), for tensors with a shape."""
    values = (*model.graph.value_info, *model.graph.input)
    return {
        v.name: list(v.type.tensor_type.shape.dim) for v in values if v.type.tensor_type.HasField("shape")
    }


def _window(declared: Mapping[str, list], name: str) -> tuple[int, int] | None:
    """(H, W) of a rank-4 tensor whose spatial dims are static, else None."""
    dims = declared.get(name)
    if dims is None or len(dims) != 4 or not all(d.HasField("dim_value") for d in dims[2:]):
        return None
    return int(dims[2].dim_value), int(dims[3].dim_value)


def sample_pool_kernels(
    float_model: onnx.ModelProto, feeds: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, tuple[int, int]], str]:
    """Rule: the window of every 2-D global average pool whose input's spatial shape the model leaves
    open, as shape inference gives it with the graph inputs fixed to the samples' shapes; ({}, why) when
    the samples differ in shape or the windows cannot be inferred. (An AveragePool's window is its
    ``kernel_shape``; a pool over another rank is not scaled.)"""
    declared = _declared_dims(float_model)
    open_pools = [
        n
        for n in float_model.graph.node
        if n.op_type == "GlobalAveragePool"
        and n.domain in ("", "ai.onnx")
        and len(declared.get(n.input[0], [None] * 4)) == 4  # rank 4, or not declared
        and _window(declared, n.input[0]) is None
    ]
    if not open_pools:
        return {}, _ALL_STATIC
    if not feeds:
        return {}, "no calibration samples were kept"
    shapes = {k: tuple(np.shape(v)) for k, v in feeds[0].items()}
    if any({k: tuple(np.shape(v)) for k, v in f.items()} != shapes for f in feeds[1:]):
        return {}, "the calibration samples differ in shape"
    probe = onnx.ModelProto()
    probe.CopyFrom(float_model)
    del probe.graph.value_info[:]
    for value in probe.graph.input:
        if value.name in shapes:
            input_dims = value.type.tensor_type.shape.dim
            if len(input_dims) != len(shapes[value.name]):
                return (
                    {},
                    f"input {value.name!r} has rank {len(input_dims)} but the samples have "
                    f"{len(shapes[value.name])}",
                )
            for dim, size in zip(input_dims, shapes[value.name], strict=True):
                dim.Clear()
                dim.dim_value = int(size)
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, data_prop=True)
    except Exception as e:  # noqa: BLE001 - any inference failure leaves the pools as they are
        return {}, f"shape inference with the samples' shapes failed: {str(e).splitlines()[0]}"
    found = _declared_dims(inferred)
    kernels = {n.name: w for n in open_pools if (w := _window(found, n.input[0])) is not None}
    return kernels, "" if kernels else "shape inference with the samples' shapes left the windows open"


def target_pool_kernels(
    float_model: onnx.ModelProto, feeds: Sequence[Mapping[str, Any]], target: Target
) -> dict[str, tuple[int, int]]:
    """``sample_pool_kernels`` when ``target`` scales average pools (else {}), said in the log: which
    input shape the scaled pools assume, or, when none could be read, that they stay exact."""
    if not target.quant.avgpool:
        return {}
    kernels, why = sample_pool_kernels(float_model, feeds)
    shapes = ", ".join(
        f"{k}:{','.join(map(str, np.shape(v)))}" for k, v in (feeds[0] if feeds else {}).items()
    )
    if kernels:
        logger.info(
            "%d global average pool(s) with dynamic input shape scaled for %s as for inputs %s (the "
            "calibration samples' shape); compile the model for that shape (--input-shape %s).",
            len(kernels),
            target.name,
            shapes,
            shapes,
        )
    elif why != _ALL_STATIC:
        logger.warning(
            "global average pools with a dynamic input shape divide exactly in the quantized model, but "
            "%s multiplies by a factor that depends on the window (%s); fix the input shape before "
            "quantizing (`zonnx optimize MODEL OUT --input-shape NAME:DIMS`) so the two agree.",
            target.name,
            why,
        )
    return kernels
