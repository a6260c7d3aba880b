"""From the call's resolved options (``QuantConfig``) to the op rules' ``AnnotateConfig``.

- Activation and weight specs: symmetric int8/int16 use the restricted range (ORT); power of two keeps
  the full range; ``WeightSymmetric=None`` means symmetric for signed weight types (ORT's rule);
  ActivationRestrictedAsymmetric and MinimumRealRange ride on the specs.
- Per-node and per-op-type overrides (config files) become per-node specs; excluded nodes include
  those outside vai_q_onnx's input_nodes/output_nodes.
- ORT's activation rules: a removable Relu/Clip is removed with asymmetric activations and no target
  (not for bfloat16 or power of two); with symmetric ones it stays between two quantized tensors (QDQ)
  or runs in float (QOperator); with a target (or power of two) Relu/Clip after a linear op fuse.
"""

from __future__ import annotations

__all__ = ["annotate_config", "nodes_between", "npu_op_types"]

import dataclasses
from collections.abc import Iterable

import onnx_ir as ir

from zonnx.quantization.annotate import AnnotateConfig
from zonnx.quantization.config import QuantConfig, resolve_type
from zonnx.quantization.enums import QuantFormat
from zonnx.quantization.op_rules import QUANTIZABLE_OPS
from zonnx.quantization.schemes import QuantSpec, qdtype
from zonnx.quantization.traps import residual_stream_nodes


def _int_type(type_name: str) -> str:
    return type_name if type_name != "bfloat16" else "int8"


def _spec(type_name: str, symmetric: bool, restricted: bool | None, cfg: QuantConfig) -> QuantSpec:
    """Symmetric int8/int16 default to the restricted range [-(2^(b-1)-1), 2^(b-1)-1] (ORT; int4 keeps its
    full range); power of two keeps the full range."""
    dtype = qdtype(type_name if type_name != "bfloat16" else "int8")
    symmetric = symmetric or cfg.power_of_two
    if restricted is None:
        restricted = symmetric and dtype.name in ("int8", "int16") and not cfg.power_of_two
    return QuantSpec(dtype, symmetric=symmetric, restricted=restricted, power_of_two=cfg.power_of_two)


def annotate_config(model: ir.Model, cfg: QuantConfig) -> AnnotateConfig:
    """The op rules' configuration for this call: default specs, node overrides, ORT's rule switches."""
    extra = cfg.extra
    act = dataclasses.replace(
        _spec(cfg.activation_type, extra.activation_symmetric, extra.activation_restricted_range, cfg),
        snap_zero_point=extra.activation_restricted_asymmetric,
        min_real_range=extra.minimum_real_range,
    )
    wt = dataclasses.replace(
        _spec(
            cfg.weight_type,
            qdtype(_int_type(cfg.weight_type)).signed
            if extra.weight_symmetric is None
            else extra.weight_symmetric,
            extra.weight_restricted_range,
            cfg,
        ),
        reduce_range=cfg.reduce_range,
        min_real_range=extra.minimum_real_range,
    )
    excluded = set(cfg.nodes_to_exclude) | nodes_between(model, cfg.input_nodes, cfg.output_nodes)
    node_act, node_wt = {}, {}
    op_types = set(cfg.op_types_to_quantize or QUANTIZABLE_OPS)
    stream = set(residual_stream_nodes(model)) if cfg.extra.residual_stream_16 else set()
    for node in model.graph:
        override = {**cfg.op_type_overrides.get(node.op_type, {}), **cfg.node_overrides.get(node.name, {})}
        if node.name in stream:  # ResidualStream16: LayerNorm and the Adds feeding it take int16
            override = {"activation_type": "int16", **override}
        if override.get("exclude"):
            excluded.add(node.name)
        if "activation_type" in override:
            node_act[node.name] = dataclasses.replace(
                act,
                dtype=qdtype(resolve_type(override["activation_type"], f"node {node.name} activation_type")),
            )
        if "weight_type" in override:
            node_wt[node.name] = dataclasses.replace(
                wt, dtype=qdtype(resolve_type(override["weight_type"], f"node {node.name} weight_type"))
            )
    return AnnotateConfig(
        activation=act,
        weight=wt,
        per_channel=cfg.per_channel,
        op_types=frozenset(op_types),
        nodes_to_quantize=frozenset(cfg.nodes_to_quantize),
        nodes_to_exclude=frozenset(excluded),
        matmul_const_b_only=extra.matmul_const_b_only,
        force_quantize_no_input_check=extra.force_quantize_no_input_check,
        exclude_output_op_types=frozenset(extra.op_types_to_exclude_output_quantization),
        keep_removable_activations=extra.keep_removable_activations,
        per_channel_axis=dict(extra.per_channel_axis),
        node_activation=node_act,
        node_weight=node_wt,
        placement=extra.quant_placement,
        qoperator=cfg.quant_format == QuantFormat.QOperator,
        remove_activations=not extra.activation_symmetric
        and not cfg.power_of_two
        and cfg.activation_type != "bfloat16"  # a Cast pair does not clip
        and not extra.target
        and extra.quant_placement == "ort",
        # a target (or power of two) fuses Relu/Clip into the op before; without one, symmetric
        # activations take ORT's layout: the Relu/Clip stays, its input and output quantized (QDQ)
        fuse_activations=bool(extra.target) or cfg.power_of_two,
        float_activations=cfg.quant_format == QuantFormat.QOperator
        and extra.activation_symmetric
        and not extra.target
        and not cfg.power_of_two,
        npu_ops=npu_op_types(extra.target) if extra.target else frozenset(),
    )


def npu_op_types(target_name: str) -> frozenset[str]:
    """The ONNX op types ``target_name``'s NPU runs (its op table) or fuses into them (their activations)."""
    from zonnx.backend.targets import load_target
    from zonnx.quantization.refine.base import fused_activations

    target = load_target(target_name)
    ops = {op for row in target.ops.values() for op in row.onnx}
    return frozenset(ops.union(*(fused_activations(target, op) for op in ops)))


def nodes_between(model: ir.Model, input_nodes: Iterable[str], output_nodes: Iterable[str]) -> set[str]:
    """vai_q_onnx's input_nodes/output_nodes: names of nodes before the first start node or after the
    last end node in topological order (the boundary nodes themselves stay quantizable)."""
    order = [n.name for n in model.graph]
    starts = [order.index(n) for n in input_nodes if n in order]
    ends = [order.index(n) for n in output_nodes if n in order]
    excluded: set[str] = set()
    if starts:
        excluded.update(order[: min(starts)])
    if ends:
        excluded.update(order[max(ends) + 1 :])
    return excluded
