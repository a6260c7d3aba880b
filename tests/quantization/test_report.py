"""Per-layer float-vs-quantized report on ORT-quantized models (QDQ, QOperator) and hand-made FixNeuron/Vitis ones."""

from __future__ import annotations

import io
import json
import math
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from rich.console import Console

import zonnx.zoo
from zonnx.custom_ops import add_functions, make_node
from zonnx.errors import ModelSaveError, OptionError
from zonnx.ir.io import save_model, to_ir, to_proto
from zonnx.passes.catalog import make_pass
from zonnx.quantization.formats.qoperator import qdq_to_qoperator
from zonnx.quantization.report import LayerReport, layer_report
from zonnx.verify import make_inputs

torch = pytest.importorskip("torch")
nn = torch.nn

#: The passes zonnx's quantizer runs first: ppocr_cls is opset 11 with its weights in Constant nodes.
PREP = ("opset-upgrade", "shape-inference", "constant-folding", "remove-noops", "fold-batchnorm",
        "dead-code", "shape-inference")  # fmt: skip


class _Net(nn.Module):
    """Conv+ReLU stem, MaxPool, residual block, Clip(0, 6) branch, then a wide Conv+ReLU before the head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.c1 = nn.Conv2d(8, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = nn.Conv2d(8, 16, 1)
        self.last = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):  # noqa: ANN001, ANN201
        x = nn.functional.max_pool2d(torch.relu(self.stem(x)), 2)
        x = torch.relu(self.c2(torch.relu(self.c1(x))) + x)
        x = torch.clamp(self.c3(x), 0, 6)
        x = torch.relu(self.last(x))
        return self.fc(x.mean((2, 3)))


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _quantize(float_path: Path, out: Path, feeds: list[dict[str, np.ndarray]], fmt: str) -> onnx.ModelProto:
    """ORT's quantize_static, u8 activations and per-channel s8 weights."""
    quantize_static(str(float_path), str(out), _Reader(feeds), quant_format=getattr(QuantFormat, fmt),
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
    return onnx.load(str(out))


def _widths(
    model: onnx.ModelProto | Path, widths: tuple[int, ...], height: int
) -> list[dict[str, np.ndarray]]:
    return [make_inputs(model, seed=i, shapes={"x": (1, 3, height, w)}) for i, w in enumerate(widths)]


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The small CNN (dynamic height and width) and ORT's QDQ and QOperator models of it."""
    tmp = tmp_path_factory.mktemp("report_cnn")
    torch.manual_seed(0)
    path = tmp / "cnn.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(_Net().eval(), torch.randn(1, 3, 32, 32), str(path), dynamo=False, opset_version=13,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {2: "h", 3: "w"}})  # fmt: skip
    calib = _widths(path, (32, 32, 32, 32), 32)
    feeds = _widths(path, (32, 40, 24), 32)  # different widths per sample
    return {
        "float": path,
        "feeds": feeds,
        "qdq": _quantize(path, tmp / "cnn_qdq.onnx", calib, "QDQ"),
        "qop": _quantize(path, tmp / "cnn_qop.onnx", calib, "QOperator"),
    }


@pytest.fixture(scope="module")
def cnn_report(cnn: dict) -> LayerReport:
    return layer_report(cnn["float"], cnn["qdq"], cnn["feeds"])


@pytest.fixture(scope="module")
def cls(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """PP-OCR's direction classifier, prepared as zonnx's quantizer prepares it, and ORT's QDQ model of it."""
    tmp = tmp_path_factory.mktemp("report_cls")
    model = to_ir(zonnx.zoo.get("ppocr_cls"))
    for name in PREP:
        make_pass(name, target_opset=13)(model)
    path = save_model(model, tmp / "cls.onnx")
    samples = zonnx.zoo.sample_inputs("ppocr_cls", 4)
    qdq = _quantize(path, tmp / "cls_qdq.onnx", samples, "QDQ")
    feeds = [samples[0], {"x": samples[1]["x"][..., :160]}, {"x": samples[2]["x"][..., :96]}]
    return {"float": path, "qdq": qdq, "feeds": feeds}


@pytest.fixture(scope="module")
def cls_report(cls: dict) -> LayerReport:
    return layer_report(cls["float"], cls["qdq"], cls["feeds"])


def _activation_q_inputs(model: onnx.ModelProto) -> set[str]:
    """The tensors ORT quantized that are not constants: the inputs of its activation QuantizeLinear nodes."""
    inits = {t.name for t in model.graph.initializer}
    return {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits}


def _conv_results(float_model: onnx.ModelProto) -> list[tuple[str, str]]:
    """For each Conv of the float model: its output and the end of the Relu/Clip chain after it."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in float_model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    pairs = []
    for n in float_model.graph.node:
        if n.op_type == "Conv":
            end = n.output[0]
            while len(consumers.get(end, [])) == 1 and consumers[end][0].op_type in ("Relu", "Clip"):
                end = consumers[end][0].output[0]
            pairs.append((n.output[0], end))
    return pairs


def _check_sorted(report: LayerReport) -> None:
    keys = [(s.sqnr_db, s.cosine) for s in report.layers]
    assert keys == sorted(keys)


@pytest.mark.parametrize("case", ["cnn", "cls"])
def test_every_quantized_activation_is_matched(case: str, request: pytest.FixtureRequest) -> None:
    data, report = request.getfixturevalue(case), request.getfixturevalue(f"{case}_report")
    quantized = _activation_q_inputs(data["qdq"])
    # ORT renames a quantized graph output's float value (y_QuantizeLinear_Input); the report names it y.
    expected = {t.removesuffix("_QuantizeLinear_Input") for t in quantized}
    assert {s.tensor for s in report.layers} == expected
    assert len(report.layers) == len(quantized) > 5
    assert report.unmatched == [] and report.skipped == []
    assert {s.via for s in report.layers} == {"DequantizeLinear"}
    float_model = onnx.load(str(data["float"]))
    tensors = {s.tensor for s in report.layers}
    for out, end in _conv_results(float_model):
        assert out in tensors or end in tensors, f"Conv output {out} not in the report"
    for s in report.layers:
        assert -1 <= s.cosine <= 1 and s.max_abs_error >= s.mean_abs_error > 0 and s.nonfinite == 0
    _check_sorted(report)


def test_streams_samples_of_different_widths(cnn: dict, cnn_report: LayerReport) -> None:
    stem = next(s for s in cnn_report.layers if s.op_type == "Relu" and s.node == "/Relu")
    # 8 channels x 32 rows after the stem (before the pool), widths 32 + 40 + 24 over the three samples
    assert stem.elements == 8 * 32 * (32 + 40 + 24)
    assert stem.shape == [1, 8, 32, 24]
    assert cnn_report.samples == 3
    assert (
        layer_report(cnn["float"], cnn["qdq"], cnn["feeds"], max_samples=1).get(stem.tensor).elements
        == 8 * 32 * 32
    )


def _renamed(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every value and node renamed (v0, v1, ...; n0, ...) except the graph inputs and outputs."""
    m = onnx.ModelProto.FromString(model.SerializeToString())
    keep = {v.name for v in [*m.graph.input, *m.graph.output]}
    names: dict[str, str] = {}

    def new(name: str) -> str:
        return name if not name or name in keep else names.setdefault(name, f"v{len(names)}")

    for t in m.graph.initializer:
        t.name = new(t.name)
    for i, n in enumerate(m.graph.node):
        n.name = f"n{i}"
        n.input[:] = [new(x) for x in n.input]
        n.output[:] = [new(x) for x in n.output]
    del m.graph.value_info[:]
    return m


@pytest.mark.parametrize("case", ["cnn", "cls"])
def test_matching_does_not_need_names(case: str, request: pytest.FixtureRequest) -> None:
    """With every intermediate name changed, the graph alone says which float tensor each DQ carries."""
    data, expected = request.getfixturevalue(case), request.getfixturevalue(f"{case}_report")
    report = layer_report(data["float"], _renamed(data["qdq"]), data["feeds"])
    assert report.unmatched == [] and report.skipped == []
    assert {s.tensor: s.sqnr_db for s in report.layers} == {s.tensor: s.sqnr_db for s in expected.layers}
    outputs = {o.name for o in data["qdq"].graph.output}
    assert all(s.quant_tensor.startswith("v") or s.quant_tensor in outputs for s in report.layers)


def test_original_float_model_with_batchnorm(cls: dict, cls_report: LayerReport) -> None:
    """Against the model before BN folding: a folded Conv's output is compared with the BN output after it."""
    original = onnx.load(str(zonnx.zoo.get("ppocr_cls")))
    bn_inputs = {n.input[0] for n in original.graph.node if n.op_type == "BatchNormalization"}
    report = layer_report(original, cls["qdq"], cls["feeds"])
    assert report.unmatched == [] and report.skipped == []
    assert not bn_inputs & {s.tensor for s in report.layers}  # never the tensor before a BN
    assert sum(s.op_type == "BatchNormalization" for s in report.layers) > 10
    # the same quantized values against the same float values (computed with BN unfolded): same metrics
    by_quant = {s.quant_tensor: s for s in cls_report.layers}
    for s in report.layers:
        assert s.sqnr_db == pytest.approx(by_quant[s.quant_tensor].sqnr_db, abs=0.01)
    # the Softmax output, renamed by the opset upgrade and followed by an Identity in the original, and the
    # model output are one float tensor there
    assert len(report.layers) == len(cls_report.layers) - 1


def _dq_of(model: onnx.ModelProto, tensor: str) -> str:
    """Found independently of the report: the DequantizeLinear fed by the QuantizeLinear of ``tensor``."""
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    return next(
        n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0]
    )


def _values(model: onnx.ModelProto, name: str, feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    m = onnx.ModelProto.FromString(model.SerializeToString())
    m.graph.output.append(onnx.ValueInfoProto(name=name))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run([name], f)[0].astype(np.float64).ravel() for f in feeds])


