"""ORT lowerings of the program ops that move or select stored codes without requantizing them.

An offset commutes with each of these ops (max, clamp, concat, reshapes, resize, table lookup), so they
act directly on the stored ``q + offset`` values (``ort_kernels`` storage). Mixed into ``_Lowerer``.
"""

from __future__ import annotations

__all__ = ["CodeOps"]


from typing import Any

import numpy as np
from onnx import TensorProto

from zonnx.backend.compiler.program import Op, TensorInfo

from .ort_kernels import Builder, KernelError, Storage
from .ort_native import emit_maxpool_i32

MS_DOMAIN = "com.microsoft"  # NhwcMaxPool: an ORT CPU contrib kernel (uint8/int8)


class CodeOps:
    """``_<kind>`` methods for code ops; the host class provides ``b`` (a Builder)."""

    b: Builder

    def _maxpool(self, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
        (x,), a = args, op.attrs
        if a.get("global"):
            return self.b.op("ReduceMax", [x.name], axes=[1, 2] if x.nhwc else [2, 3], keepdims=1)
        wide = x.st.dtype != np.uint8  # 16-bit codes: MaxPool in float32 (exact below 2^24)
        if wide and x.nhwc:  # only with the native kernels (_wants_nhwc)
            return emit_maxpool_i32(self.b, x.name, a)
        src = self.b.op("Cast", [x.name], to=TensorProto.FLOAT) if wide else x.name
        out = self.b.op(
            "NhwcMaxPool" if x.nhwc else "MaxPool",
            [src],
            kernel_shape=a["kernel"],
            strides=a["strides"],
            pads=a["pads"],
            dilations=a.get("dilations", [1] * len(a["kernel"])),
            ceil_mode=a.get("ceil_mode", 0),
            **({"domain": MS_DOMAIN} if x.nhwc else {}),
        )
        return self.b.op("Cast", [out], to=ost.onnx_type) if wide else out

    def _clip(self, name: str, lo: int, hi: int, st: Storage) -> str:
        return self.b.op(
            "Clip",
            [
                name,
                self.b.const(lo + st.offset, st.dtype, "lo"),
                self.b.const(hi + st.offset, st.dtype, "hi"),
            ],
        )

    def _clamp(self, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
        return self._clip(args[0].name, op.attrs["lo"], op.attrs["hi"], args[0].st)

    def _concat(self, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
        if any(v.st != ost for v in args):
            raise KernelError(f"op {op.name!r}: concat inputs must share the output's dtype.")
        out = self.b.op("Concat", [v.name for v in args], axis=op.attrs["axis"])
        lo, hi = op.attrs["lo"], op.attrs["hi"]
        if lo > min(v.info.qmin for v in args) or hi < max(v.info.qmax for v in args):
            out = self._clip(out, lo, hi, ost)
        return out

    def _copy(self, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
        return self.b.op("Identity", [args[0].name])

    def _reshape(self, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
        shape = self.b.const(op.attrs["shape"], np.int64, "shape")
        # allowzero exists from opset 14: written only when set, so opset-13 models stay valid
        extra = {"allowzero": 1} if op.attrs.get("allowzero") else {}
        return self.b.op("Reshape", [args[0].name, shape], **extra)

    def _flatten(self, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
        return self.b.op("Flatten", [args[0].name], axis=op.attrs["axis"])

    def _transpose(self, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
        perm = op.attrs.get("perm")
        return self.b.op("Transpose", [args[0].name], **({} if perm is None else {"perm": perm}))

    def _squeeze(self, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
        axes = op.attrs.get("axes")
        ins = [args[0].name] + ([] if axes is None else [self.b.const(axes, np.int64, "axes")])
        return self.b.op("Squeeze", ins)

    def _unsqueeze(self, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
        return self.b.op("Unsqueeze", [args[0].name, self.b.const(op.attrs["axes"], np.int64, "axes")])

    def _resize_nearest(self, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
        a = op.attrs
        if a["sizes"] is not None:
            ins = [args[0].name, "", "", self.b.const(a["sizes"], np.int64, "sizes")]
        else:
            ins = [args[0].name, "", self.b.const(a["scales"], np.float32, "scales")]
        return self.b.op(
            "Resize",
            ins,
            mode="nearest",
            coordinate_transformation_mode=a["ctm"],
            nearest_mode=a["nearest_mode"],
        )

    def _lut(self, op: Op, args: list[Any], ost: Storage, oinfo: TensorInfo) -> str:
        (x,) = args
        table = op.params["table"].astype(np.int64)
        size = 256 if x.st.dtype == np.uint8 else 1 << 16
        codes = np.arange(size) - x.st.offset - int(op.attrs["qmin_in"])
        full = table[np.clip(codes, 0, table.size - 1)] + ost.offset
        idx = self.b.op("Cast", [x.name], to=TensorProto.INT32)
        return self.b.op("Gather", [self.b.const(full, ost.dtype, "table"), idx], axis=0)
