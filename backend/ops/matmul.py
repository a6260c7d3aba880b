"""``matmul``: Gemm / MatMul with constant weights, fused bias, Relu/Clip and requantization.

Integer formula (``R(v, s)`` is ``rshift_round(v, s, quant.requant.round_mode)``; ``w`` is (K, N))::

    acc = q_x @ w + b'                        b' = b_acc - Z_x * sum_k(q_w)  (per column)
    b_acc = round(beta B / (S_x S_w alpha))
    q_y = clamp(R(acc * M[n], shift[n]) + Z_y, lo, hi),    M / 2^shift ~= alpha S_x S_w / S_y

Gemm's ``transB`` is folded into ``w``; ``transA`` is refused. Weights must be 2-D, quantized per output
column. Shared steps: ``compiler.linear``.

Reference: an exact integer product (float64 BLAS below 2^53, else int64; ``runtime.ref_math``).

ORT lowering: ``MatMulInteger(x_u8, w, a_zp = off)`` with exact int32 sums; 8-bit weights take the host's
integer path (``int8_weights``: s8 with VNNI, else ``w + 128`` as u8). 16-bit codes or weights: byte
planes (``ort_wide``), or with the native kernels ``BytePlane`` + one MatMulInteger per plane pair and one
``RequantU8/I32`` (``ort_native.native_plane_terms``).
"""

from __future__ import annotations

__all__ = ["SPEC", "compile_matmul", "reference", "lower_ort"]

import logging
from typing import Any

import numpy as np

from zonnx.backend.compiler.linear import linear_operands, linear_params
from zonnx.backend.compiler.params import QParams, broadcast_channels, node_attrs
from zonnx.backend.compiler.program import Op, TensorInfo
from zonnx.backend.compiler.requant import requantize
from zonnx.backend.compiler.values import CompileError
from zonnx.backend.runtime.ort_kernels import Storage, Term, int8_weights
from zonnx.backend.runtime.ort_native import emit_byte_plane, native_plane_terms
from zonnx.backend.runtime.ort_values import Val
from zonnx.backend.runtime.ort_wide import emit_wide_matmul, is_int8
from zonnx.backend.runtime.ref_math import matmul_exact

from .spec import Kind, OpSpec, Rule

logger = logging.getLogger(__name__)


def compile_matmul(low: Any, p: Any, out: str, qp: QParams, sources: list[str], base: dict) -> None:
    """Emit the ``matmul`` of a pending Gemm / MatMul with a constant weight."""
    node = p.node
    x, w, bias = linear_operands(p)
    xq, wq = x.qp, w.qp
    xq.per_tensor(f"node {node.name!r} input")
    sy, _ = qp.per_tensor(f"node {node.name!r} output")
    a = node_attrs(node)
    wv = np.asarray(w.value, np.int64)
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    if a.get("transA", 0):
        raise CompileError(f"node {node.name!r}: Gemm with transA=1 is not supported.")
    axis = wq.axis
    if node.op_type == "Gemm" and a.get("transB", 0):
        wv, axis = wv.T, (None if axis is None else 1 - axis)
    if wv.ndim != 2 or axis not in (None, 1, -1):
        raise CompileError(f"node {node.name!r}: weights must be a 2-D constant quantized per output column.")
    n_out = wv.shape[1]
    w_int = wv - broadcast_channels(wq.zp, 2, None if axis is None else 1)
    sw = np.broadcast_to(wq.scale.reshape(-1), (n_out,))
    params = linear_params(node, "matmul", w_int, sw, alpha, beta, xq, bias, sy, p.mul, low.target)
    attrs: dict = {}
    attrs.update(base, round_mode=low.target.quant.requant.round_mode)
    low.emit("matmul", node.name, [x.tensor], [out], attrs, params, sources)


def reference(args: list[np.ndarray], op: Op) -> np.ndarray:
    """``clamp(R(q_x @ w + bias, M[n], s[n]) + zp_out)`` in int64."""
    a = op.attrs
    acc = matmul_exact(args[0], op.params["w"]) + op.params["bias"]
    return requantize(
        acc,
        op.params["multiplier"],
        op.params["shift"],
        a["round_mode"],
        zero_point=a["zp_out"],
        lo=a["lo"],
        hi=a["hi"],
    )


def lower_ort(low: Any, op: Op, args: list[Val], ost: Storage, oinfo: TensorInfo) -> str:
    """Exact ORT nodes of ``matmul`` (module docstring); returns the stored output."""
    (x,), w = args, op.params["w"]
    if low.native and (x.st.dtype != np.uint8 or not is_int8(w)):  # byte planes, one native Requant
        m = op.params["multiplier"].astype(object)
        if x.st.dtype == np.uint8:
            planes = [(x.name, 0)]
        else:
            planes = [(emit_byte_plane(low.b, x.name, 1), 0), (emit_byte_plane(low.b, x.name, 2), 1)]
        terms = native_plane_terms(low.b, planes, w.astype(np.int64), m, low.path)
        wsum = w.astype(np.int64).sum(axis=0).astype(object)
        const = m * (op.params["bias"].astype(object) - x.st.offset * wsum)
        return low.req(op, terms, const, ost, ())
    if x.st.dtype != np.uint8 or not is_int8(w):  # 16-bit: byte planes (ort_wide)
        m = op.params["multiplier"].astype(object)
        acc, xm = emit_wide_matmul(low.b, x.name, op, x.st, low.path)
        wsum = w.astype(np.int64).sum(axis=0).astype(object)
        const = m * (op.params["bias"].astype(object) - x.st.offset * wsum)
        return low.req(op, [Term(acc, m, xm)], const, ost, ())
    w = w.astype(np.int8)
    wname, wzp = int8_weights(low.b, w, low.path)
    mm = low.b.op("MatMulInteger", [x.name, wname, low.b.const(x.st.offset, np.uint8, "xzp"), wzp])
    qm = max(abs(x.info.qmin), abs(x.info.qmax))
    xm = w.shape[0] * qm * int(np.abs(w.astype(np.int64)).max(initial=0))
    m = op.params["multiplier"].astype(object)
    return low.req(op, [Term(mm, m, xm)], m * op.params["bias"].astype(object), ost, ())


SPEC = OpSpec(
    module=__name__,
    kinds=(Kind("matmul", reference, lower_ort, native=("BytePlane", "RequantU8", "RequantI32")),),
    rules=(Rule(frozenset({"Gemm", "MatMul"}), "pending", compile_matmul),),
    const_inputs={"Gemm": (1,)},
)