def test_metrics_agree_with_numpy(cnn: dict, cnn_report: LayerReport) -> None:
    stats = next(s for s in cnn_report.layers if s.op_type == "Conv")  # the residual branch, before the Add
    float_model = onnx.load(str(cnn["float"]))
    x = _values(float_model, stats.tensor, cnn["feeds"])
    q = _values(cnn["qdq"], _dq_of(cnn["qdq"], stats.tensor), cnn["feeds"])
    e = x - q
    assert stats.quant_tensor == _dq_of(cnn["qdq"], stats.tensor)
    assert stats.cosine == pytest.approx(x @ q / np.linalg.norm(x) / np.linalg.norm(q), rel=1e-9)
    assert stats.sqnr_db == pytest.approx(10 * np.log10((x @ x) / (e @ e)), rel=1e-9)
    assert stats.max_abs_error == pytest.approx(np.abs(e).max(), rel=1e-12)
    assert stats.mean_abs_error == pytest.approx(np.abs(e).mean(), rel=1e-9)
    assert stats.euclid == pytest.approx(1 - np.linalg.norm(e) / np.linalg.norm((x + q) / 2), rel=1e-9)
    assert stats.elements == x.size


def test_identical_models_are_perfect(cnn: dict) -> None:
    report = layer_report(cnn["float"], cnn["float"], cnn["feeds"])
    assert report.layers == [] and report.unmatched == []
    (out,) = report.outputs
    assert out.tensor == "y"
    assert (out.cosine, out.sqnr_db, out.euclid, out.max_abs_error) == (1.0, math.inf, 1.0, 0.0)
    assert json.loads(report.to_json())["outputs"][0]["sqnr_db"] == "inf"
    same = layer_report(cnn["qdq"], cnn["qdq"], cnn["feeds"][:1]).outputs[0]
    assert (same.cosine, same.sqnr_db) == (1.0, math.inf)


