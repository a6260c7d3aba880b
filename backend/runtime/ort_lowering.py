"""Lower an NPU ``Program`` to ONNX nodes that ORT's CPU provider runs natively, bit-exact to the reference.

Every program tensor is held as ``q + offset`` in its storage type (``ort_kernels``: 8-bit codes as
uint8), so the integer kernels take their fast unsigned-activation paths. Each op kind's lowering lives
in its module under ``zonnx.backend.ops`` (``ops.registry``: conv by im2col + MatMulInteger, QLinearConv
or the native QConv; matmul by MatMulInteger; add / rescale / avgpool / mul / lincomb as one linear form
requantized once; code moves, pools, concat and tables on stored codes); this module drives them:

- layout: a rank-4 tensor is transposed only where an op needs the other layout (once per tensor); an
  op kind's ``layout`` rule says whether it runs in the program's NCHW, in its first input's layout, or
  channels-last when its rule asks for it;
- requantization: ``req`` builds the op's formula once (``ort_kernels.RequantForm``) and emits it as one
  native ``Requant`` (``ort_native``, with the kernel library) or as ``ort_kernels.emit_requant`` (float64
  when provably exact, else int64);
- native residual adds: a ``QConv`` whose output only a two-term ``RequantU8`` reads takes that add into
  its epilogue (``ort_fuse``, after every op is lowered);
- 8-bit weights of MatMulInteger and QLinearConv take the host's integer path (``zonnx.hostcpu``): s8
  where VNNI makes ORT's fast u8 x s8 kernels exact, else ``w + 128`` as u8 with zero point 128. The path
  is part of the lowered-model cache key.

The nodes are returned inline (no FunctionProto): ORT inlines functions anyway and the provider can wrap
them. Names: graph inputs/outputs are ``f"{name}/{tensor}"``; internal names start with ``f"{name}/"``.
Public API: ``lower_program``, ``LoweredProgram``, ``program_to_model``.
"""

from __future__ import annotations

__all__ = ["LOWERING_VERSION", "LoweredProgram", "lower_program", "program_to_model", "KernelError"]

import dataclasses
import logging

import numpy as np
import onnx
from onnx import helper

from zonnx.backend.compiler.program import Op, Program, TensorInfo
from zonnx.backend.ops import registry
from zonnx.hostcpu import IntPath

from .ort_fuse import fuse_residual_adds
from .ort_kernels import (
    Builder,
    KernelError,
    RequantForm,
    Storage,
    Term,
    emit_requant,
    from_storage,
    resolve_int_path,
    storage_of,
    to_storage,
)
from .ort_native import NATIVE_DOMAIN, emit_int8_to_u8, emit_native_requant
from .ort_values import MS_DOMAIN, Val
from .qlinear_exact import ConvRequant

logger = logging.getLogger(__name__)
IR_VERSION = 10
#: Bumped when lowered graphs change (2: QLinearConv/QLinearAdd/float32 adds; 3: mul, lincomb, matmul2, ...;
#: 4: 16-bit conv/matmul; 5: integer path per host, u8 x u8 weights without VNNI; 6: residual adds fused
#: into the native QConv).
LOWERING_VERSION = 6


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


def _value_info(name: str, info: TensorInfo) -> onnx.ValueInfoProto:
    shape = None if info.shape is None else [d if isinstance(d, (int, str)) else None for d in info.shape]
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype)), shape)


