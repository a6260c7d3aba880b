"""ORT lowerings of the op kinds in ``reference_extra``, bit-exact to the numpy reference.

Each ``lower_<kind>(lowerer, op, args, ost, oinfo) -> str`` receives the ``ort_lowering`` lowerer (its
node builder ``lowerer.b``), the inputs as stored values (``_Val``: ``name`` holds ``q + st.offset``,
``nhwc`` says whether a rank-4 tensor is held channels-last), the output storage and TensorInfo, and
returns the name of the stored output. ``LOWERINGS`` maps kind -> function (the lowerer falls back to it
for kinds it has no method for); kinds in ``ELEMENTWISE`` keep their input's layout when the lowerer
lets them (a constant operand is then laid out like the activation).

- ``mul``: ``Cast`` to int32 (int64 beyond 8 bits), ``Sub`` the stored zero points, ``Mul``; the product
  ``(q_a - Z_a)(q_b - Z_b)`` is one exact term of ``emit_requant``. A scalar constant ``b`` folds into
  the multiplier instead: the single term ``(M b) stored_a`` with constant ``-(M b)(Z_a + off_a)``.
- ``lincomb``: the terms ``M_i stored_i`` and the constant ``-sum M_i (Z_i + off_i)`` (plus ``M_c k`` for
  a scalar constant; a constant array is one more term, an int32 initializer) in ``emit_requant``.
- ``matmul2``: ``MatMulInteger(u8, u8)`` with zero points ``Z + off`` (exact int32 sums), requantized;
  16-bit operands with the native kernels: one MatMulInteger per pair of byte planes
  (``ort_native.native_matmul2_terms``) and one native requantization.
- ``prelu``: one ``Gather`` from the tables of every slope entry laid end to end, at
  ``index * size + stored`` (``size`` stored codes per table; the index constant laid out like ``x``).
- ``slice``, ``gather``, ``pad``: ONNX Slice / Gather / Pad on stored codes (an offset commutes with a
  selection; the pad code is stored as ``value + off``).
"""

from __future__ import annotations

__all__ = ["LOWERINGS", "ELEMENTWISE"]

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import TensorProto

from zonnx.backend.compiler.program import Op, TensorInfo

from .ort_kernels import KernelError, Storage, Term
from .ort_native import native_matmul2_terms

logger = logging.getLogger(__name__)

_I32 = float(1 << 31)


def _centred_max(info: TensorInfo, zp: int) -> int:
    """max |q - zp| over the tensor's code range."""
    return max(abs(info.qmin - zp), abs(info.qmax - zp))


def _for_layout(c: np.ndarray, nhwc: bool) -> np.ndarray:
    """A constant in NCHW broadcast shape, laid out for an NHWC activation when ``nhwc``."""
    c = np.asarray(c)
    if not nhwc or c.size == 1:
        return c
    if c.ndim > 4:
        raise KernelError(f"a rank-{c.ndim} constant cannot broadcast against an NHWC tensor.")
    return c.reshape((1,) * (4 - c.ndim) + c.shape).transpose(0, 2, 3, 1)


def _requant(low: Any, op: Op, terms: list[Term], const: object, ost: Storage) -> str:
    return low._req(op, terms, const, ost, ())


def _centre(low: Any, v: Any, zp: int, wide: int, np_wide: type) -> str:
    x = low.b.op("Cast", [v.name], to=wide)
    return low.b.op("Sub", [x, low.b.const(v.st.offset + zp, np_wide, "zp")])


