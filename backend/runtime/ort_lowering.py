"""Lower an NPU ``Program`` to ONNX nodes that ORT's CPU provider runs natively, bit-exact to the reference.

Every program tensor is held as ``q + offset`` in its storage type (``ort_kernels``: 8-bit codes as
uint8), so the integer kernels take their fast unsigned-activation paths. Per op kind:

- ``conv`` (group 1): NHWC im2col (Pad with ``Z_x + off``, one strided Slice per tap, Concat) and one
  ``MatMulInteger(u8 x w, a_zp = Z_x + off)``: measured 2.3-7x faster per 3x3 layer than ConvInteger.
  Grouped: ``ConvInteger(x_u8, w + 128 as u8, x_zp = Z_x + off, w_zp = 128)`` in NCHW. Both give
  ``sum (q - Z_x) w`` with zero-point padding, i.e. the program's ``conv(pad(q, Z_x), w)`` minus
  ``Z_x sum(w)``; that term and the folded bias go into the one requantization constant. QLinearConv is
  not used: it rounds ``float32(acc) * float32(scale)`` half to even, which differs from the targets'
  integer ``(acc M) >> s`` for general multipliers.
  Layout: a tensor is transposed only where an op needs the other layout (once per tensor); pools on
  NHWC tensors use ReduceSum/ReduceMax over axes 1, 2 or ``com.microsoft`` NhwcMaxPool.
- ``matmul``: ``MatMulInteger(x_u8, w, a_zp = off)``, exact int32 sums.
- 8-bit weights ``w`` of MatMulInteger and QLinearConv take the host's integer path (``zonnx.hostcpu``):
  s8 where VNNI makes ORT's fast u8 x s8 kernels exact, else ``w + 128`` as u8 with zero point 128
  (u8 x s8 without VNNI adds products in saturating 16-bit pairs; u8 x u8 is exact on every kernel).
  The path is part of the lowered-model cache key.
- ``add`` / ``rescale`` / ``avgpool``: one linear form ``sum M_i x_i + C`` requantized once (the
  zero points and storage offsets fold into ``C``); window sums by ``ReduceSum`` (global) or a
  depthwise ``ConvInteger`` with a ones kernel and ``x_zp = Z_in + off`` (padding then adds 0).
- requantization: ``ort_kernels.emit_requant`` (float64 when provably exact, else int64).
- ``maxpool`` (MaxPool / ReduceMax: the storage minimum pads like the program's ``qmin``), ``clamp``
  (Clip), ``concat``, ``reshape``, ``flatten``, ``transpose``, ``squeeze``, ``unsqueeze``, ``copy``,
  ``resize_nearest`` (Resize with the same coordinate rules) act on stored codes: an offset commutes
  with each of them. ``lut``: ``Gather`` from a table indexed by the stored code.

The nodes are returned inline (no FunctionProto): ORT inlines functions anyway and the provider can wrap
them. Names: graph inputs/outputs are ``f"{name}/{tensor}"``; internal names start with ``f"{name}/"``.
Public API: ``lower_program``, ``LoweredProgram``, ``program_to_model``.
"""

from __future__ import annotations

__all__ = ["LOWERING_VERSION", "LoweredProgram", "lower_program", "program_to_model", "KernelError"]

import dataclasses
import functools
import logging
import math

import numpy as np
import onnx
from onnx import TensorProto, helper

from zonnx.backend.compiler.program import Op, Program, TensorInfo
from zonnx.hostcpu import IntPath

from . import ort_lowering_extra
from .ort_kernels import (
    Builder,
    KernelError,
    Storage,
    Term,
    emit_im2col_matmul,
    emit_requant,
    from_storage,
    int8_weights,
    resolve_int_path,
    storage_of,
    to_storage,
)
from .ort_lowering_codes import CodeOps
from .ort_native import (
    NATIVE_DOMAIN,
    emit_byte_plane,
    emit_dwconv,
    emit_im2col,
    emit_native_requant,
    emit_qconv,
    emit_qdwconv,
    is_depthwise,
    native_plane_terms,
    native_requant_attrs,
)
from .ort_qlinear import conv_plan, emit_float32_add, emit_qlinear_add, emit_qlinear_conv
from .ort_wide import emit_wide_conv, emit_wide_matmul, is_int8
from .qlinear_exact import ConvRequant

