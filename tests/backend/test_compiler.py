"""Compile real quantized models (digits CNN, ResNet-18; QDQ and FixNeuron) and compare with ORT's QDQ execution."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType

import zonnx
from tests.backend.native_support import lowered_session
from zonnx import zoo
from zonnx.backend.compiler import CompileError, Program
from zonnx.backend.compiler.lower import compile_subgraph, whole_model_subgraph
from zonnx.backend.runtime.ort_lowering import program_to_model
from zonnx.backend.runtime.reference import execute_op, run_program
from zonnx.zoo.digits import digits_data

#: A folder shared by one `bash tools/dev.sh test` run (it sets this): the native run leaves the exactness
#: tests' quantized models there, and the emulated runs of tools/exactness.sh read them instead of
#: quantizing ResNet-18 again under qemu (about 5 minutes each). What they test, the compiled programs
#: against ORT on the emulated CPU, still runs there.
SHARED_MODELS_ENV = "ZONNX_TEST_MODELS"


def _models_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """``$ZONNX_TEST_MODELS/name`` when set (created), else a fresh temporary folder."""
    shared = os.environ.get(SHARED_MODELS_ENV)
    if not shared:
        return tmp_path_factory.mktemp(name)
    folder = Path(shared) / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.it, None)


def _quantize(src: Path, dst: Path, feeds: list, fmt: str) -> Path:
    """``src`` quantized for the exactness tests; no per-layer report (they compare programs, and under the
    emulated CPUs of tools/exactness.sh the report's unoptimized runs of ResNet-18 cost minutes). A model
    already at ``dst`` (a shared folder, written atomically by an earlier run) is reused."""
    if dst.is_file():
        return dst
    if fmt == "qdq":
        zonnx.quantize_static(
            str(src),
            str(dst),
            _Reader(feeds),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            extra_options={"ReportSamples": 0},
        )
    else:
        zonnx.quantize_static(
            str(src),
            str(dst),
            _Reader(feeds),
            quant_format=zonnx.VitisQuantFormat.FixNeuron,
            calibrate_method=zonnx.PowerOfTwoMethod.NonOverflow,
            extra_options={"Target": "dpu-b4096", "ReportSamples": 0},
        )
    return dst


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = _models_dir(tmp_path_factory, "digits")
    x, _ = digits_data("calib")
    feeds = [{"input": x[i : i + 1]} for i in range(64)]
    src = zoo.get("digits_cnn")
    return {
        "float": src,
        "qdq": _quantize(src, d / "qdq.onnx", feeds, "qdq"),
        "fix": _quantize(src, d / "fix.onnx", feeds, "fix"),
    }


@pytest.fixture(scope="module")
def resnet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = _models_dir(tmp_path_factory, "resnet")
    feeds = zoo.sample_inputs("resnet18-random", 4)
    src = zoo.get("resnet18-random")
    return {
        "qdq": _quantize(src, d / "qdq.onnx", feeds, "qdq"),
        "fix": _quantize(src, d / "fix.onnx", feeds, "fix"),
        "x": feeds[0]["input"],
    }


def _compile(path: Path, target: str) -> tuple[Program, list[str], list[str]]:
    model = onnx.load(path)
    names, ins, outs = whole_model_subgraph(model)
    return compile_subgraph(model, names, ins, outs, target), ins, outs


def _ort_codes(path: Path, program: Program, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Integer codes of every program tensor ORT computes in the fake-quantized model (optimizations off)."""
    model = onnx.load(path)
    produced = {o for n in model.graph.node for o in n.output}
    names = [t for t in program.tensors if t in produced]
    for n in names:
        model.graph.output.append(onnx.helper.make_value_info(n, onnx.TypeProto()))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    out = {}
    for n in names:
        v = got[n]
        if v.dtype.kind == "f":  # FixNeuron output: codes = value / 2^-pos, exact
            v = np.rint(v / program.tensors[n].scale[0])
        out[n] = v.astype(np.int64)
    return out


def _layer_diffs(program: Program, codes: dict[str, np.ndarray]) -> dict[str, tuple[int, int, int]]:
    """Each op run on ORT's own input codes vs ORT's output codes: (max |diff|, codes differing, size)."""
    stats = {}
    for op in program.ops:
        if op.outputs[0] in codes and all(i in codes for i in op.inputs):
            d = np.abs(execute_op(op, [codes[i] for i in op.inputs]) - codes[op.outputs[0]])
            stats[op.outputs[0]] = (int(d.max()), int((d > 0).sum()), int(d.size))
    return stats


def test_digits_qdq_structure_and_roundtrip(digits: dict[str, Path]) -> None:
    prog, ins, outs = _compile(digits["qdq"], "bm1684x")
    assert prog.op_counts() == {
        "conv": 5,
        "add": 1,
        "maxpool": 1,
        "copy": 2,
        "rescale": 1,
        "concat": 1,
        "flatten": 1,
        "matmul": 1,
    }
    assert [t.dtype for t in prog.inputs] == ["uint8"] and prog.outputs[0].name == outs[0]
    conv = prog.ops[0]
    assert conv.params["w"].dtype == np.int8 and conv.params["multiplier"].shape == (16,)
    assert int(conv.params["multiplier"].max()) < 2**31 and conv.attrs["round_mode"] == "half_up"
    again = Program.from_bytes(prog.to_bytes())
    assert again.to_bytes() == prog.to_bytes()
    x, _ = digits_data("test")
    q = _ort_codes(digits["qdq"], prog, {"input": x[:32]})
    a = run_program(prog, {ins[0]: q[ins[0]]})
    b = run_program(again, {ins[0]: q[ins[0]]})
    assert np.array_equal(a[outs[0]], b[outs[0]])


@pytest.mark.parametrize("target", ["bm1684x", "zhouyi-x2"])
def test_digits_qdq_accuracy_and_lsb(digits: dict[str, Path], target: str) -> None:
    prog, ins, outs = _compile(digits["qdq"], target)
    x, y = digits_data("test")
    codes = _ort_codes(digits["qdq"], prog, {"input": x})
    npu = run_program(prog, {ins[0]: codes[ins[0]]})[outs[0]]
    float_top1 = zoo.digits.evaluate_top1(digits["float"], x, y)
    npu_top1 = float(np.mean(npu.argmax(axis=1) == y))
    assert abs(npu_top1 - float_top1) <= 0.005, (npu_top1, float_top1)
    diff = np.abs(npu - codes[outs[0]])
    print(
        f"{target}: output codes differing from ORT QDQ: {(diff > 0).sum()} / {diff.size}, max {diff.max()}"
    )
    assert diff.max() <= 2
    layers = _layer_diffs(prog, codes)
    assert len(layers) >= 8
    for name, (mx, n, size) in layers.items():
        print(f"  {name}: max {mx} LSB, {n}/{size} codes differ")
        assert mx <= 1, name  # per layer, only the rounding (half_up/multiplier vs float32 half_even) differs


def test_digits_fixneuron_bit_exact_on_dpu(digits: dict[str, Path]) -> None:
    prog, ins, outs = _compile(digits["fix"], "dpu-b4096")
    assert all(int(m) & (int(m) - 1) == 0 for op in prog.ops for m in op.params.get("multiplier", [1]))
    x, y = digits_data("test")
    codes = _ort_codes(digits["fix"], prog, {"input": x})
    got = run_program(prog, {ins[0]: codes[ins[0]]}, debug=True)
    for name, ref in codes.items():  # every intermediate tensor, not only the output
        assert np.array_equal(got[name], ref), name
    float_top1 = zoo.digits.evaluate_top1(digits["float"], x, y)
    assert abs(float(np.mean(got[outs[0]].argmax(axis=1) == y)) - float_top1) <= 0.005


def test_float_scales_refused_by_power_of_two_target(digits: dict[str, Path]) -> None:
    with pytest.raises(CompileError, match="power-of-two"):
        _compile(digits["qdq"], "dpu-b4096")


def test_bad_subgraph_inputs_are_named(digits: dict[str, Path]) -> None:
    model = onnx.load(digits["qdq"])
    names, ins, outs = whole_model_subgraph(model)
    with pytest.raises(CompileError, match="not in the model"):
        compile_subgraph(model, ["nope", *names], ins, outs, "bm1684x")
    with pytest.raises(CompileError, match="produced outside the subgraph"):
        compile_subgraph(model, names[20:], ins, outs, "bm1684x")


@pytest.mark.parametrize(("fmt", "target"), [("qdq", "bm1684x"), ("fix", "dpu-b4096")])
def test_resnet18_one_image(resnet: dict, fmt: str, target: str) -> None:
    start = time.perf_counter()
    prog, ins, outs = _compile(resnet[fmt], target)
    compile_s = time.perf_counter() - start
    assert prog.op_counts()["conv"] == 20 and prog.op_counts()["add"] == 8
    codes = _ort_codes(resnet[fmt], prog, {"input": resnet["x"]})
    got = run_program(prog, {ins[0]: codes[ins[0]]}, debug=True)
    diff = np.abs(got[outs[0]] - codes[outs[0]])
    layers = _layer_diffs(prog, codes)
    worst = max(v[0] for v in layers.values())
    print(
        f"resnet18 {fmt}/{target}: compile {compile_s:.2f}s; output {(diff > 0).sum()}/{diff.size} codes differ "
        f"(max {diff.max()}); per-layer worst {worst} LSB, "
        f"{sum(v[1] for v in layers.values())}/{sum(v[2] for v in layers.values())} codes differ"
    )
    if fmt == "fix":
        assert diff.max() == 0 and worst == 0
    else:
        assert worst <= 1 and diff.max() <= 3
        assert got[outs[0]].argmax() == codes[outs[0]].argmax()


def test_a_ratio_too_large_for_the_multiplier_names_the_node() -> None:
    """Zhouyi's 15-bit multiplier at shift >= 0 cannot hold a requantization ratio of 80312: the compile
    error names the node, the target and what to change (it was the bare ratio before)."""
    from zonnx.backend.compiler.params import multipliers
    from zonnx.backend.targets import load_target

    with pytest.raises(CompileError) as err:
        multipliers(np.array([80312.0]), load_target("zhouyi-x2"), "/blocks/Conv_3")
    text = str(err.value)
    assert text.startswith("node '/blocks/Conv_3' on zhouyi-x2: scale 80312.0 is too large for a 15-bit")
    assert "keep this node off the NPU" in text and "\n" not in text


def _clip_between_quantizers(in_scale: float, out_scale: float, relu: bool) -> onnx.ModelProto:
    """x -> Q(in) -> DQ -> Clip(-0.7, 6.0) (or Relu) -> Q(out) -> DQ: the Clip reads codes and only a
    quantizer reads it (a decomposed HardSwish's clip in a QDQ model)."""
    h = onnx.helper
    inits = [
        onnx.numpy_helper.from_array(np.float32(in_scale), "s_in"),
        onnx.numpy_helper.from_array(np.float32(out_scale), "s_out"),
        onnx.numpy_helper.from_array(np.int8(0), "zp"),
        onnx.numpy_helper.from_array(np.float32(-0.7), "lo"),
        onnx.numpy_helper.from_array(np.float32(6.0), "hi"),
    ]
    clip = (
        h.make_node("Relu", ["d"], ["c"], name="clip")
        if relu
        else h.make_node("Clip", ["d", "lo", "hi"], ["c"], name="clip")
    )
    nodes = [
        h.make_node("QuantizeLinear", ["x", "s_in", "zp"], ["q"], name="q_in"),
        h.make_node("DequantizeLinear", ["q", "s_in", "zp"], ["d"], name="dq_in"),
        clip,
        h.make_node("QuantizeLinear", ["c", "s_out", "zp"], ["qo"], name="q_out"),
        h.make_node("DequantizeLinear", ["qo", "s_out", "zp"], ["y"], name="dq_out"),
    ]
    graph = h.make_graph(
        nodes,
        "clip",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64])],
        inits,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("target", ["bm1684x", "zhouyi-x2"])
