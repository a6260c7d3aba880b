"""ONNX node builders for exact integer requantization inside ORT (float64 or int64), and code storage.

Storage: every program tensor lives in ORT as ``stored = q + offset`` in a storage type: int8 codes as
uint8 with offset 128 (so every 8-bit tensor is uint8 and ConvInteger / MatMulInteger run their fast
u8 paths), uint8 as is, 16-bit codes as int32 with offset 2^15 (int16) or 0 (uint16). Program inputs
and outputs keep the program's own dtypes; ``to_storage`` / ``from_storage`` convert at the boundary.

Requantization of a linear form ``P = sum_i M_i x_i + C`` (integers, per channel ``c``), as in
``requant.rshift_round``: ``y = clamp(R(P / 2^s) + zp, lo, hi)`` with rounding mode ``R``. Shifts ``s <= 0``
are folded into the multipliers (exact left shifts). Every mode but half_even is a floor::

    R(u) = floor(u + alpha + beta * sign(u)),   u = P / 2^s,  u a multiple of 2^-s
    floor (0, 0)   ceil (1 - 2^-s, 0)   half_up (1/2, 0)   half_down (1/2 - 2^-s, 0)
    half_away (1/2 - 2^-(s+1), 2^-(s+1))   trunc ((1 - 2^-s)/2, -(1 - 2^-s)/2)

and half_even is ORT ``Round`` (ties to even; ``Round(u + z) = Round(u) + z`` for even ``z`` only, so an
odd stored zero point is added after). In the stored domain ``lo + off >= 0``, so after ``Clip`` to the
integer bounds the ``Cast`` to the unsigned storage type (truncation) is the floor.

float64 path (``Cast, Mul, Add[, Sign, Mul, Sum | Round], Clip, Cast``): ``fl(x * M/2^s) = fl(x M) / 2^s``
and every later value is a multiple of 2^-(s+1), so the result is exact while ``|P| * 2 < 2^53``. With a
single term it is also exact when ``x M`` may exceed 2^53 provided ``2^(52 - s) > |K| + max(|lo|, |hi|) + 2``
(``K`` the folded constant): float rounding is monotone and keeps the sign, so whenever the product is
inexact both the exact and the computed value lie beyond the clamp bounds and saturate alike (this is
what lets 31-bit multipliers use float64). Otherwise the int64 path (``Cast, Mul, Add, Div, Clip,
Cast``; Div truncates toward zero, which equals the floor wherever the result is not clamped to
``lo + off >= 0``) handles the floor-type modes.
"""

from __future__ import annotations

__all__ = [
    "Builder",
    "Storage",
    "storage_of",
    "Term",
    "emit_requant",
    "to_storage",
    "from_storage",
    "KernelError",
    "int8_weights",
    "resolve_int_path",
    "RequantForm",
]

import dataclasses
import logging

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from zonnx.errors import ZonnxError
from zonnx.hostcpu import IntPath, int_path

logger = logging.getLogger(__name__)

_F53 = float(1 << 53)
_I62 = float(1 << 62)
_ALPHA_BETA = ("floor", "ceil", "half_up", "half_down", "half_away", "trunc")


class KernelError(ZonnxError):
    """A program op cannot be expressed exactly with ORT CPU kernels (the message names the op)."""


@dataclasses.dataclass(frozen=True)
class Storage:
    """How a program dtype is held in ORT: ``stored = q + offset`` of numpy dtype ``dtype``."""

    dtype: np.dtype
    offset: int

    @property
    def onnx_type(self) -> int:
        return helper.np_dtype_to_tensor_dtype(self.dtype)


_STORAGE = {
    "int8": Storage(np.dtype(np.uint8), 128),
    "uint8": Storage(np.dtype(np.uint8), 0),
    "int16": Storage(np.dtype(np.int32), 1 << 15),
    "uint16": Storage(np.dtype(np.int32), 0),
    "int32": Storage(np.dtype(np.int32), 0),
}


def storage_of(dtype: str) -> Storage:
    """The ORT storage of a program dtype (see the module docstring)."""
    if dtype not in _STORAGE:
        raise KernelError(f"program tensors of dtype {dtype} cannot run inside ORT; use 8- or 16-bit codes.")
    return _STORAGE[dtype]