logger = logging.getLogger(__name__)
IR_VERSION = 10
#: Bumped when lowered graphs change (2: QLinearConv/QLinearAdd/float32 adds; 3: mul, lincomb, matmul2, ...;
#: 4: 16-bit conv/matmul; 5: integer path per host, u8 x u8 weights without VNNI).
LOWERING_VERSION = 5
MS_DOMAIN = "com.microsoft"  # NhwcMaxPool: an ORT CPU contrib kernel (uint8/int8)


@dataclasses.dataclass
class LoweredProgram:
    """ONNX nodes, initializers and boundary value infos of one program (names prefixed by ``name``)."""

    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto]
    inputs: list[onnx.ValueInfoProto]
    outputs: list[onnx.ValueInfoProto]
    functions: list[onnx.FunctionProto] = dataclasses.field(default_factory=list)
    input_names: dict[str, str] = dataclasses.field(default_factory=dict)  # program tensor -> graph name
    output_names: dict[str, str] = dataclasses.field(default_factory=dict)
    opset: int = 17
    opset_imports: dict[str, int] = dataclasses.field(default_factory=lambda: {"": 17})


@dataclasses.dataclass
class _Val:
    name: str  # ORT tensor holding q + st.offset
    st: Storage
    info: TensorInfo
    nhwc: bool = False  # a rank-4 tensor held channels-last (the program's layout is NCHW)
    other: str | None = None  # the same tensor in the other layout, once made


def _value_info(name: str, info: TensorInfo) -> onnx.ValueInfoProto:
    shape = None if info.shape is None else [d if isinstance(d, (int, str)) else None for d in info.shape]
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype)), shape)