def test_a_clip_read_only_by_a_quantizer_clamps_on_the_output_grid(target: str, relu: bool) -> None:
    """Q_y(clip(v, a, b)) = clip(Q_y(v), Q_y(a), Q_y(b)): with an input grid 11x coarser than the output's,
    a clamp on the input grid put the bound 6.0 at 6.45 (5 output codes off); folded into the quantizer
    the program equals ORT's QDQ model on every code (no rounding tie: the ratio is not a half-integer)."""
    model = _clip_between_quantizers(0.5377566, 0.0472441, relu)
    names, ins, outs = whole_model_subgraph(model)
    program = compile_subgraph(model, names, ins, outs, target)
    assert [op.kind for op in program.ops] == ["rescale"]  # no clamp on the input grid
    x = np.linspace(-80.0, 80.0, 64, dtype=np.float32).reshape(1, 64)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = np.rint(sess.run(None, {"x": x})[0] / np.float32(0.0472441)).astype(np.int64)
    q_in = np.clip(np.rint(x / np.float32(0.5377566)), -128, 127).astype(np.int64)
    got = run_program(program, {program.inputs[0].name: q_in})[program.outputs[0].name]
    assert (want == 127).any() and (want == (0 if relu else -15)).any()  # both clamp ends reached
    np.testing.assert_array_equal(got.astype(np.int64), want)
    for native in (False, True):  # the ORT lowering narrows the rescale's clamp too
        lowered = program_to_model(program, name="p", native=native)
        run = lowered_session(lowered, native).run(
            None, {f"p/{program.inputs[0].name}": q_in.astype(np.int8)}
        )
        np.testing.assert_array_equal(run[0].astype(np.int64), want)