class Builder:
    """Collects nodes and initializers; every name it makes starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._n = 0
        self._consts: dict[tuple, str] = {}

    def fresh(self, hint: str) -> str:
        self._n += 1
        return f"{self.prefix}/{hint}_{self._n}"

    def const(self, value: np.ndarray | float | int, dtype: np.dtype | type, hint: str = "c") -> str:
        arr = np.array(value, dtype=dtype, order="C")  # keeps 0-d scalars (ascontiguousarray makes them 1-d)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            name = self.fresh(hint)
            self.initializers.append(numpy_helper.from_array(arr, name))
            self._consts[key] = name
        return self._consts[key]

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: object) -> str:
        out = out or self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.fresh(op_type), **attrs))
        return out


@dataclasses.dataclass
class Term:
    """One ``M * x`` of a linear form: ``x`` an integer ORT tensor, ``M`` per channel, ``|x| <= xmax``."""

    name: str
    multiplier: np.ndarray
    xmax: float


def _mode_ab(mode: str, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(alpha, beta) per channel as exact float64 (zero where ``s == 0``: u is then an integer)."""
    e = np.where(s > 0, np.ldexp(1.0, -s.astype(np.int64)), 0.0)
    h = np.where(s > 0, 0.5, 0.0)
    table = {
        "floor": (np.zeros_like(e), np.zeros_like(e)),
        "ceil": (np.where(s > 0, 1.0 - e, 0.0), np.zeros_like(e)),
        "half_up": (h, np.zeros_like(e)),
        "half_down": (h - e, np.zeros_like(e)),
        "half_away": (h - e / 2, e / 2),
        "trunc": (np.where(s > 0, (1.0 - e) / 2, 0.0), -np.where(s > 0, (1.0 - e) / 2, 0.0)),
    }
    return table[mode]


def emit_requant(
    b: Builder,
    terms: list[Term],
    const: np.ndarray,
    shift: np.ndarray,
    mode: str,
    zp: int,
    lo: int,
    hi: int,
    out_storage: Storage,
    bshape: tuple[int, ...],
    *,
    where: str,
    out: str | None = None,
    force: str | None = None,
) -> str:
    """Nodes computing the stored ``clamp(R((sum M_i x_i + C) / 2^s) + zp, lo, hi)``; returns the output name.

    ``const``, ``shift`` and each multiplier broadcast per channel (reshaped to ``bshape``, e.g. ``(-1, 1, 1)`` for NCHW);
    ``zp``/``lo``/``hi`` are code values (the storage offset is added here). ``force`` ("float"/"int64")
    overrides the path choice (tests).
    """
    s = np.asarray(shift, dtype=np.int64).reshape(-1)
    n = max([s.size, np.asarray(const).size] + [np.asarray(t.multiplier).size for t in terms])
    s = np.broadcast_to(s, (n,))
    left = np.maximum(-s, 0)
    ms = [
        [
            int(v) << int(sh)
            for v, sh in zip(np.broadcast_to(np.asarray(t.multiplier).reshape(-1), (n,)), left, strict=True)
        ]
        for t in terms
    ]
    cs = [
        int(v) << int(sh)
        for v, sh in zip(np.broadcast_to(np.asarray(const).reshape(-1), (n,)), left, strict=True)
    ]
    s = np.maximum(s, 0)
    off = out_storage.offset
    zs, los, his = zp + off, max(lo, 0 - off) + off, hi + off
    if los < 0:
        raise KernelError(f"op {where!r}: clamp bound {lo} is below the storage range.")
    bound = sum(t.xmax * max(abs(v) for v in m) for t, m in zip(terms, ms, strict=True)) + max(
        abs(v) for v in cs
    )
    path = force or _choose_path(terms, ms, cs, s, zs, los, his, bound)
    if path == "int64" and mode not in _ALPHA_BETA[:4]:
        raise KernelError(
            f"op {where!r}: round mode {mode} with products beyond 2^53 has no exact int64 lowering here."
        )
    shp = bshape or (-1,)
    alpha, beta = (None, None) if mode == "half_even" else _mode_ab(mode, s)
    if path == "float":
        scale = [np.array([np.ldexp(float(v), -int(sh)) for v, sh in zip(m, s, strict=True)]) for m in ms]
        cf = np.array([np.ldexp(float(v), -int(sh)) for v, sh in zip(cs, s, strict=True)])
        acc = None
        for t, sc in zip(terms, scale, strict=True):
            x = b.op("Cast", [t.name], to=TensorProto.DOUBLE)
            prod = b.op("Mul", [x, b.const(_shape(sc, shp), np.float64, "m")])
            acc = prod if acc is None else b.op("Add", [acc, prod])
        if mode == "half_even":
            even = zs % 2 == 0
            u = b.op("Add", [acc, b.const(_shape(cf + (zs if even else 0), shp), np.float64, "k")])
            v = b.op("Round", [u])
            if not even:
                v = b.op("Add", [v, b.const(float(zs), np.float64, "zp")])
        elif np.any(beta != 0):
            u = b.op("Add", [acc, b.const(_shape(cf, shp), np.float64, "k")])
            sb = b.op("Mul", [b.op("Sign", [u]), b.const(_shape(beta, shp), np.float64, "beta")])
            v = b.op("Sum", [u, sb, b.const(_shape(alpha + zs, shp), np.float64, "alpha")])
        else:
            v = b.op("Add", [acc, b.const(_shape(cf + alpha + zs, shp), np.float64, "k")])
        v = b.op("Clip", [v, b.const(float(los), np.float64, "lo"), b.const(float(his), np.float64, "hi")])
        return b.op("Cast", [v], out, to=out_storage.onnx_type)
    # int64: y = clip(N / 2^s) with N = sum M x + C + alpha 2^s + zs 2^s. Div truncates toward zero, which
    # is the floor for N >= 0; for N < 0 both floor and truncation are <= 0 <= lo + off, so both clamp to
    # the same bound. (Not Max/Min with per-channel bounds: ORT 1.31's int64 Max with a broadcast operand
    # returned wrong values above 2^31 here.)
    d = np.array([1 << int(v) for v in s], dtype=object)
    k = np.array([c + int(a * dd) + zs * dd for c, a, dd in zip(cs, alpha, d, strict=True)], dtype=object)
    if any(abs(int(v)) >= _I62 for v in k) or bound >= _I62 / 2:
        raise KernelError(
            f"op {where!r}: requantization products exceed 2^62; the NPU accumulator is too wide."
        )
    acc = None
    for t, m in zip(terms, ms, strict=True):
        x = b.op("Cast", [t.name], to=TensorProto.INT64)
        prod = b.op("Mul", [x, b.const(_shape(np.array(m, np.int64), shp), np.int64, "m")])
        acc = prod if acc is None else b.op("Add", [acc, prod])
    v = b.op("Add", [acc, b.const(_shape(k.astype(np.int64), shp), np.int64, "k")])
    v = b.op("Div", [v, b.const(_shape(d.astype(np.int64), shp), np.int64, "d")])
    v = b.op("Clip", [v, b.const(los, np.int64, "lo"), b.const(his, np.int64, "hi")])
    return b.op("Cast", [v], out, to=out_storage.onnx_type)