class _Lowerer(CodeOps):
    def __init__(
        self,
        program: Program,
        name: str,
        path: IntPath,
        nhwc: bool = True,
        qlinear: bool = True,
        native: bool = False,
    ) -> None:
        self.p, self.b, self.nhwc_ok, self.qlinear = program, Builder(name), nhwc, qlinear
        self.native = native  # emit the zonnx.native custom ops (ort_native) where they apply
        self.path = path
        self.env: dict[str, _Val] = {}
        self.plans: dict[str, ConvRequant] = {}

    def info(self, tensor: str) -> TensorInfo:
        if tensor not in self.p.tensors:
            raise KernelError(f"program tensor {tensor!r} has no TensorInfo; recompile the model.")
        return self.p.tensors[tensor]

    def u8(self, v: _Val, op: Op) -> None:
        if v.st.dtype != np.uint8:
            raise KernelError(
                f"op {op.name!r} ({op.kind}): ORT's integer kernels take 8-bit activations, "
                f"tensor {v.info.name!r} is {v.info.dtype}."
            )

    def xmax(self, v: _Val) -> int:
        return v.info.qmax + v.st.offset

    def layout(self, v: _Val, nhwc: bool) -> _Val:
        """``v`` in the wanted layout (one Transpose, made once per tensor)."""
        if v.nhwc == nhwc:
            return v
        if v.other is None:
            v.other = self.b.op("Transpose", [v.name], perm=[0, 2, 3, 1] if nhwc else [0, 3, 1, 2])
        return _Val(v.other, v.st, v.info, nhwc, v.name)

    def lower(self, op: Op) -> None:
        args = [self.env[i] for i in op.inputs]
        oinfo = self.info(op.outputs[0])
        ost = storage_of(oinfo.dtype)
        fn = getattr(self, f"_{op.kind}", None)
        if fn is None and op.kind in ort_lowering_extra.LOWERINGS:
            fn = functools.partial(ort_lowering_extra.LOWERINGS[op.kind], self)
        if fn is None:
            raise KernelError(f"op {op.name!r}: op kind {op.kind!r} has no ORT lowering.")
        plan = conv_plan(op, args[0].st, ost) if self.qlinear and op.kind == "conv" else None
        if plan is not None:  # QLinearConv: channels-last (com.microsoft) unless NHWC is off
            self.plans[op.name], nhwc = plan, self.nhwc_ok and _rank4(args[0])
        elif op.kind in _ELEMENTWISE or op.kind in ort_lowering_extra.ELEMENTWISE:  # the first input's layout
            nhwc = args[0].nhwc
        else:
            nhwc = self.nhwc_ok and op.kind in _CHANNELS_LAST and _wants_nhwc(op, args[0], self.native)
        args = [self.layout(v, nhwc) for v in args]
        name = fn(op, args, ost, oinfo)
        self.env[op.outputs[0]] = _Val(name, ost, oinfo, nhwc)

    def _req(self, op: Op, terms: list[Term], const: object, ost: Storage, bshape: tuple) -> str:
        a = op.attrs
        if self.native:
            out = emit_native_requant(
                self.b,
                terms,
                np.asarray(const, dtype=object),
                op.params["shift"],
                a["round_mode"],
                a["zp_out"],
                a["lo"],
                a["hi"],
                ost,
                bshape,
                where=op.name,
            )
            if out is not None:
                return out
        return emit_requant(
            self.b,
            terms,
            np.asarray(const, dtype=object),
            op.params["shift"],
            a["round_mode"],
            a["zp_out"],
            a["lo"],
            a["hi"],
            ost,
            bshape,
            where=op.name,
        )

    def _native_conv(self, op: Op, x: _Val, ost: Storage, wsum: np.ndarray) -> str:
        """NHWC group-1 conv by the native ops: Im2col per byte plane, MatMulInteger, one Requant."""
        a, w = op.attrs, op.params["w"].astype(np.int64)
        m = op.params["multiplier"].astype(object)
        o, c, kh, kw = w.shape
        wm = np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(kh * kw * c, o))
        zs = int(a["pad_value"]) + x.st.offset
        if a["group"] != 1:  # depthwise (_wants_nhwc): DwConv sums (x - zs) w, the pad code adds 0
            xm = kh * kw * max(zs, 255 - zs) * int(np.abs(w).max(initial=0))
            const = m * (op.params["bias"].astype(object) + int(a["pad_value"]) * wsum.astype(object))
            rq = self._rq_attrs(op, Term("", m, xm), const, ost)
            fused = (
                None
                if rq is None
                else emit_qdwconv(self.b, x.name, w, a["strides"], a["pads"], a["dilations"], zs, rq)
            )
            if fused is not None:
                return fused
            acc = emit_dwconv(self.b, x.name, w, a["strides"], a["pads"], a["dilations"], zs)
            return self._req(op, [Term(acc, m, xm)], const, ost, (-1,))
        geo = (list(w.shape[2:]), a["strides"], a["pads"], a["dilations"], zs)
        pointwise = (kh, kw) == (1, 1) and list(a["strides"]) == [1, 1] and not any(a["pads"])
        if x.st.dtype == np.uint8 and is_int8(w):  # one uint8 plane with the pad code as zero point
            xm = wm.shape[0] * max(zs, 255 - zs) * int(np.abs(w).max(initial=0))
            const = m * (op.params["bias"].astype(object) + int(a["pad_value"]) * wsum.astype(object))
            fused = self._qconv(op, x, wm, geo, Term("", m, xm), const, ost)
            if fused is not None:
                return fused
            col = x.name if pointwise else emit_im2col(self.b, x.name, *geo, 0)
            wname, wzp = int8_weights(self.b, wm.astype(np.int8), self.path)
            mm = self.b.op("MatMulInteger", [col, wname, self.b.const(zs, np.uint8, "xzp"), wzp])
            return self._req(op, [Term(mm, m, xm)], const, ost, (-1,))
        if np.dtype(x.info.dtype).itemsize == 2 and ost.dtype == np.int32 and is_int8(w):  # 16-bit: QConv16
            xm = wm.shape[0] * max(zs, 65535 - zs) * int(np.abs(w).max(initial=0))
            const = m * (op.params["bias"].astype(object) + int(a["pad_value"]) * wsum.astype(object))
            rq = self._rq_attrs(op, Term("", m, xm), const, ost, np.int32)
            fused = None if rq is None else emit_qconv(self.b, x.name, wm, *geo, rq, wide=True)
            if fused is not None:
                return fused
        if x.st.dtype == np.uint8:
            planes = [(emit_im2col(self.b, x.name, *geo, 0), 0)]
        else:  # split the stored codes into byte planes once, then im2col each plane by copies
            lo, hi = emit_byte_plane(self.b, x.name, 1), emit_byte_plane(self.b, x.name, 2)
            planes = [
                (emit_im2col(self.b, lo, *geo[:4], zs & 255, 0), 0),
                (emit_im2col(self.b, hi, *geo[:4], zs >> 8, 0), 1),
            ]
        terms = native_plane_terms(self.b, planes, wm, m, self.path)
        const = m * (op.params["bias"].astype(object) - x.st.offset * wsum.astype(object))
        return self._req(op, terms, const, ost, (-1,))

    def _qconv(
        self, op: Op, x: _Val, wm: np.ndarray, geo: tuple, term: Term, const: object, ost: Storage
    ) -> str | None:
        """The whole conv as one native ``QConv`` (uint8 output, one int64 requantization term), else None."""
        rq = self._rq_attrs(op, term, const, ost)
        return None if rq is None else emit_qconv(self.b, x.name, wm, *geo, rq)

    def _rq_attrs(
        self, op: Op, term: Term, const: object, ost: Storage, dtype: type = np.uint8
    ) -> dict | None:
        """The one-term requantization attributes of a fused native conv with ``dtype`` output, else None."""
        if np.dtype(ost.dtype) != np.dtype(dtype):
            return None
        a = op.attrs
        return native_requant_attrs(
            [term],
            np.asarray(const, dtype=object),
            op.params["shift"],
            a["round_mode"],
            a["zp_out"],
            a["lo"],
            a["hi"],
            ost,
            (-1,),
            where=op.name,
        )

    # -- linear ops ------------------------------------------------------------------------------
    def _conv(self, op: Op, args: list[_Val], ost: Storage, oinfo: TensorInfo) -> str:
        (x,), a, w = args, op.attrs, op.params["w"].astype(np.int64)
        if op.name in self.plans:
            return emit_qlinear_conv(
                self.b, x.name, op, self.plans[op.name], x.st, ost, path=self.path, channels_last=x.nhwc
            )
        wsum = w.reshape(w.shape[0], -1).sum(axis=1)
        if self.native and x.nhwc:
            return self._native_conv(op, x, ost, wsum)
        m = op.params["multiplier"].astype(object)
        if x.st.dtype != np.uint8 or not is_int8(w):  # 16-bit: byte planes (ort_wide), NCHW
            acc, xm = emit_wide_conv(self.b, x.name, op, x.st)
            const = m * (op.params["bias"].astype(object) - x.st.offset * wsum.astype(object))
            return self._req(op, [Term(acc, m, xm)], const, ost, (-1, 1, 1))
        zs = int(a["pad_value"]) + x.st.offset
        k = int(np.prod(w.shape[1:]))
        xm = k * max(zs, 255 - zs) * int(np.abs(w).max(initial=0))
        const = m * (op.params["bias"].astype(object) + int(a["pad_value"]) * wsum.astype(object))
        if x.nhwc:
            mm = emit_im2col_matmul(self.b, x.name, w, zs, a["strides"], a["pads"], a["dilations"], self.path)
            return self._req(op, [Term(mm, m, xm)], const, ost, (-1,))
        ci = self.b.op(
            "ConvInteger",
            [
                x.name,
                self.b.const((w + 128).astype(np.uint8), np.uint8, "w"),
                self.b.const(zs, np.uint8, "xzp"),
                self.b.const(128, np.uint8, "wzp"),
            ],
            kernel_shape=list(w.shape[2:]),
            strides=a["strides"],
            pads=a["pads"],
            dilations=a["dilations"],
            group=a["group"],
        )
        return self._req(op, [Term(ci, m, xm)], const, ost, (-1, 1, 1))

    def _matmul(self, op: Op, args: list[_Val], ost: Storage, oinfo: TensorInfo) -> str:
        (x,), w = args, op.params["w"]
        if self.native and (x.st.dtype != np.uint8 or not is_int8(w)):  # byte planes, one native Requant
            m = op.params["multiplier"].astype(object)
            if x.st.dtype == np.uint8:
                planes = [(x.name, 0)]
            else:
                planes = [(emit_byte_plane(self.b, x.name, 1), 0), (emit_byte_plane(self.b, x.name, 2), 1)]
            terms = native_plane_terms(self.b, planes, w.astype(np.int64), m, self.path)
            wsum = w.astype(np.int64).sum(axis=0).astype(object)
            const = m * (op.params["bias"].astype(object) - x.st.offset * wsum)
            return self._req(op, terms, const, ost, ())
        if x.st.dtype != np.uint8 or not is_int8(w):  # 16-bit: byte planes (ort_wide)
            m = op.params["multiplier"].astype(object)
            acc, xm = emit_wide_matmul(self.b, x.name, op, x.st, self.path)
            wsum = w.astype(np.int64).sum(axis=0).astype(object)
            const = m * (op.params["bias"].astype(object) - x.st.offset * wsum)
            return self._req(op, [Term(acc, m, xm)], const, ost, ())
        w = w.astype(np.int8)
        wname, wzp = int8_weights(self.b, w, self.path)
        mm = self.b.op("MatMulInteger", [x.name, wname, self.b.const(x.st.offset, np.uint8, "xzp"), wzp])
        qm = max(abs(x.info.qmin), abs(x.info.qmax))
        xm = w.shape[0] * qm * int(np.abs(w.astype(np.int64)).max(initial=0))
        m = op.params["multiplier"].astype(object)
        return self._req(op, [Term(mm, m, xm)], m * op.params["bias"].astype(object), ost, ())

    # -- elementwise requantizing ops --------------------------------------------------------------
    def _add(self, op: Op, args: list[_Val], ost: Storage, oinfo: TensorInfo) -> str:
        a, m = op.attrs, [int(v) for v in op.params["multiplier"]]
        xa, xb = args
        for emit in (emit_qlinear_add, emit_float32_add) if self.qlinear else ():
            fused = emit(self.b, xa.name, xb.name, op, xa.st, xb.st, ost)
            if fused is not None:
                return fused
        const = -m[0] * (xa.st.offset + a["zp_a"]) - m[1] * (xb.st.offset + a["zp_b"])
        terms = [Term(xa.name, np.array(m[0]), self.xmax(xa)), Term(xb.name, np.array(m[1]), self.xmax(xb))]
        return self._req(op, terms, const, ost, ())

    def _rescale(self, op: Op, args: list[_Val], ost: Storage, oinfo: TensorInfo) -> str:
        (x,), m = args, int(op.params["multiplier"][0])
        const = -m * (x.st.offset + op.attrs["zp_in"])
        return self._req(op, [Term(x.name, np.array(m), self.xmax(x))], const, ost, ())

    def _avgpool(self, op: Op, args: list[_Val], ost: Storage, oinfo: TensorInfo) -> str:
        (x,), a, m = args, op.attrs, int(op.params["multiplier"][0])
        zs = x.st.offset + a["zp_in"]
        area = math.prod(a["kernel"])
        if a.get("global"):
            wide = self.b.op("Cast", [x.name], to=TensorProto.INT32)
            axes = [1, 2] if x.nhwc else [2, 3]
            total = self.b.op("ReduceSum", [wide, self.b.const(axes, np.int64, "axes")], keepdims=1)
            return self._req(op, [Term(total, np.array(m), area * self.xmax(x))], -m * area * zs, ost, ())
        self.u8(x, op)
        shape = x.info.shape
        if not shape or any(not isinstance(d, int) for d in shape[1:]):
            raise KernelError(f"op {op.name!r}: a windowed average pool needs a static input shape.")
        pads = _ceil_pads(shape, a["kernel"], a["strides"], a["pads"], a.get("ceil_mode", 0))
        ones = np.ones((shape[1], 1, *a["kernel"]), np.uint8)
        total = self.b.op(
            "ConvInteger",
            [x.name, self.b.const(ones, np.uint8, "ones"), self.b.const(zs, np.uint8, "xzp")],
            kernel_shape=list(a["kernel"]),
            strides=a["strides"],
            pads=pads,
            group=shape[1],
        )
        return self._req(op, [Term(total, np.array(m), area * 255)], 0, ost, ())