def test_damaged_scale_makes_that_layer_the_worst(cnn: dict, cnn_report: LayerReport) -> None:
    """The activation before the global average pool: averaging shrinks its noise downstream."""
    damaged = onnx.ModelProto.FromString(cnn["qdq"].SerializeToString())
    reader = {o: n for n in damaged.graph.node for o in n.input}
    float_model = onnx.load(str(cnn["float"]))
    pooled = next(n.input[0] for n in float_model.graph.node if n.op_type == "ReduceMean")
    target = cnn_report.get(pooled)
    q = next(n for n in damaged.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == target.tensor)
    assert reader[q.output[0]].op_type == "DequantizeLinear"
    init = next(t for t in damaged.graph.initializer if t.name == q.input[1])
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 8, init.name))
    report = layer_report(cnn["float"], damaged, cnn["feeds"])
    assert report.worst.tensor == target.tensor != cnn_report.worst.tensor
    # 8x the step multiplies this layer's own noise power by 64; the upstream noise it carries stays
    assert report.worst.sqnr_db < target.sqnr_db - 6
    _check_sorted(report)


def test_qoperator_codes_are_dequantized(cnn: dict, cnn_report: LayerReport) -> None:
    report = layer_report(cnn["float"], cnn["qop"], cnn["feeds"])
    assert report.unmatched == [] and report.skipped == []
    assert {s.tensor for s in report.layers} == {s.tensor for s in cnn_report.layers}
    # each QLinearConv's codes are matched, or the DequantizeLinear ORT put after them when it was kept
    dequantized = {n.input[0] for n in cnn["qop"].graph.node if n.op_type == "DequantizeLinear"}
    qconv = [n.output[0] for n in cnn["qop"].graph.node if n.op_type == "QLinearConv"]
    by_codes = [s for s in report.layers if s.via == "QLinearConv codes"]
    assert len(qconv) == 5 and {s.quant_tensor for s in by_codes} == set(qconv) - dequantized
    assert len(by_codes) == 4
    for s in report.layers:  # same quantization, integer kernels: the metrics stay close to the QDQ graph's
        assert s.sqnr_db == pytest.approx(cnn_report.get(s.tensor).sqnr_db, abs=1.0)