class _Lowerer:
    """The state the op modules' ``lower_ort`` functions read: builder ``b``, options, tensors in ORT."""

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
        self.env: dict[str, Val] = {}
        self.plans: dict[str, ConvRequant] = {}

    def info(self, tensor: str) -> TensorInfo:
        if tensor not in self.p.tensors:
            raise KernelError(f"program tensor {tensor!r} has no TensorInfo; recompile the model.")
        return self.p.tensors[tensor]

    def u8(self, v: Val, op: Op) -> None:
        """Refuse an input that is not held as uint8 (ORT's integer kernels take 8-bit activations)."""
        if v.st.dtype != np.uint8:
            raise KernelError(
                f"op {op.name!r} ({op.kind}): ORT's integer kernels take 8-bit activations, "
                f"tensor {v.info.name!r} is {v.info.dtype}."
            )

    def xmax(self, v: Val) -> int:
        """The largest stored value of ``v``."""
        return v.info.qmax + v.st.offset

    def layout(self, v: Val, nhwc: bool) -> Val:
        """``v`` in the wanted layout (one Transpose, made once per tensor)."""
        if v.nhwc == nhwc:
            return v
        if v.other is None:
            v.other = self.b.op("Transpose", [v.name], perm=[0, 2, 3, 1] if nhwc else [0, 3, 1, 2])
        return Val(v.other, v.st, v.info, nhwc, v.name)

    def lower(self, op: Op) -> None:
        args = [self.env[i] for i in op.inputs]
        oinfo = self.info(op.outputs[0])
        ost = storage_of(oinfo.dtype)
        kind = registry.kind(op.kind)
        if kind is None:
            raise KernelError(f"op {op.name!r}: op kind {op.kind!r} has no ORT lowering.")
        if kind.layout == "input":  # the first input's layout
            nhwc = args[0].nhwc
        elif kind.layout == "program":
            nhwc = False
        else:
            nhwc = kind.layout(self, op, args, ost)
        args = [self.layout(v, nhwc) for v in args]
        name = kind.ort(self, op, args, ost, oinfo)
        self.env[op.outputs[0]] = Val(name, ost, oinfo, nhwc)

    def requant_form(
        self, op: Op, terms: list[Term], const: object, ost: Storage, bshape: tuple
    ) -> RequantForm:
        """The stored requantization of ``op`` (its shift, rounding, zero point and clamp) over ``terms``."""
        a = op.attrs
        return RequantForm(
            tuple(terms),
            np.asarray(const, dtype=object),
            op.params["shift"],
            a["round_mode"],
            a["zp_out"],
            a["lo"],
            a["hi"],
            ost,
            bshape,
            op.name,
        )

    def req(self, op: Op, terms: list[Term], const: object, ost: Storage, bshape: tuple) -> str:
        """Emit ``requant_form``: one native ``Requant`` when enabled and it fits, else ONNX nodes."""
        form = self.requant_form(op, terms, const, ost, bshape)
        if self.native:
            out = emit_native_requant(self.b, *form.args(), where=form.where)
            if out is not None:
                return out
        return emit_requant(self.b, *form.args(), where=form.where)


def lower_program(
    program: Program,
    *,
    name: str,
    opset: int = 17,
    expose: list[str] | None = None,
    nhwc: bool = True,
    qlinear: bool | None = None,
    int_path: IntPath | None = None,
    native: bool = False,
    fuse: bool = True,
) -> LoweredProgram:
    """ORT nodes computing ``program`` exactly (module docstring); ``expose`` adds tensors as outputs.

    ``native``: use the ``zonnx.native`` custom ops (``ort_native``) where they apply; the session that
    runs the result must have the kernel library registered (``zonnx.backend.native``).
    ``qlinear``: ORT's QLinearConv / QLinearAdd where ``qlinear_exact`` proves them exact; by default only
    without ``native`` (the native QConv / QDwConv / RequantU8 run the same power-of-two programs faster:
    dpu-b4096 ResNet-18 5.5 -> 5.1 ms, MobileNetV2 2.67 -> 2.61 ms, one thread, same outputs).

    Graph inputs/outputs hold the program's own dtypes, named ``f"{name}/{tensor}"``. ``int_path``: the
    form of 8-bit weights (default: this host's, ``zonnx.hostcpu.int_path``). Raises KernelError naming
    the op when an op has no exact ORT lowering. ``fuse`` (with ``native``): each residual add whose conv
    output is read by nothing else and is not a graph output runs in that ``QConv``'s epilogue
    (``ort_fuse``, same outputs bit for bit); False keeps them apart (tests compare both).
    """
    if opset < 13:
        raise KernelError(f"opset {opset} is too old for the NPU lowering; use 13 or newer.")
    qlinear = not native if qlinear is None else qlinear
    low = _Lowerer(program, name, resolve_int_path(int_path), nhwc, qlinear, native)
    b, lowered = low.b, LoweredProgram([], [], [], [], opset=opset)
    for info in program.inputs:
        gname = f"{name}/{info.name}"
        lowered.inputs.append(_value_info(gname, info))
        lowered.input_names[info.name] = gname
        st = storage_of(info.dtype)
        # Int8ToU8's rule: the uint8 storage q + 128
        int8 = native and info.dtype == "int8" and st.dtype == np.uint8 and st.offset == 128
        stored = emit_int8_to_u8(b, gname) if int8 else to_storage(b, gname, info.dtype)
        low.env[info.name] = Val(stored, st, info)
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
    if native and fuse:
        uint8 = {n for v in low.env.values() if v.st.dtype == np.uint8 for n in (v.name, v.other) if n}
        b.nodes = fuse_residual_adds(b.nodes, lowered.output_names.values(), uint8)
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
    fuse: bool = True,
) -> onnx.ModelProto:
    """A standalone model (IR 10) running ``program`` in ORT; inputs/outputs named ``f"{name}/{tensor}"``
    (``lower_program``'s options)."""
    low = lower_program(
        program, name=name, opset=opset, expose=expose, int_path=int_path, native=native, fuse=fuse
    )
    graph = helper.make_graph(low.nodes, name, low.inputs, low.outputs, low.initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(d, v) for d, v in low.opset_imports.items()],
        functions=low.functions,
    )
    model.ir_version = IR_VERSION
    return model