#: Ops that keep their input's layout; ops that run channels-last when ``_wants_nhwc`` says so.
_ELEMENTWISE = {"add", "rescale", "clamp", "lut", "copy"}
_CHANNELS_LAST = {"conv", "maxpool", "avgpool"}


def _rank4(x: _Val) -> bool:
    return x.info.shape is None or len(x.info.shape) == 4


def _wants_nhwc(op: Op, x: _Val, native: bool = False) -> bool:
    """Group-1 2-D convolutions (im2col + MatMulInteger; any code width with the native ops), and pools
    whose input is already NHWC (max pools on uint8 storage only: NhwcMaxPool takes 8-bit codes)."""
    if x.info.shape is not None and len(x.info.shape) != 4:
        return False
    if op.kind == "conv":
        if native:
            shape = x.info.shape
            cin = shape[1] if shape is not None and isinstance(shape[1], int) else None
            depthwise = x.st.dtype == np.uint8 and is_depthwise(op.params["w"], op.attrs["group"], cin)
            return op.attrs["group"] == 1 or depthwise
        return op.attrs["group"] == 1 and x.st.dtype == np.uint8 and is_int8(op.params["w"])
    if op.kind == "avgpool":
        return bool(op.attrs.get("global")) and x.nhwc
    two_d = len(op.attrs.get("kernel", ())) == 2  # MaxPoolI32 (native, int32-stored codes) is 2-D
    return (
        x.nhwc
        and (x.st.dtype == np.uint8 or (native and op.kind == "maxpool" and two_d))
        and not op.attrs.get("global")
        and op.attrs.get("pad_value", 0) is not None
    )