def test_zonnx_qoperator_model_is_matched(cnn: dict, cnn_report: LayerReport) -> None:
    model = to_ir(onnx.ModelProto.FromString(cnn["qdq"].SerializeToString()))
    qdq_to_qoperator(model)
    report = layer_report(cnn["float"], to_proto(model), cnn["feeds"])
    assert {s.tensor for s in report.layers} == {s.tensor for s in cnn_report.layers}
    assert any(s.via == "QLinearConv codes" for s in report.layers)


def _power_of_two(qdq: onnx.ModelProto, separate: bool) -> onnx.ModelProto:
    """Replace every activation Q/DQ pair by FixNeuron (or a Vitis Q/DQ pair), named like zonnx's writer."""
    model = onnx.ModelProto.FromString(qdq.SerializeToString())
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    quant = {
        n.output[0]: n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits
    }
    outputs = {o.name for o in model.graph.output}
    renamed, nodes = {}, []
    for n in model.graph.node:
        if n.output[0] in quant:
            continue
        if n.op_type != "DequantizeLinear" or n.input[0] not in quant:
            nodes.append(n)
            continue
        q = quant[n.input[0]]
        t = q.input[0]
        # ORT dropped each Relu before a zero point of 0: unsigned codes keep that clamp; otherwise
        # signed codes at twice the step cover the uint8 range
        signed = int(inits[q.input[2]] != 0)
        pos = int(np.floor(-np.log2(inits[q.input[1]]))) - signed
        attrs = {"pos": pos, "bit_width": 8, "signed": signed}
        out = n.output[0] if n.output[0] in outputs else f"{t}_fix"
        renamed[n.output[0]] = out
        if separate:
            nodes.append(make_node("VitisQuantizeLinear", [t], [f"{t}_vq"], **attrs))
            nodes.append(make_node("VitisDequantizeLinear", [f"{t}_vq"], [out], **attrs))
        else:
            nodes.append(make_node("FixNeuron", [t], [out], name=f"{t}_FixNeuron", **attrs))
    for n in nodes:
        n.input[:] = [renamed.get(i, i) for i in n.input]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return add_functions(model)


@pytest.mark.parametrize("separate", [False, True], ids=["fixneuron", "vitis_qdq"])
def test_power_of_two_models_are_matched(cnn: dict, cnn_report: LayerReport, separate: bool) -> None:
    model = _power_of_two(cnn["qdq"], separate)
    report = layer_report(cnn["float"], model, cnn["feeds"])
    assert report.unmatched == [] and report.skipped == []
    assert {s.tensor for s in report.layers} == {s.tensor for s in cnn_report.layers}
    assert {s.via for s in report.layers} == {"VitisDequantizeLinear" if separate else "FixNeuron"}
    if not separate:  # the FixNeuron writer's names, the graph output keeping its own
        assert all(
            s.quant_tensor == (s.tensor if s.tensor == "y" else f"{s.tensor}_fix") for s in report.layers
        )
    assert min(s.cosine for s in report.layers) > 0.99
    _check_sorted(report)


def test_json_render_and_atomic_write(cls_report: LayerReport, tmp_path: Path) -> None:
    data = json.loads(cls_report.to_json())
    assert list(data) == ["version", "float_model", "quant_model", "samples", "data", "matched", "layers", "outputs",
                          "unmatched", "skipped"]  # fmt: skip
    assert list(data["layers"][0]) == ["tensor", "quant_tensor", "node", "op_type", "via", "shape", "elements",
                                       "cosine", "euclid", "sqnr_db", "max_abs_error", "mean_abs_error",
                                       "nonfinite"]  # fmt: skip
    assert data["matched"] == len(cls_report.layers) and data["samples"] == 3
    path = cls_report.write(tmp_path / "report.json")
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
    with pytest.raises(ModelSaveError, match="does not exist"):
        cls_report.write(tmp_path / "missing" / "report.json")
    assert LayerReport.from_json(path.read_text()) == cls_report
    buf = io.StringIO()
    cls_report.render(Console(file=buf, width=100), top=3)
    text = buf.getvalue()
    assert text.isascii() and "Worst 3 of" in text and "Model outputs" in text
    rows = [line for line in text.splitlines() if line.split()[:1] in (["1"], ["2"], ["3"], ["4"])]
    assert [r.split()[1] for r in rows] == [s.tensor for s in cls_report.layers[:3]]