def _shape(a: np.ndarray, shp: tuple[int, ...]) -> np.ndarray:
    a = np.asarray(a)
    if a.size == 1 or np.all(a == a.reshape(-1)[0]):
        return a.reshape(-1)[:1].reshape(())
    return a.reshape(shp)


def _choose_path(
    terms: list[Term], ms: list, cs: list, s: np.ndarray, zs: int, los: int, his: int, bound: float
) -> str:
    """ "float" when float64 is provably exact (module docstring), else "int64"."""
    if 2 * bound < _F53:
        return "float"
    if len(terms) == 1:
        k = np.array([abs(float(c)) * 2.0 ** -int(sh) for c, sh in zip(cs, s, strict=True)]) + abs(zs) + 1
        lim = np.array([2.0 ** (52 - int(sh)) for sh in s])
        if np.all(lim > k + max(abs(los), abs(his)) + 2):
            return "float"
    return "int64"


def to_storage(b: Builder, name: str, dtype: str, out: str | None = None) -> str:
    """Program-typed tensor -> stored (``q + offset`` in the storage type)."""
    st = storage_of(dtype)
    if st.offset == 0 and np.dtype(dtype) == st.dtype:
        return b.op("Identity", [name], out)
    wide = b.op("Cast", [name], to=TensorProto.INT32)
    if st.offset:
        wide = b.op("Add", [wide, b.const(st.offset, np.int32, "off")])
    return b.op("Cast", [wide], out, to=st.onnx_type)


def from_storage(b: Builder, name: str, dtype: str, out: str | None = None) -> str:
    """Stored tensor -> the program's dtype (exact: stored values are in range)."""
    st = storage_of(dtype)
    target = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    if st.offset == 0 and np.dtype(dtype) == st.dtype:
        return b.op("Identity", [name], out)
    wide = b.op("Cast", [name], to=TensorProto.INT32)
    if st.offset:
        wide = b.op("Sub", [wide, b.const(st.offset, np.int32, "off")])
    return b.op("Cast", [wide], out, to=target)


