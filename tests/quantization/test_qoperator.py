"""QDQ -> QOperator conversion against ONNX Runtime's own QOperator output and the QDQ graph it came from.

QOperator models run in ORT in their exact integer form (``zonnx.verify.exact_integer_form``: uint8
weights where this host's u8 x s8 kernels saturate, as they do without VNNI), so both sides compute exact
integer sums on every CPU; the QDQ models run unoptimized, i.e. in float.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
import torch
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from tests.helpers import parse
from zonnx import zoo
from zonnx.ir.io import MAX_IR_VERSION, load_model, to_ir, to_proto
from zonnx.passes.catalog import make_pass, resolve_pass_names
from zonnx.passes.pipeline import Pipeline
from zonnx.quantization.formats.qoperator import qdq_to_qoperator
from zonnx.verify import exact_integer_form

nn = torch.nn

#: (activation type, per channel) of ORT's quantize_static runs; weights are always int8.
CONFIGS = {
    "u8s8_pt": (QuantType.QUInt8, False),
    "u8s8_pc": (QuantType.QUInt8, True),
    "s8s8_pt": (QuantType.QInt8, False),
    "s8s8_pc": (QuantType.QInt8, True),
}


class _Net(nn.Module):
    """Conv+BN+ReLU, MaxPool, residual Add, Concat (ReLU6 / LeakyReLU branches), GlobalAveragePool, Gemm;
    ``full`` adds a Sigmoid gate (Mul), AveragePool and a Softmax output."""

    def __init__(self, full: bool) -> None:
        super().__init__()
        self.full = full
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.c2 = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.c3 = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16))
        self.b1 = nn.Sequential(nn.Conv2d(16, 8, 1), nn.ReLU6())
        self.b2 = nn.Sequential(nn.Conv2d(16, 8, 3, padding=1), nn.LeakyReLU(0.1))
        self.gate = nn.Conv2d(16, 16, 1)
        self.avg = nn.AvgPool2d(2)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):  # noqa: ANN001, ANN201
        x = self.pool(self.stem(x))
        x = torch.relu(self.c3(self.c2(x)) + x)
        x = torch.cat([self.b1(x), self.b2(x)], 1)
        if self.full:
            x = self.avg(x * torch.sigmoid(self.gate(x)))
        y = self.fc(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))
        return (y, torch.softmax(y, -1)) if self.full else y


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _export_cnn(path: Path, full: bool) -> Path:
    torch.manual_seed(0)
    net = _Net(full).eval()
    for m in net.modules():  # non-trivial BN statistics so folding matters
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.3, 0.3)
    outputs = ["logits", "probs"] if full else ["logits"]
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            net,
            torch.randn(1, 3, 32, 32),
            str(path),
            dynamo=False,
            opset_version=13,
            input_names=["x"],
            output_names=outputs,
        )
    return path


def _session(model: onnx.ModelProto, optimize: bool = False) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = exact_integer_form(model)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _run(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    sess = _session(model)
    names = [o.name for o in sess.get_outputs()]
    runs = [sess.run(names, f) for f in feeds]
    return {n: np.stack([r[i] for r in runs]) for i, n in enumerate(names)}


def _output_scales(model: onnx.ModelProto) -> dict[str, float]:
    """Scale of the DequantizeLinear writing each graph output: one LSB of that output."""
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    outs = {o.name for o in model.graph.output}
    return {
        n.output[0]: float(inits[n.input[1]])
        for n in model.graph.node
        if n.op_type == "DequantizeLinear" and n.output[0] in outs
    }


def _ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(n.op_type for n in model.graph.node if n.op_type != "Constant")


class _Case:
    """One float model quantized by ORT both ways, plus our conversion of the QDQ model."""

    def __init__(self, float_path: Path, feeds: list[dict[str, np.ndarray]], cfg: str, tmp: Path) -> None:
        act, per_channel = CONFIGS[cfg]
        stem = tmp / f"{float_path.stem}_{cfg}"
        for fmt in ("QDQ", "QOperator"):
            quantize_static(
                str(float_path),
                f"{stem}_{fmt}.onnx",
                _Reader(feeds),
                quant_format=getattr(QuantFormat, fmt),
                per_channel=per_channel,
                activation_type=act,
                weight_type=QuantType.QInt8,
            )
        self.float = onnx.load(float_path)
        self.qdq = onnx.load(f"{stem}_QDQ.onnx")
        self.ort_qop = onnx.load(f"{stem}_QOperator.onnx")
        model = to_ir(onnx.load(f"{stem}_QDQ.onnx"))
        start = time.perf_counter()
        self.counts = qdq_to_qoperator(model)
        self.seconds = time.perf_counter() - start
        self.ours = to_proto(model)
        self.feeds = feeds
        self.lsb = _output_scales(self.qdq)

    def diffs_in_lsb(self, reference: onnx.ModelProto) -> dict[str, float]:
        ours, ref = _run(self.ours, self.feeds), _run(reference, self.feeds)
        return {n: round(float(np.abs(ours[n] - ref[n]).max() / self.lsb[n]), 3) for n in ours}


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], _Case]:
    """Lazily built cases by (model, config), shared by the tests of this module."""
    tmp = tmp_path_factory.mktemp("qoperator")
    rng = np.random.default_rng(0)
    cnn_feeds = [{"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(4)]
    built: dict = {}

    def get(model: str, cfg: str) -> _Case:
        if (model, cfg) not in built:
            if model == "ppocr_cls":
                path, feeds = _prepared_cls(tmp), _cls_feeds()
            else:
                path = tmp / f"{model}.onnx"
                if not path.exists():
                    _export_cnn(path, full=model == "cnn_full")
                feeds = cnn_feeds
            built[model, cfg] = _Case(path, feeds, cfg, tmp)
        return built[model, cfg]

    return get


def _cls_feeds() -> list[dict[str, np.ndarray]]:
    return zoo.sample_inputs("ppocr_cls", 4)


def _prepared_cls(tmp: Path) -> Path:
    """PP-OCR cls at opset 13 with weights as initializers and BN folded (ORT's quantizer needs both),
    plus the classifier's logits as a second output so the comparison sees more than a saturated softmax."""
    path = tmp / "ppocr_cls.onnx"
    if path.exists():
        return path
    model = load_model(zoo.get("ppocr_cls"))
    Pipeline([make_pass(n, target_opset=13) for n in resolve_pass_names("pre_quant")]).run(model)
    proto = to_proto(model)
    gemm = next(n for n in proto.graph.node if n.op_type == "Gemm")
    proto.graph.output.append(oh.make_tensor_value_info(gemm.output[0], onnx.TensorProto.FLOAT, None))
    onnx.save(proto, path)
    return path


def _assert_loads(model: onnx.ModelProto) -> None:
    assert model.ir_version <= MAX_IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    _session(model, optimize=True)  # ORT's default optimizations accept it too


@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_cnn_bit_exact_with_ort_qoperator(cases, cfg: str) -> None:
    case = cases("cnn", cfg)
    _assert_loads(case.ours)
    ops = _ops(case.ours)
    assert ops == _ops(case.ort_qop)  # same integer graph as ORT writes
    assert ops["QLinearConv"] == _ops(case.float)["Conv"] == 5
    assert ops["QGemm"] == ops["QLinearAdd"] == ops["QLinearConcat"] == ops["QLinearGlobalAveragePool"] == 1
    assert ops["QuantizeLinear"] == ops["DequantizeLinear"] == 1  # float input and output only
    assert case.counts["MaxPool on codes"] == case.counts["Flatten on codes"] == 1 and not case.counts.misses
    assert case.diffs_in_lsb(case.ort_qop) == {"logits": 0.0}
    assert case.diffs_in_lsb(case.qdq)["logits"] <= 1.0


@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_cnn_full_within_one_lsb_of_ort_qoperator(cases, cfg: str) -> None:
    """ORT's two quantizers pick different parameters in two places, so bit equality is not expected:
    its QDQ quantizer gives AveragePool's output the input's parameters (QOperator calibrates it), and
    fixes Softmax's output to [0, 1] -> scale 1/255 where QOperator uses 1/256. We keep the QDQ ones."""
    case = cases("cnn_full", cfg)
    _assert_loads(case.ours)
    ops = _ops(case.ours)
    assert ops == _ops(case.ort_qop)
    for op in (
        "Conv",
        "Add",
        "Mul",
        "Concat",
        "Sigmoid",
        "LeakyRelu",
        "AveragePool",
        "GlobalAveragePool",
        "Softmax",
    ):
        assert ops[f"QLinear{op}"] == _ops(case.float)[op], op
    assert ops["QGemm"] == 1 and ops["Relu"] == ops["Clip"] == 0 and not case.counts.misses
    for name, lsb in case.diffs_in_lsb(case.ort_qop).items():
        assert lsb <= 1.0, (name, lsb)
    for name, lsb in case.diffs_in_lsb(case.qdq).items():
        assert lsb <= 1.0, (name, lsb)


@pytest.mark.parametrize("cfg", ["u8s8_pc", "s8s8_pt"])
def test_ppocr_cls(cases, cfg: str) -> None:
    """ORT's QOperator quantizer only quantizes an op whose input is already quantized, so it leaves 9
    of the 10 GlobalAveragePool (after hard-swish's float Div) in float, while its QDQ quantizer
    quantizes them: the logits of the two ORT models differ by several LSB; we follow the QDQ model."""
    case = cases("ppocr_cls", cfg)
    _assert_loads(case.ours)
    ops, float_ops = _ops(case.ours), _ops(case.float)
    assert ops["QLinearConv"] == float_ops["Conv"] == 53
    assert ops["QLinearAdd"] == float_ops["Add"] and ops["QLinearMul"] == float_ops["Mul"]
    assert ops["QLinearGlobalAveragePool"] == float_ops["GlobalAveragePool"] == 10
    assert ops["QGemm"] == ops["QLinearSoftmax"] == 1 and ops["Conv"] == ops["Add"] == ops["Mul"] == 0
    missed = Counter(m.split("(")[1].split(")")[0] for m in case.counts.misses)
    # every hard-swish Div whose output is quantized (one feeds the float MaxPool: not a QDQ group)
    assert missed == {"Div": float_ops["Div"] - 1, "HardSigmoid": float_ops["HardSigmoid"]}
    assert all("no integer kernel" in m for m in case.counts.misses)
    probs, logits = (o.name for o in case.float.graph.output)
    vs_qdq, vs_ort = case.diffs_in_lsb(case.qdq), case.diffs_in_lsb(case.ort_qop)
    assert vs_qdq[probs] == 0.0 and vs_ort[probs] <= 1.0  # ORT's QOperator writes probs at 1/256, not 1/255
    assert vs_qdq[logits] <= 3.0
    ours, ort_logits = _run(case.ours, case.feeds)[logits], _run(case.ort_qop, case.feeds)[logits]
    assert np.array_equal(ours.argmax(-1), ort_logits.argmax(-1))


# ---- a hand-written QDQ graph: fused activations kept by zonnx's writer, latent ops, misses ----------


def _synthetic_qdq(dtype: str) -> onnx.ModelProto:
    """``Q(x) -> DQ -> Conv -> Relu -> Q -> DQ -> Pad -> MaxPool -> Resize -> Clip -> Transpose -> Reshape
    -> MatMul -> Split -> Add -> Gather -> HardSigmoid -> y`` with a Q/DQ pair after every op (the Relu
    is fused: none between Conv and Relu), plus ``Reshape -> Identity (other scale) -> z``.

    int8 uses zero point 0 everywhere (so the Relu must stay, as a Clip on codes); uint8 puts the Relu
    output's zero point at 0 = qmin (so the Relu is dropped). The Conv bias is stored at twice s_x*s_w
    so the converter has to re-quantize it."""
    rng = np.random.default_rng(1)
    t = onnx.TensorProto.INT8 if dtype == "int8" else onnx.TensorProto.UINT8

    def zp(i8: int, u8: int) -> np.ndarray:
        return np.array(i8, np.int8) if dtype == "int8" else np.array(u8, np.uint8)

    inits, nodes = [], []

    def init(name: str, arr: np.ndarray) -> str:
        inits.append(onnx.numpy_helper.from_array(np.asarray(arr), name))
        return name

    def qdq(src: str, name: str, scale: float, z: np.ndarray) -> str:
        init(f"{name}_s", np.float32(scale)), init(f"{name}_z", z)
        nodes.append(
            oh.make_node("QuantizeLinear", [src, f"{name}_s", f"{name}_z"], [f"{name}_q"], name=f"{name}_Q")
        )
        nodes.append(
            oh.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"])
        )
        return f"{name}_dq"

    def op(op_type: str, inputs: list[str], name: str, **attrs) -> str:
        nodes.append(oh.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    s_x, s_w = np.float32(0.04), rng.uniform(0.005, 0.01, 6).astype(np.float32)
    x = qdq("x", "in", s_x, zp(0, 128))
    (
        init("w", rng.integers(-100, 100, (6, 4, 3, 3)).astype(np.int8)),
        init("w_s", s_w),
        init("w_z", np.zeros(6, np.int8)),
    )
    (
        init("b", rng.integers(-500, 500, 6).astype(np.int32)),
        init("b_s", 2 * s_x * s_w),
        init("b_z", np.zeros(6, np.int32)),
    )
    nodes += [
        oh.make_node("DequantizeLinear", ["w", "w_s", "w_z"], ["w_dq"], axis=0),
        oh.make_node("DequantizeLinear", ["b", "b_s", "b_z"], ["b_dq"], axis=0),
    ]
    s1, z1 = 0.05, zp(0, 0)
    h = qdq(op("Relu", [op("Conv", [x, "w_dq", "b_dq"], "conv", pads=[1, 1, 1, 1])], "relu"), "relu", s1, z1)
    pads = [init("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1])), init("pad_value", np.float32(0.5))]
    h = qdq(op("Pad", [h, *pads], "pad"), "pad", s1, z1)  # pads with the code Q(0.5) = zp + 10
    h = qdq(op("MaxPool", [h], "pool", kernel_shape=[2, 2], strides=[2, 2]), "pool", s1, z1)
    h = qdq(
        op("Resize", [h, "", init("scales", np.array([1, 1, 2, 2], np.float32))], "resize"), "resize", s1, z1
    )
    clip = op("Clip", [h, init("lo", np.float32(-1.0)), init("hi", np.float32(2.0))], "clip")
    h = qdq(op("Transpose", [qdq(clip, "clip", s1, z1)], "transpose", perm=[0, 2, 3, 1]), "transpose", s1, z1)
    flat = qdq(op("Reshape", [h, init("shape", np.array([100, 6]))], "reshape"), "reshape", s1, z1)
    (
        init("w2", rng.integers(-127, 127, (6, 8)).astype(np.int8)),
        init("w2_s", rng.uniform(0.01, 0.02, 8).astype(np.float32)),
    )
    nodes.append(
        oh.make_node(
            "DequantizeLinear", ["w2", "w2_s", init("w2_z", np.zeros(8, np.int8))], ["w2_dq"], axis=1
        )
    )
    s2, z2 = 0.02, zp(3, 128)
    m = qdq(op("MatMul", [flat, "w2_dq"], "matmul"), "matmul", s2, z2)
    nodes.append(
        oh.make_node("Split", [m, init("split", np.array([4, 4]))], ["sa", "sb"], name="split", axis=1)
    )
    h = qdq(op("Add", [qdq("sa", "sa", s2, z2), qdq("sb", "sb", s2, z2)], "add"), "add", 0.03, zp(-5, 120))
    h = qdq(op("Gather", [h, init("idx", np.array([0, 3]))], "gather", axis=1), "gather", 0.03, zp(-5, 120))
    y = qdq(op("HardSigmoid", [h], "hsig"), "hsig", 1 / 255, zp(-128, 0))
    z = qdq(op("Identity", [flat], "ident"), "ident", 0.07, zp(0, 0))
    graph = oh.make_graph(
        nodes,
        "synthetic",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 8, 8])],
        [
            oh.make_tensor_value_info(y, onnx.TensorProto.FLOAT, [100, 2]),
            oh.make_tensor_value_info(z, onnx.TensorProto.FLOAT, [100, 6]),
        ],
        inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    assert t in {i.data_type for i in inits}
    return model


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_synthetic_fused_latent_and_misses(dtype: str) -> None:
    qdq = _synthetic_qdq(dtype)
    model = to_ir(onnx.ModelProto.FromString(qdq.SerializeToString()))
    counts = qdq_to_qoperator(model)
    ours = to_proto(model)
    _assert_loads(ours)
    for latent in ("Pad", "MaxPool", "Resize", "Transpose", "Reshape", "Split", "Gather"):
        assert counts[f"{latent} on codes"] == 1, latent
    assert counts["QLinearConv"] == counts["QLinearMatMul"] == counts["QLinearAdd"] == 1
    assert counts["re-quantized bias"] == 1
    if dtype == "int8":  # zero point 0 > qmin: Relu is Clip(q, 0); Clip(-1, 2) is Clip(q, -20, 40)
        assert counts["Clip on codes"] == 2 and counts["dropped Relu"] == 0
    else:  # zero point 0 = qmin: the Relu is free; Clip keeps only its upper bound 40
        assert counts["Clip on codes"] == 1 and counts["dropped Relu"] == 1
    assert sorted(m.split(" ")[0] for m in counts.misses) == ["hsig", "ident"]
    assert any("parameters differ" in m for m in counts.misses)
    ops = _ops(ours)
    assert ops["QuantizeLinear"] == 3 and ops["DequantizeLinear"] == 4  # input; hsig and ident stay QDQ
    assert ops["Conv"] == ops["MatMul"] == ops["Relu"] == 0
    inits = {t.name: int(onnx.numpy_helper.to_array(t)) for t in ours.graph.initializer if not t.dims}
    bounds = [
        tuple(inits.get(i) for i in [*n.input[1:], "", ""][:2])
        for n in ours.graph.node
        if n.op_type == "Clip"
    ]
    assert bounds == ([(0, None), (-20, 40)] if dtype == "int8" else [(None, 40)])
    feeds = [
        {"x": np.random.default_rng(i).standard_normal((1, 4, 8, 8)).astype(np.float32)} for i in range(3)
    ]
    got, want = _run(ours, feeds), _run(qdq, feeds)
    for name, lsb in (("hsig_dq", 1 / 255), ("ident_dq", 0.07)):
        diff = np.abs(got[name] - want[name]) / lsb
        assert diff.max() <= 2.0 and (diff < 0.5).mean() > 0.95, (name, diff.max())


def test_float_model_is_left_alone() -> None:
    model = to_ir(
        oh.make_model(
            oh.make_graph(
                [oh.make_node("Relu", ["x"], ["y"])],
                "g",
                [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
            ),
            opset_imports=[oh.make_opsetid("", 13)],
        )
    )
    counts = qdq_to_qoperator(model)
    assert not counts and not counts.misses
    assert [n.op_type for n in model.graph] == ["Relu"] and "com.microsoft" not in model.opset_imports


@pytest.mark.parametrize(("y_scale", "converted"), [(1 / 255, True), (1 / 256, False)])
def test_int8_softmax_output_scale(y_scale: float, converted: bool) -> None:
    """QLinearSoftmax writes round(p * floor(1/y_scale)) + zero point without clamping below 256: at
    1/256 with int8 zero point -128 a certain class would wrap to -128, so that group stays QDQ; at
    float32(1/255), whose reciprocal floors to 254, the kernel gets a y_scale that floors to 255."""
    text = """<ir_version: 8, opset_import: ["" : 13]>
    g (float[4, 10] x) => (float[4, 10] y) {
        xq = QuantizeLinear(x, xs, xz)
        xd = DequantizeLinear(xq, xs, xz)
        p = Softmax<axis = -1>(xd)
        pq = QuantizeLinear(p, ys, yz)
        y = DequantizeLinear(pq, ys, yz)
    }"""
    qdq = parse(
        text, ("xs", np.float32(0.1)), ("xz", np.int8(0)), ("ys", np.float32(y_scale)), ("yz", np.int8(-128))
    )
    model = to_ir(onnx.ModelProto.FromString(qdq.SerializeToString()))
    counts = qdq_to_qoperator(model)
    ours = to_proto(model)
    _assert_loads(ours)
    assert counts["QLinearSoftmax"] == int(converted)
    assert len(counts.misses) == int(not converted) and all("past the maximum" in m for m in counts.misses)
    x = np.random.default_rng(0).normal(0, 4, (4, 10)).astype(np.float32)
    x[0, 3] = 12.0  # one near-certain class: p rounds to 1
    got, want = (_run(m, [{"x": x}])["y"][0] for m in (ours, qdq))
    assert want.max() == np.float32(y_scale) * 255
    assert got[0, 3] == want[0, 3]  # 255 codes, not 254
    assert np.abs(got - want).max() <= np.float32(y_scale) * 1.001