def lower_mul(low: Any, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
    """``(q_a - Z_a)(q_b - Z_b)`` requantized (module docstring)."""
    a, m = op.attrs, int(op.params["multiplier"][0])
    xa = args[0]
    if len(args) == 1 and op.params["b"].size == 1:
        mb = m * int(op.params["b"].reshape(-1)[0])
        const = -mb * (xa.st.offset + a["zp_a"])
        return _requant(low, op, [Term(xa.name, np.array(mb), low.xmax(xa))], const, ost)
    narrow = all(v.st.dtype == np.uint8 for v in args)
    wide, np_wide = (TensorProto.INT32, np.int32) if narrow else (TensorProto.INT64, np.int64)
    ca = _centre(low, xa, a["zp_a"], wide, np_wide)
    if len(args) > 1:
        cb = _centre(low, args[1], a["zp_b"], wide, np_wide)
        bmax = _centred_max(args[1].info, a["zp_b"])
    else:
        b = op.params["b"].astype(np.int64)
        cb = low.b.const(_for_layout(b, xa.nhwc), np_wide, "b")
        bmax = int(np.abs(b).max(initial=0))
    prod = low.b.op("Mul", [ca, cb])
    xmax = _centred_max(xa.info, a["zp_a"]) * bmax
    return _requant(low, op, [Term(prod, np.array(m), xmax)], 0, ost)


def lower_lincomb(low: Any, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
    """``sum M_i (q_i - Z_i) + M_c k`` requantized (module docstring)."""
    a, m = op.attrs, [int(v) for v in op.params["multiplier"]]
    terms = [Term(v.name, np.array(mi), low.xmax(v)) for v, mi in zip(args, m, strict=False)]
    const = -sum(mi * (v.st.offset + z) for v, mi, z in zip(args, m, a["zps"], strict=False))
    if "const" in op.params:
        k, mc = op.params["const"].astype(np.int64), m[len(args)]
        if k.size == 1:
            const += mc * int(k.reshape(-1)[0])
        else:
            kmax = int(np.abs(k).max(initial=0))
            dtype = np.int32 if kmax < _I32 else np.int64
            name = low.b.const(_for_layout(k, args[0].nhwc), dtype, "k")
            terms.append(Term(name, np.array(mc), kmax))
    return _requant(low, op, terms, const, ost)


def lower_matmul2(low: Any, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
    """``MatMulInteger`` of two stored activations, requantized (module docstring)."""
    a, m = op.attrs, int(op.params["multiplier"][0])
    xa, xb = args
    if getattr(low, "native", False) and any(v.st.dtype != np.uint8 for v in args):  # 16-bit: byte planes
        k = xa.info.shape[-1] if xa.info.shape and isinstance(xa.info.shape[-1], int) else None
        za, zb = xa.st.offset + a["zp_a"], xb.st.offset + a["zp_b"]
        terms = native_matmul2_terms(low.b, xa.name, xa.st, za, xb.name, xb.st, zb, m, k)
        return _requant(low, op, terms, 0, ost)
    for v in args:
        low.u8(v, op)
    za, zb = xa.st.offset + a["zp_a"], xb.st.offset + a["zp_b"]
    mm = low.b.op(
        "MatMulInteger",
        [xa.name, xb.name, low.b.const(za, np.uint8, "azp"), low.b.const(zb, np.uint8, "bzp")],
    )
    k = xa.info.shape[-1] if xa.info.shape and isinstance(xa.info.shape[-1], int) else None
    bound = _centred_max(xa.info, a["zp_a"]) * _centred_max(xb.info, a["zp_b"])
    xmax = min(k * bound, _I32) if k else _I32
    return _requant(low, op, [Term(mm, np.array(m), xmax)], 0, ost)


def _nchw(args: list[Any], op: Op) -> None:
    if any(v.nhwc for v in args):
        raise KernelError(f"op {op.name!r} ({op.kind}) needs its input in the program's layout (NCHW).")


def lower_slice(low: Any, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
    """ONNX Slice with the op's constant starts, ends, axes and steps."""
    _nchw(args, op)
    a = op.attrs
    ins = [
        args[0].name,
        low.b.const(a["starts"], np.int64, "starts"),
        low.b.const(a["ends"], np.int64, "ends"),
    ]
    if a["axes"] is not None or a["steps"] is not None:
        axes = a["axes"] if a["axes"] is not None else list(range(len(a["starts"])))
        ins.append(low.b.const(axes, np.int64, "axes"))
    if a["steps"] is not None:
        ins.append(low.b.const(a["steps"], np.int64, "steps"))
    return low.b.op("Slice", ins)


def lower_gather(low: Any, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
    """ONNX Gather with constant indices."""
    _nchw(args, op)
    idx = low.b.const(np.asarray(op.attrs["indices"], np.int64), np.int64, "indices")
    return low.b.op("Gather", [args[0].name, idx], axis=op.attrs["axis"])


def lower_pad(low: Any, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
    """ONNX Pad (constant, edge, reflect); the pad code is stored as ``value + offset``."""
    _nchw(args, op)
    (x,), a = args, op.attrs
    pads = list(a["pads"])
    if a["axes"] is not None:
        rank = len(x.info.shape) if x.info.shape is not None else None
        if rank is None:
            raise KernelError(f"op {op.name!r}: Pad with axes needs the input rank.")
        n, full = len(a["axes"]), [0] * (2 * rank)
        for i, ax in enumerate(a["axes"]):
            full[ax % rank], full[ax % rank + rank] = pads[i], pads[i + n]
        pads = full
    ins = [x.name, low.b.const(pads, np.int64, "pads")]
    if a["mode"] == "constant":
        ins.append(low.b.const(a["value"] + x.st.offset, x.st.dtype, "pv"))
    return low.b.op("Pad", ins, mode=a["mode"])


def lower_prelu(low: Any, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
    """``table[index, q - qmin]`` as one Gather over the flattened, storage-shifted tables."""
    (x,) = args
    table = op.params["table"].astype(np.int64)
    size = 256 if x.st.dtype == np.uint8 else 1 << 16
    codes = np.arange(size) - x.st.offset - int(op.attrs["qmin_in"])
    full = table[:, np.clip(codes, 0, table.shape[1] - 1)] + ost.offset
    index = _for_layout(op.params["index"].astype(np.int64) * size, x.nhwc)
    stored = low.b.op("Cast", [x.name], to=TensorProto.INT32)
    at = low.b.op("Add", [stored, low.b.const(index, np.int32, "prelu_base")])
    return low.b.op("Gather", [low.b.const(full.reshape(-1), ost.dtype, "prelu_table"), at], axis=0)


#: Op kind -> lowering function (the hook in ``ort_lowering._Lowerer.lower``).
LOWERINGS: dict[str, Callable[[Any, Op, list[Any], Storage, TensorInfo], str]] = {
    "mul": lower_mul,
    "lincomb": lower_lincomb,
    "matmul2": lower_matmul2,
    "slice": lower_slice,
    "gather": lower_gather,
    "pad": lower_pad,
    "prelu": lower_prelu,
}
#: Kinds that may run in their first input's layout (add them to the lowerer's elementwise set).
ELEMENTWISE = frozenset({"mul", "lincomb", "prelu"})