def resolve_int_path(path: IntPath | None) -> IntPath:
    """``path``, or this host's integer path (``zonnx.hostcpu``) when None."""
    if path is None:
        return int_path()
    if path not in ("u8s8", "u8u8"):
        raise KernelError(f"integer path {path!r} is unknown; use u8s8 or u8u8.")
    return path


def int8_weights(b: Builder, w: np.ndarray, path: IntPath, zp_shape: tuple[int, ...] = ()) -> tuple[str, str]:
    """(weights, weight zero point) initializers for int8 weights ``w`` on an integer ``path``.

    ``u8s8``: ``w`` as int8 with zero point 0 (fastest where the host has VNNI). ``u8u8``: ``w + 128`` as
    uint8 with zero point 128, the same products ``x (w_u8 - 128)``, and exact on every x86 kernel: ORT's
    u8 x s8 kernels without VNNI add products in saturating 16-bit pairs (``zonnx.hostcpu``).
    """
    if path == "u8u8":
        wq = (w.astype(np.int16) + 128).astype(np.uint8)
        return b.const(wq, np.uint8, "w"), b.const(np.full(zp_shape, 128, np.uint8), np.uint8, "wzp")
    return b.const(w.astype(np.int8), np.int8, "w"), b.const(np.zeros(zp_shape, np.int8), np.int8, "wzp")


def emit_im2col_matmul(
    b: Builder,
    x: str,
    w: np.ndarray,
    zs: int,
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    path: IntPath,
) -> str:
    """NHWC ``sum (x - zs) w`` of a group-1 convolution: Pad with ``zs``, one strided Slice per kernel tap,
    Concat on channels, one ``MatMulInteger`` (u8 x s8 or u8 x u8 by ``path``) with weights as
    (kh kw C, O). int32 NHWC out.

    Tap ``(i, j)`` reads rows ``i dh, i dh + sh, ...`` up to ``end = -(eff_h - 1 - i dh)`` counted from the
    padded end (``eff_h = (kh - 1) dh + 1``): ``ceil((Hp - eff_h + 1) / sh)`` rows, the output height, so
    no static shape is needed.
    """
    o, c, kh, kw = w.shape
    (sh, sw), (dh, dw) = strides, dilations
    eh, ew = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    if any(pads):
        full = [0, pads[0], pads[1], 0, 0, pads[2], pads[3], 0]
        x = b.op("Pad", [x, b.const(full, np.int64, "pads"), b.const(zs, np.uint8, "pv")])
    axes = b.const([1, 2], np.int64, "axes")
    steps = b.const([sh, sw], np.int64, "steps")
    big = np.iinfo(np.int64).max
    cols = []
    for i in range(kh):
        for j in range(kw):
            if (kh, kw, sh, sw) == (1, 1, 1, 1):
                cols.append(x)
                continue
            end = [-(eh - 1 - i * dh) or big, -(ew - 1 - j * dw) or big]
            start = b.const([i * dh, j * dw], np.int64, "st")
            cols.append(b.op("Slice", [x, start, b.const(end, np.int64, "en"), axes, steps]))
    col = cols[0] if len(cols) == 1 else b.op("Concat", cols, axis=3)
    wm = np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(kh * kw * c, o))
    wname, wzp = int8_weights(b, wm, path)
    return b.op("MatMulInteger", [col, wname, b.const(zs, np.uint8, "xzp"), wzp])


@dataclasses.dataclass(frozen=True)
class RequantForm:
    """The stored ``clamp(R((sum M_t x_t + const) / 2^shift) + zp, lo, hi)`` of one op, built once.

    The arguments of ``emit_requant`` and of the native ``emit_native_requant`` /
    ``native_requant_attrs`` (same formula): ``args()`` gives them in order, ``where`` names the op.
    """

    terms: tuple[Term, ...]
    const: np.ndarray
    shift: np.ndarray
    mode: str
    zp: int
    lo: int
    hi: int
    out_storage: Storage
    bshape: tuple[int, ...]
    where: str

    def args(self) -> tuple:
        """(terms, const, shift, mode, zp, lo, hi, out_storage, bshape), positional for the emitters."""
        return (
            list(self.terms),
            self.const,
            self.shift,
            self.mode,
            self.zp,
            self.lo,
            self.hi,
            self.out_storage,
            self.bshape,
        )
