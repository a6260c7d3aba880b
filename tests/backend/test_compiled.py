"""The compiled-model format: NpuSubgraph nodes with their programs, valid ONNX, readable by inspect."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.backend.partition_models import quantize
from zonnx import zoo
from zonnx.backend.compile_api import CompiledModel, compile_model
from zonnx.backend.compiled import (
    NPU_DOMAIN,
    NPU_OP,
    CompiledModelError,
    compiled_info,
    npu_nodes,
    read_program,
)
from zonnx.backend.compiler import FORMAT_VERSION
from zonnx.inspection import inspect_model
from zonnx.zoo.digits import digits_data


@pytest.fixture(scope="module")
def fix_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, _ = digits_data("calib")
    feeds = [{"input": x[i : i + 1]} for i in range(32)]
    return quantize(zoo.get("digits_cnn"), tmp_path_factory.mktemp("c") / "fix.onnx", feeds, "fix")


def test_structure_and_attributes(fix_model: Path, tmp_path: Path) -> None:
    cm = compile_model(fix_model, "dpu-b4096", cache_key="k1")
    nodes = npu_nodes(cm.model)
    assert len(nodes) == 1 == len(cm.programs)
    node = nodes[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["target"] == b"dpu-b4096" and attrs["program_version"] == FORMAT_VERSION
    assert attrs["cache_key"] == b"k1" and read_program(node).to_bytes() == cm.programs[0].to_bytes()
    # FixNeuron boundary: CPU QuantizeLinear -> integer codes -> NpuSubgraph -> CPU DequantizeLinear
    ops = [n.op_type for n in cm.model.graph.node]
    assert ops.count(NPU_OP) == 1 and "QuantizeLinear" in ops and "DequantizeLinear" in ops
    assert node.input[0].endswith("__npu_q") and node.output[0] == "logits__npu_q"
    # weights live in the program: only small boundary constants remain
    assert sum(t.ByteSize() for t in cm.model.graph.initializer) < 1000
    onnx.checker.check_model(cm.model)  # com.zonnx has no schema in onnx: accepted
    path = cm.save(tmp_path / "c.onnx")
    summary = inspect_model(path)
    assert summary.to_json().count(f"{NPU_DOMAIN}:{NPU_OP}") >= 1
    info = compiled_info(onnx.load(path))
    assert info["compiled"] == "1" and info["target"] == "dpu-b4096"
    again = CompiledModel.from_proto(onnx.load(path))
    assert again.partition.npu_nodes == cm.partition.npu_nodes and "subgraph 0: " in cm.report()


def test_corrupted_program_is_refused(fix_model: Path) -> None:
    cm = compile_model(fix_model, "dpu-b4096")
    node = npu_nodes(cm.model)[0]
    attr = next(a for a in node.attribute if a.name == "program")
    blob = bytearray(attr.s)
    blob[100] ^= 1
    attr.s = bytes(blob)
    with pytest.raises(CompiledModelError, match="does not match its sha256"):
        read_program(node)


def test_program_runs_like_reference(fix_model: Path) -> None:
    from zonnx.backend.runtime.reference import run_program

    cm = compile_model(fix_model, "dpu-b4096")
    prog = cm.programs[0]
    x, _ = digits_data("test")
    codes = np.clip(np.rint(x[:8] / prog.inputs[0].scale[0]), prog.inputs[0].qmin, prog.inputs[0].qmax)
    out = run_program(prog, {prog.inputs[0].name: codes.astype(np.int8)})
    assert out["logits"].shape == (8, 10)


def test_int8_codes_behind_a_transpose_are_not_quantized_again(tmp_path: Path, caplog) -> None:
    """TFLite's pattern: QuantizeLinear -> Transpose (NHWC -> NCHW) -> the first Conv's DequantizeLinear.

    The NPU input is the Transpose's int8 output: it enters the NpuSubgraph as it is (a boundary
    QuantizeLinear on int8 made the compiled model invalid in ORT)."""
    from onnx import numpy_helper

    from zonnx.backend.session import CPU_PROVIDER, NPU_PROVIDER, InferenceSession
    from zonnx.verify import run_ort

    rng = np.random.default_rng(0)
    consts = {
        "xs": np.float32(0.05), "xz": np.int8(-3), "ws": np.float32(0.02), "wz": np.int8(0),
        "wq": rng.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8), "bs": np.float32(0.05 * 0.02),
        "bz": np.int32(0), "bq": rng.integers(-500, 500, 4).astype(np.int32), "rs": np.float32(0.04),
        "rz": np.int8(-128),
    }  # fmt: skip
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,6,6,3] x) => (float[1,4,6,6] y) {
            xq = QuantizeLinear(x, xs, xz)
            xt = Transpose<perm = [0, 3, 1, 2]>(xq)
            xd = DequantizeLinear(xt, xs, xz)
            wd = DequantizeLinear(wq, ws, wz)
            bd = DequantizeLinear(bq, bs, bz)
            c = Conv<pads = [1, 1, 1, 1]>(xd, wd, bd)
            r = Relu(c)
            rq = QuantizeLinear(r, rs, rz)
            y = DequantizeLinear(rq, rs, rz)
        }""")
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items())
    src = tmp_path / "qdq.onnx"
    onnx.save(model, src)
    cm = compile_model(src, "zhouyi-x2")
    node = npu_nodes(cm.model)[0]
    assert node.input[0] in ("xq", "xt")  # the codes themselves, no boundary QuantizeLinear
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] in ("xq", "xt") for n in cm.model.graph.node)
    path = cm.save(tmp_path / "npu.onnx")
    x = rng.standard_normal((1, 6, 6, 3)).astype(np.float32)
    with caplog.at_level("WARNING"):
        sess = InferenceSession(str(path), providers=[NPU_PROVIDER, CPU_PROVIDER])
        got = sess.run(None, {"x": x})[0]
    assert "cannot load" not in caplog.text  # ORT runs the compiled model (no reference fallback)
    want = run_ort(str(src), {"x": x})["y"]
    # the NPU's integer requantization against ORT's float QDQ: at most one output step apart
    assert np.abs(got - want).max() <= consts["rs"] * 1.001 and (got == want).mean() > 0.9
