"""Fuse each residual add into the native ``QConv`` that produces one of its inputs (a peephole over lowered nodes).

Rule: a ``QConv`` whose output is read by exactly one node, a two-term ``RequantU8`` (the lowered ``add``, or
any two-term uint8 requantization), and is not a graph output, while the add's other input is a uint8
tensor, becomes one ``QConv`` with that tensor as its input 2 and the add's requantization as its ``add_*``
attributes (``residual_qconv_attrs``): the conv's own requantization runs first, exactly as
before, then the add's rule on each output row while it is in cache, so the outputs are bit-identical and
the conv's uint8 tensor never reaches memory. The fused node takes the add's place in the node order (its
inputs are all computed by then) and the add's output name.
"""

from __future__ import annotations

__all__ = ["fuse_residual_adds", "residual_qconv_attrs"]

import collections
import logging
from collections.abc import Iterable

import onnx
from onnx import helper

from zonnx.backend.compiler.params import node_attrs

from .ort_native import NATIVE_DOMAIN

logger = logging.getLogger(__name__)


def residual_qconv_attrs(requant: dict, conv_term: int, channels: int) -> dict | None:
    """The ``add_*`` attributes of a QConv with ``channels`` outputs that applies the two-term ``RequantU8``
    attributes ``requant`` (``native_requant_attrs``) with the conv output as term ``conv_term`` (0 or 1);
    None when the fused form cannot take them: not two terms, int128 products, or per-channel parameters
    along another axis than C or of another count."""
    if requant["terms"] != 2 or requant["wide"] or conv_term not in (0, 1):
        return None
    n = len(requant["cnst"])
    if n not in (1, channels) or (n > 1 and requant["caxis_from_end"] != 0):
        return None
    if len(requant["shift"]) != n or len(requant["mult"]) != 2 * n:
        return None
    mult = list(requant["mult"])
    m_conv, m_skip = (
        mult[conv_term * n : (conv_term + 1) * n],
        mult[(1 - conv_term) * n : (2 - conv_term) * n],
    )
    return {
        "add_mult": m_conv + m_skip,
        "add_cnst": list(requant["cnst"]),
        "add_shift": list(requant["shift"]),
        **{f"add_{k}": int(requant[k]) for k in ("mode", "zs", "lo", "hi")},
    }


def _fused(conv: onnx.NodeProto, add: onnx.NodeProto, uint8: set[str]) -> onnx.NodeProto | None:
    """The QConv computing ``add`` of ``conv``'s output, or None when the rule (module docstring) refuses."""
    if len(add.input) != 2 or add.input[0] == add.input[1] or len(conv.input) != 2:
        return None
    term = list(add.input).index(conv.output[0])
    skip = add.input[1 - term]
    if skip not in uint8:
        return None
    conv_attrs = node_attrs(conv)
    extra = residual_qconv_attrs(node_attrs(add), term, len(conv_attrs["mult"]))
    if extra is None:
        return None
    return helper.make_node(
        "QConv",
        [*conv.input, skip],
        list(add.output),
        name=conv.name,
        domain=NATIVE_DOMAIN,
        **conv_attrs,
        **extra,
    )


def fuse_residual_adds(
    nodes: list[onnx.NodeProto], keep: Iterable[str], uint8: Iterable[str]
) -> list[onnx.NodeProto]:
    """``nodes`` with every residual add fused into its QConv (module docstring). ``keep``: graph output
    names (never fused away); ``uint8``: the names known to hold uint8 tensors (the skip inputs allowed)."""
    readers: collections.Counter[str] = collections.Counter(i for n in nodes for i in n.input)
    by_output = {o: n for n in nodes for o in n.output}
    kept, allowed = set(keep), set(uint8)
    replace: dict[int, onnx.NodeProto] = {}  # id(add node) -> fused conv
    drop: set[int] = set()  # id(conv node)
    for add in nodes:
        if add.op_type != "RequantU8" or add.domain != NATIVE_DOMAIN:
            continue
        for name in add.input:
            conv = by_output.get(name)
            if conv is None or conv.op_type != "QConv" or conv.domain != NATIVE_DOMAIN or id(conv) in drop:
                continue
            if readers[name] != 1 or name in kept:
                continue
            fused = _fused(conv, add, allowed)
            if fused is not None:
                replace[id(add)] = fused
                drop.add(id(conv))
                break
    logger.info("fused %d residual adds into QConv", len(replace))
    return [replace.get(id(n), n) for n in nodes if id(n) not in drop]
