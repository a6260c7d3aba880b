"""Peephole fusion of the lowered ORT nodes: a native ``QConv`` whose output feeds only a two-term
``RequantU8`` (a residual add) becomes one ``QConvAdd``.

``QConvAdd(x, w, skip)`` computes the conv's own uint8 codes ``q_c`` exactly as ``QConv`` does, block by
block, and applies the add's rule to each finished block while it is still in cache::

    q_y = clamp(R(M_0 t_0 + M_1 t_1 + K, s) + zs, lo, hi),   (t_0, t_1) = (q_c, skip) or (skip, q_c)

with the add's own integers (``mult``, ``cnst``, ``shift``, ``mode``, ``zs``, ``lo``, ``hi`` of the
``RequantU8`` node, term order kept), so the output equals the two nodes' bit for bit by construction: the
same two kernels' arithmetic in the same order, one tensor pass and one node fewer.

Fused only when: the add has exactly two terms without int128 products (``wide = 0``); the conv's output
has no other reader and is no graph output; both operands are channels-last uint8 tensors of the program;
the add's channels are one or the conv's outputs, on the last axis. The ``RequantU8`` node's position is
kept, so the skip is computed before the fused node runs. Operands of one shape (residual adds) take the
fused pass; operands that broadcast (shapes are known only at run time) take an exact unfused path inside
the kernel (conv codes to a buffer, both operands expanded, the same add rule).
"""

from __future__ import annotations

__all__ = ["fuse_conv_add"]

import logging
from collections import Counter

import numpy as np
import onnx
from onnx import helper

from .ort_values import Val

logger = logging.getLogger(__name__)

_DOMAIN = "zonnx.native"


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _fusable(conv: onnx.NodeProto, add: onnx.NodeProto, skip: str, vals: dict[str, Val]) -> bool:
    """The rule of the module docstring for one QConv -> RequantU8 pair."""
    a = _attrs(add)
    if a.get("terms") != 2 or a.get("wide", 1) != 0 or len(add.input) != 2:
        return False
    vc, vs = vals.get(conv.output[0]), vals.get(skip)
    if vc is None or vs is None or not (vc.nhwc and vs.nhwc):
        return False
    if np.dtype(vc.st.dtype) != np.uint8 or np.dtype(vs.st.dtype) != np.uint8:
        return False
    channels = len(a["cnst"])
    return channels == 1 or (channels == len(_attrs(conv)["cnst"]) and a["caxis_from_end"] == 0)


def fuse_conv_add(nodes: list[onnx.NodeProto], vals: list[Val], outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` with every fusable QConv -> RequantU8 pair (module docstring) replaced by one ``QConvAdd``
    at the RequantU8's position; ``vals`` are the program tensors' stored values, ``outputs`` the graph's
    output names."""
    readers = Counter(i for n in nodes for i in n.input)
    by_output = {n.output[0]: n for n in nodes if n.domain == _DOMAIN and n.op_type == "QConv"}
    stored = {v.name: v for v in vals}
    drop: set[str] = set()
    fused: dict[str, onnx.NodeProto] = {}
    for add in nodes:
        if add.domain != _DOMAIN or add.op_type != "RequantU8":
            continue
        for term, name in enumerate(add.input[:2]):
            conv = by_output.get(name)
            skip = add.input[1 - term] if len(add.input) == 2 else ""
            if conv is None or conv.name in drop or readers[name] != 1 or name in outputs or skip == name:
                continue
            if not _fusable(conv, add, skip, stored):
                continue
            a = _attrs(add)
            extra = {
                f"add_{k}": a[k] for k in ("terms", "mult", "cnst", "shift", "mode", "zs", "lo", "hi", "wide")
            }
            extra["add_caxis_from_end"] = a["caxis_from_end"]
            node = helper.make_node(
                "QConvAdd",
                [conv.input[0], conv.input[1], skip],
                [add.output[0]],
                name=f"{conv.name}+add",
                domain=_DOMAIN,
                add_term=term,
                **_attrs(conv),
                **extra,
            )
            drop.add(conv.name)
            fused[add.name] = node
            break
    if fused:
        logger.info("fused %d residual adds into their QConv", len(fused))
    return [fused.get(n.name, n) for n in nodes if n.name not in drop]