def test_bad_arguments_raise_clear_errors(cnn: dict) -> None:
    with pytest.raises(OptionError, match="max_samples=0"):
        layer_report(cnn["float"], cnn["qdq"], cnn["feeds"], max_samples=0)
    with pytest.raises(OptionError, match="no samples"):
        layer_report(cnn["float"], cnn["qdq"], [])
    with pytest.raises(OptionError, match="no value for input 'x'"):
        layer_report(cnn["float"], cnn["qdq"], [{"image": cnn["feeds"][0]["x"]}])


def test_reads_a_calibration_data_reader(cnn: dict, cnn_report: LayerReport) -> None:
    report = layer_report(cnn["float"], cnn["qdq"], _Reader(cnn["feeds"] * 3), max_samples=3)
    assert report.samples == 3
    assert report.worst == cnn_report.worst


def test_nonfinite_values_are_counted_and_compared_as_zero(cnn: dict) -> None:
    feeds = {"x": cnn["feeds"][0]["x"].copy()}
    feeds["x"][0, 0, 0, 0] = np.nan
    stats = layer_report(cnn["float"], cnn["qdq"], [feeds]).get("x")
    assert stats.nonfinite == 1  # QuantizeLinear turns NaN into a finite code; the float side keeps NaN
    x = np.nan_to_num(feeds["x"].astype(np.float64), nan=0.0).ravel()
    q = _values(cnn["qdq"], _dq_of(cnn["qdq"], "x"), [feeds])
    q[0] = 0.0
    assert stats.sqnr_db == pytest.approx(10 * np.log10((x @ x) / ((x - q) @ (x - q))), rel=1e-9)


class _Squeeze(nn.Module):
    """Conv, then a squeeze-excitation gate: global average over a 6x6 map (36 positions, not a power of
    two), two 1x1 convolutions and a hard sigmoid."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.down = nn.Conv2d(8, 4, 1)
        self.up = nn.Conv2d(4, 8, 1)

    def forward(self, x):  # noqa: ANN001, ANN201
        y = torch.relu(self.conv(x))
        gate = nn.functional.hardsigmoid(
            self.up(torch.relu(self.down(nn.functional.adaptive_avg_pool2d(y, 1))))
        )
        return y * gate


def test_inserted_constant_mul_is_not_matched_to_a_float_mul(tmp_path: Path) -> None:
    """dpu-b4096 writes the global average over 36 positions as a pool and a constant factor Mul, and
    SmoothQuant scales the pool's output with a Mul of its own; both Muls read the pool's output, but
    their constants differ, so the report compares the float smoothing Mul's output with the quantized
    one's, never with the factor Mul's (that pairing gave a negative SQNR on PP-OCRv4 rec's
    squeeze-excitation blocks)."""
    from zonnx.build_npu import target_quantize_kwargs

    torch.manual_seed(0)
    path = tmp_path / "se.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(_Squeeze().eval(), torch.randn(1, 3, 6, 6), str(path), dynamo=False, opset_version=13,
                          input_names=["x"], output_names=["y"])  # fmt: skip
    feeds = [make_inputs(onnx.load(str(path)), seed=i) for i in range(8)]
    out = tmp_path / "se_dpu.onnx"
    kwargs = target_quantize_kwargs("dpu-b4096")
    kwargs["extra_options"] = dict(kwargs["extra_options"], SmoothQuant=True, ReportSamples=8)
    zonnx.quantize_static(str(path), str(out), _Reader(feeds), **kwargs)
    quant = onnx.load(str(out))
    pool = next(n.output[0] for n in quant.graph.node if n.op_type == "GlobalAveragePool")
    factor = [n for n in quant.graph.node if n.op_type == "Mul" and n.input[0] == pool]
    fixed = {n.input[0]: n.output[0] for n in quant.graph.node if n.op_type == "FixNeuron"}
    factor_fixed = fixed.get(factor[0].output[0]) if factor else None
    smooth = [n for n in quant.graph.node if n.op_type == "Mul" and n.input[0] == factor_fixed]
    assert factor and smooth, "the factor Mul or the smoothing Mul is gone: this test needs another model"
    rows = json.loads(Path(f"{out}.report.json").read_text())["layers"]
    row = next(r for r in rows if r["node"] == smooth[0].name)
    assert row["quant_tensor"] == fixed[smooth[0].output[0]], row
    assert min(r["sqnr_db"] for r in rows) > 15, [
        (r["tensor"], r["quant_tensor"], r["sqnr_db"]) for r in rows
    ]