def _ceil_pads(shape: list, kernel: list, strides: list, pads: list, ceil: int) -> list[int]:
    """End pads that make ceil_mode windows explicit (as the reference executor does)."""
    out = list(pads)
    if not ceil:
        return out
    n = len(kernel)
    for i, (k, s) in enumerate(zip(kernel, strides, strict=True)):
        size = shape[2 + i] + pads[i] + pads[i + n]
        n_out = math.ceil((size - k) / s) + 1
        if (n_out - 1) * s >= shape[2 + i] + pads[i]:
            n_out -= 1
        out[i + n] += max(0, (n_out - 1) * s + k - size)
    return out


def lower_program(
    program: Program,
    *,
    name: str,
    opset: int = 17,
    expose: list[str] | None = None,
    nhwc: bool = True,
    qlinear: bool = True,
    int_path: IntPath | None = None,
    native: bool = False,
) -> LoweredProgram:
    """ORT nodes computing ``program`` exactly (module docstring); ``expose`` adds tensors as outputs.

    ``native``: use the ``zonnx.native`` custom ops (``ort_native``) where they apply; the session that
    runs the result must have the kernel library registered (``zonnx.backend.native``).

    Graph inputs/outputs hold the program's own dtypes, named ``f"{name}/{tensor}"``. ``int_path``: the
    form of 8-bit weights (default: this host's, ``zonnx.hostcpu.int_path``). Raises KernelError naming
    the op when an op has no exact ORT lowering.
    """
    if opset < 13:
        raise KernelError(f"opset {opset} is too old for the NPU lowering; use 13 or newer.")
    low = _Lowerer(program, name, resolve_int_path(int_path), nhwc, qlinear, native)
    b, lowered = low.b, LoweredProgram([], [], [], [], opset=opset)
    for info in program.inputs:
        gname = f"{name}/{info.name}"
        lowered.inputs.append(_value_info(gname, info))
        lowered.input_names[info.name] = gname
        stored = to_storage(b, gname, info.dtype)
        low.env[info.name] = _Val(stored, storage_of(info.dtype), info)
    for op in program.ops:
        low.lower(op)
    wanted = [t.name for t in program.outputs] + [t for t in (expose or []) if t not in lowered.output_names]
    for tensor in wanted:
        if tensor in lowered.output_names or tensor in lowered.input_names:
            continue
        v = low.layout(low.env[tensor], False)
        gname = f"{name}/{tensor}"
        from_storage(b, v.name, v.info.dtype, gname)
        lowered.outputs.append(_value_info(gname, v.info))
        lowered.output_names[tensor] = gname
    lowered.nodes, lowered.initializers = b.nodes, b.initializers
    lowered.opset_imports = {"": opset}
    if any(n.domain == MS_DOMAIN for n in b.nodes):
        lowered.opset_imports[MS_DOMAIN] = 1
    if any(n.domain == NATIVE_DOMAIN for n in b.nodes):
        lowered.opset_imports[NATIVE_DOMAIN] = 1
    logger.info("lowered %d program ops to %d ORT nodes", len(program.ops), len(b.nodes))
    return lowered


def program_to_model(
    program: Program,
    *,
    name: str = "npu",
    opset: int = 17,
    expose: list[str] | None = None,
    int_path: IntPath | None = None,
    native: bool = False,
) -> onnx.ModelProto:
    """A standalone model (IR 10) running ``program`` in ORT; inputs/outputs named ``f"{name}/{tensor}"``."""
    low = lower_program(program, name=name, opset=opset, expose=expose, int_path=int_path, native=native)
    graph = helper.make_graph(low.nodes, name, low.inputs, low.outputs, low.initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(d, v) for d, v in low.opset_imports.items()],
        functions=low.functions,
    )
    model.ir_version = IR_VERSION
    return model
