"""The native kernels built with UndefinedBehaviorSanitizer (abort on the first report) run zoo programs
bit-exactly: no overflow, bad shift or out-of-bounds index hides behind a right answer.

The sanitized library is cached beside the normal one (its own source key), so only the first run builds
it (about 20 s on 2 cores)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.quantization import QuantFormat

import zonnx
from tests.backend.native_support import fused_qconvs, residual_conv_outputs
from tests.backend.test_compiler import _compile, digits  # noqa: F401  (module fixture)
from zonnx import zoo
from zonnx.backend.compiler.lower import compile_subgraph, whole_model_subgraph
from zonnx.backend.native import build_library
from zonnx.backend.runtime.ort_lowering import program_to_model
from zonnx.backend.runtime.reference import run_program
from zonnx.build_npu import target_quantize_kwargs
from zonnx.quantization.calibration.readers import ListReader
from zonnx.zoo.digits import digits_data

pytestmark = pytest.mark.slow


def assert_exact_under_lib(
    lib: Path, model: onnx.ModelProto, inp: str, codes: np.ndarray, ref: dict[str, np.ndarray]
) -> None:
    """``model`` (a program lowered with name ``p``) run by ORT's CPU provider with the library ``lib``
    registered on input ``inp`` = ``codes``: every output equals the reference tensor of its name."""
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(lib))
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outs = sess.run(None, {f"p/{inp}": codes})
    for o, v in zip(sess.get_outputs(), outs, strict=True):
        assert np.array_equal(v.astype(np.int64), ref[o.name[2:]]), o.name


@pytest.mark.parametrize("target", ["bm1684x", "zhouyi-x2"])
def test_zoo_programs_under_ubsan(digits: dict, target: str) -> None:  # noqa: F811
    lib = build_library(sanitize=True).path
    prog, ins, _ = _compile(digits["qdq"], target)
    info = prog.inputs[0]
    x, _ = digits_data("test")
    q = np.clip(np.rint(x[:32] / info.scale[0]) + info.zero_point[0], info.qmin, info.qmax).astype(info.dtype)
    ref = run_program(prog, {ins[0]: q}, debug=True)
    inner = [t for t in ref if t != ins[0]]
    model = program_to_model(prog, name="p", expose=inner, native=True)
    assert any(n.domain == "zonnx.native" for n in model.graph.node)
    assert_exact_under_lib(lib, model, ins[0], q, ref)


@pytest.mark.parametrize(
    ("name", "target", "act"),
    [("mobilenetv2-random", "bm1684x", None), ("resnet18-random", "zhouyi-x2", "int16")],
)
def test_fused_kernels_under_ubsan(tmp_path: Path, name: str, target: str, act: str | None) -> None:
    """QDwConv and the residual adds fused into QConv (MobileNetV2) and QConv16 / MaxPoolI32 (ResNet-18 with
    16-bit activations) under UBSan: every program tensor equals the reference."""
    lib = build_library(sanitize=True).path
    q = tmp_path / "q.onnx"
    kwargs = (
        dict(activation_type=act, weight_type="int8", extra_options={"Target": target})
        if act
        else target_quantize_kwargs(target, QuantFormat.QDQ)
    )
    zonnx.quantize_static(
        str(zoo.get(name)), str(q), ListReader(zoo.sample_inputs(name, 2, seed=1)), **kwargs
    )
    model = onnx.load(q)
    prog = compile_subgraph(model, *whole_model_subgraph(model), target)
    info = prog.inputs[0]
    x = zoo.sample_inputs(name, 1, seed=3)[0]["input"]
    codes = np.clip(np.rint(x / info.scale[0]) + info.zero_point[0], info.qmin, info.qmax).astype(info.dtype)
    ref = run_program(prog, {info.name: codes}, debug=True)
    inner = [t for t in ref if t != info.name]
    private = residual_conv_outputs(prog)
    # every tensor exposed, then all but the conv outputs a residual add reads alone (fused into the QConv)
    for expose in (inner, [t for t in inner if t not in private]):
        lowered = program_to_model(prog, name="p", expose=expose, native=True)
        ops = {n.op_type for n in lowered.graph.node}
        assert ({"QDwConv"} if act is None else {"QConv16", "MaxPoolI32"}) <= ops
        assert fused_qconvs(lowered) == (10 if act is None and expose is not inner else 0)
        assert_exact_under_lib(lib, lowered, info.name, codes, ref)
