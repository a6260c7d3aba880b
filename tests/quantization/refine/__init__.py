"""Model builders for the refinement tests: ORT QDQ models rounded to powers of two, in three forms.

- ``qdq_pof2``: onnxruntime's ``quantize_static`` (QDQ, int8 symmetric) with every scale rounded to a
  power of two (weights and biases re-quantized on the new grid);
- ``to_fixneuron``: the same model with FixNeuron nodes (Q/DQ pairs -> FixNeuron; stored weight codes
  -> float initializer + FixNeuron; int32 bias codes -> float + 24-bit FixNeuron), bit-identical in ORT;
- ``to_vitis``: Vitis Q/DQ pairs, stored codes read by VitisDequantizeLinear.

Tensors are named by the value the quantizer outputs (the one consumers read), which every form keeps.
``set_positions`` edits positions directly in the protobuf (independently of the code under test).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import torch
from onnx import helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from zonnx.backend.targets import TARGETS_DIR
from zonnx.custom_ops import add_functions, make_node, reference_run
from zonnx.ir.io import to_ir, to_proto
from zonnx.quantization.refine.positions import QuantGraph
from zonnx.verify import check_loadable

_F32 = onnx.TensorProto.FLOAT


class FeedReader(CalibrationDataReader):
    """ORT calibration reader over a list of feeds."""

    def __init__(self, feeds: Iterable[Mapping[str, np.ndarray]]) -> None:
        self._it = iter(list(feeds))

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def ort_qdq(float_path: Path, out_path: Path, feeds: list[dict[str, np.ndarray]]) -> onnx.ModelProto:
    """onnxruntime's QDQ int8 symmetric quantization (per tensor)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_static(
            str(float_path),
            str(out_path),
            FeedReader(feeds),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            extra_options={"ActivationSymmetric": True},
        )
    return onnx.load(str(out_path))


def _inits(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.graph.initializer}


def _set_init(model: onnx.ModelProto, name: str, array: np.ndarray) -> None:
    for i, t in enumerate(model.graph.initializer):
        if t.name == name:
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(array, name))
            return
    raise KeyError(name)


def _scalar(tensor: onnx.TensorProto) -> float:
    return float(numpy_helper.to_array(tensor).reshape(-1)[0])


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


def nonoverflow_pos(x: np.ndarray, bits: int = 8) -> int:
    """vai_q_onnx's get_pos_overflow: floor(log2(1 / max(min/(-2^(b-1) - 0.5), max/(2^(b-1) - 0.5))))."""
    half = 2 ** (bits - 1)
    scale = max(float(x.min()) / (-half - 0.5), float(x.max()) / (half - 0.5))
    return 127 if scale <= 0 else int(math.floor(math.log2(1.0 / scale)))


def qdq_pof2(model: onnx.ModelProto) -> onnx.ModelProto:
    """Round every activation scale to 2^-rint(-log2 s); re-quantize weights (non-overflow position) and
    int32 biases (at s_x * s_w) on the new grids."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    inits, prod = _inits(model), _producers(model)
    stored: dict[str, onnx.NodeProto] = {
        n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
    }
    done: set[str] = set()
    for dq in stored.values():  # weights (int8) first; biases wait for the scales around them
        codes = numpy_helper.to_array(inits[dq.input[0]])
        if codes.dtype != np.int8:
            continue
        w = codes.astype(np.float64) * _scalar(inits[dq.input[1]])
        pos = nonoverflow_pos(w)
        _set_init(model, dq.input[0], np.clip(np.rint(w * 2.0**pos), -128, 127).astype(np.int8))
        _set_init(model, dq.input[1], np.asarray(2.0**-pos, np.float32))
        done.add(dq.input[1])
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.input[1] not in done:
            s = _scalar(_inits(model)[node.input[1]])
            _set_init(model, node.input[1], np.asarray(2.0 ** round(math.log2(s)), np.float32))
            done.add(node.input[1])
    inits = _inits(model)
    for node in model.graph.node:
        if node.op_type not in ("Conv", "Gemm", "ConvTranspose") or len(node.input) < 3:
            continue
        bdq = prod[node.input[2]]
        sx = _scalar(inits[prod[node.input[0]].input[1]])
        sw = _scalar(inits[prod[node.input[1]].input[1]])
        codes = numpy_helper.to_array(inits[bdq.input[0]])
        b = codes.astype(np.float64) * _scalar(inits[bdq.input[1]])
        _set_init(model, bdq.input[0], np.rint(b / (sx * sw)).astype(np.int32))
        _set_init(model, bdq.input[1], np.asarray(sx * sw, np.float32))
    return model


def _pos(scale: float) -> int:
    p = -math.log2(scale)
    assert p == int(p), scale
    return int(p)


def _convert(model: onnx.ModelProto, vitis: bool) -> onnx.ModelProto:
    model = onnx.ModelProto.FromString(model.SerializeToString())
    inits = _inits(model)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    nodes: list[onnx.NodeProto] = []
    drop: set[str] = set()
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear":
            pos = _pos(_scalar(inits[n.input[1]]))
            dqs = consumers[n.output[0]]
            if not vitis:
                assert len(dqs) == 1
                nodes.append(
                    make_node(
                        "FixNeuron",
                        [n.input[0]],
                        [dqs[0].output[0]],
                        name=n.name,
                        pos=pos,
                        round_mode="half_even",
                    )
                )
            else:
                nodes.append(
                    make_node(
                        "VitisQuantizeLinear",
                        [n.input[0]],
                        [n.output[0]],
                        name=n.name,
                        pos=pos,
                        round_mode="half_even",
                    )
                )
                nodes += [
                    make_node("VitisDequantizeLinear", [n.output[0]], [d.output[0]], name=d.name, pos=pos)
                    for d in dqs
                ]
        elif n.op_type == "DequantizeLinear" and n.input[0] in inits:
            codes = numpy_helper.to_array(inits[n.input[0]])
            pos = _pos(_scalar(inits[n.input[1]]))
            bits = 8 if codes.dtype == np.int8 else 24
            assert np.abs(codes).max() < 2 ** (bits - 1)
            if vitis:
                nodes.append(
                    make_node(
                        "VitisDequantizeLinear",
                        [n.input[0]],
                        [n.output[0]],
                        name=n.name,
                        pos=pos,
                        bit_width=bits,
                    )
                )
                continue
            name = n.input[0] + "_float"
            model.graph.initializer.append(
                numpy_helper.from_array((codes * 2.0**-pos).astype(np.float32), name)
            )
            drop.add(n.input[0])
            nodes.append(
                make_node(
                    "FixNeuron",
                    [name],
                    [n.output[0]],
                    name=n.name,
                    pos=pos,
                    bit_width=bits,
                    round_mode="half_even",
                )
            )
        elif n.op_type != "DequantizeLinear":
            nodes.append(n)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    kept = [t for t in model.graph.initializer if t.name not in drop]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    used = {i for n in model.graph.node for i in n.input}
    kept = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return add_functions(model)


def to_fixneuron(model: onnx.ModelProto) -> onnx.ModelProto:
    return _convert(model, vitis=False)


def to_vitis(model: onnx.ModelProto) -> onnx.ModelProto:
    return _convert(model, vitis=True)


def positions(model: onnx.ModelProto | ir.Model) -> dict[str, int | None]:
    """Position of every quantized tensor, keyed by the value its (first) quantizer outputs."""
    graph = QuantGraph(to_ir(onnx.ModelProto.FromString(to_proto(model).SerializeToString())))
    return {site.quantizers[0].outputs[0].name: site.pos for site in graph.sites()}


def set_positions(model: onnx.ModelProto, wanted: Mapping[str, int | float]) -> onnx.ModelProto:
    """Protobuf surgery: give the quantizer producing each key the position (an int) or the scale (a float),
    each with its own new scale initializer; stored codes are re-quantized (power-of-two only)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    prod, inits = _producers(model), _inits(model)
    for key, pos in wanted.items():
        node = prod[key]
        if node.domain == "com.zonnx":
            group = [node]
            if node.op_type == "VitisDequantizeLinear" and node.input[0] in prod:
                q = prod[node.input[0]]
                group = [q] + [
                    n
                    for n in model.graph.node
                    if n.op_type == "VitisDequantizeLinear" and n.input[0] == q.output[0]
                ]
            elif node.op_type == "VitisDequantizeLinear":
                codes = numpy_helper.to_array(inits[node.input[0]])
                old = next(a.i for a in node.attribute if a.name == "pos")
                _set_init(model, node.input[0], np.rint(codes * 2.0 ** (pos - old)).astype(codes.dtype))
            for n in group:
                for a in n.attribute:
                    if a.name == "pos":
                        a.i = pos
            continue
        scale = float(pos) if isinstance(pos, float) else 2.0**-pos
        scale_name = f"{key}__scale_{pos}"
        shape = numpy_helper.to_array(inits[node.input[1]]).shape
        model.graph.initializer.append(
            numpy_helper.from_array(np.asarray(scale, np.float32).reshape(shape), scale_name)
        )
        if node.input[0] in prod and prod[node.input[0]].op_type == "QuantizeLinear":
            prod[node.input[0]].input[1] = scale_name
        else:
            codes = numpy_helper.to_array(inits[node.input[0]])
            old = _pos(_scalar(inits[node.input[1]]))
            info = np.iinfo(codes.dtype)
            _set_init(
                model,
                node.input[0],
                np.clip(np.rint(codes * 2.0 ** (pos - old)), info.min, info.max).astype(codes.dtype),
            )
        node.input[1] = scale_name
    return model


def run(
    model: onnx.ModelProto | ir.Model, feeds: Mapping[str, np.ndarray], extra: Iterable[str] = ()
) -> dict[str, np.ndarray]:
    """ORT outputs (plus the named intermediate float tensors) with graph optimizations off."""
    return run_all(model, [feeds], extra)[0]


def run_all(
    model: onnx.ModelProto | ir.Model, feeds: Iterable[Mapping[str, np.ndarray]], extra: Iterable[str] = ()
) -> list[dict[str, np.ndarray]]:
    """``run`` over several inputs with one session."""
    proto = to_proto(model) if not isinstance(model, onnx.ModelProto) else model
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    have = {o.name for o in proto.graph.output}
    proto.graph.output.extend(helper.make_tensor_value_info(n, _F32, None) for n in extra if n not in have)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(names, dict(f)), strict=True)) for f in feeds]


def fake_quant(
    x: np.ndarray, scale: float, zero_point: int = 0, qmin: int = -128, qmax: int = 127
) -> np.ndarray:
    """QuantizeLinear then DequantizeLinear in float32: (clip(rint(x / s) + zp) - zp) * s."""
    s = np.float32(scale)
    q = np.clip(np.rint(x.astype(np.float32) / s) + zero_point, qmin, qmax)
    return ((q - zero_point).astype(np.float32) * s).astype(np.float32)


def grid_mismatches(model: onnx.ModelProto | ir.Model, feeds: Mapping[str, np.ndarray]) -> list[str]:
    """Every quantizer on a computed tensor must output its numpy reference at its (new) parameters:
    zonnx ops through ``reference_run`` (their rounding mode), QDQ through ``fake_quant``; list the others."""
    work = to_ir(onnx.ModelProto.FromString(to_proto(model).SerializeToString()))
    graph = QuantGraph(work)
    checks = [(s.tensor.name, q) for s in graph.sites() for q in s.quantizers if not s.const]
    values = run(work, feeds, [n for src, q in checks for n in (src, q.outputs[0].name)])
    bad = []
    for src, q in checks:
        params = q.params()
        assert not isinstance(params, str)
        if q.form == "qdq":
            want = fake_quant(values[src], *params)
        else:
            attrs = {k: a.value for k, a in q.nodes[0].attributes.items() if k != "output_dtype"}
            want = reference_run("FixNeuron", values[src], **attrs)
        got = values[q.outputs[0].name]
        if not np.array_equal(got, want):
            bad.append(f"{q.outputs[0].name}: {params}, {int((got != want).sum())} values off")
    return bad


# ------------------------------------------------------------------------------------------ the test CNN


class SmallCNN(torch.nn.Module):
    """Conv+BN+ReLU (two branches) -> Concat -> MaxPool -> residual Add -> LeakyReLU(0.1) -> AvgPool 3x3
    -> Conv -> Sigmoid -> GlobalAveragePool (6x6) -> Linear."""

    def __init__(self, alpha: float = 0.1) -> None:
        super().__init__()
        nn = torch.nn
        self.a = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.res = nn.Conv2d(16, 16, 3, padding=1)
        self.lrelu = nn.LeakyReLU(alpha)
        self.avg = nn.AvgPool2d(3, stride=1)
        self.head = nn.Conv2d(16, 8, 1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pool(torch.cat([self.a(x), self.b(x)], 1))
        y = self.avg(self.lrelu(self.res(y) + y))
        y = torch.sigmoid(self.head(y))
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))


@dataclasses.dataclass(frozen=True)
class Models:
    """One float model and its power-of-two quantized forms (bit-identical in ORT), with inputs."""

    float_path: Path
    ort: onnx.ModelProto  # onnxruntime's QDQ output (float scales)
    qdq: onnx.ModelProto
    fixneuron: onnx.ModelProto
    vitis: onnx.ModelProto
    feeds: list[dict[str, np.ndarray]]

    def form(self, name: str) -> onnx.ModelProto:
        return {"qdq": self.qdq, "fixneuron": self.fixneuron, "vitis": self.vitis}[name]


FORMS = ("qdq", "fixneuron", "vitis")


def _tidy(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop value_info of values that no longer exist (Q outputs folded into FixNeuron)."""
    names = {o for n in model.graph.node for o in n.output}
    kept = [v for v in model.graph.value_info if v.name in names]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    return model


def quantized_forms(float_path: Path, feeds: list[dict[str, np.ndarray]], folder: Path) -> Models:
    """ORT QDQ -> power of two (with inferred shapes) -> FixNeuron and Vitis forms."""
    raw = onnx.shape_inference.infer_shapes(ort_qdq(float_path, folder / "ort_qdq.onnx", feeds))
    qdq = qdq_pof2(raw)
    return Models(float_path, raw, qdq, _tidy(to_fixneuron(qdq)), _tidy(to_vitis(qdq)), feeds)


def export(module: torch.nn.Module, x: torch.Tensor, path: Path) -> Path:
    torch.manual_seed(0)
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.weight.uniform_(0.5, 2.0)
                m.bias.uniform_(-1.0, 1.0)
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            (x,),
            str(path),
            dynamo=False,
            opset_version=13,
            input_names=["x"],
            output_names=["y"],
        )
    return path


@functools.cache
def cnn(alpha: float = 0.1) -> Models:
    """The SmallCNN quantized once per test session (about a second)."""
    torch.manual_seed(0)
    folder = Path(tempfile.mkdtemp(prefix="zonnx_refine_"))
    path = export(SmallCNN(alpha), torch.randn(1, 3, 16, 16), folder / "cnn.onnx")
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(8)]
    return quantized_forms(path, feeds, folder)


def node_of(model: onnx.ModelProto | ir.Model, op_type: str, occurrence: int = 0) -> ir.Node:
    work = (
        model if isinstance(model, ir.Model) else to_ir(onnx.ModelProto.FromString(model.SerializeToString()))
    )
    return [n for n in work.graph if n.op_type == op_type][occurrence]


def in_key(model: onnx.ModelProto | ir.Model, op_type: str, index: int = 0, occurrence: int = 0) -> str:
    """Name of the quantized tensor feeding input ``index`` of the ``occurrence``-th ``op_type`` node."""
    return node_of(model, op_type, occurrence).inputs[index].name  # type: ignore[union-attr, return-value]


def out_key(
    model: onnx.ModelProto | ir.Model, op_type: str, occurrence: int = 0, through: Iterable[str] = ()
) -> str:
    """Name of the quantized (dequantized) value of the ``occurrence``-th ``op_type`` node's output."""
    work = (
        model if isinstance(model, ir.Model) else to_ir(onnx.ModelProto.FromString(model.SerializeToString()))
    )
    node = node_of(work, op_type, occurrence)
    site = QuantGraph(work).output_site(node.outputs[0], set(through))
    assert site is not None, op_type
    return site.quantizers[0].outputs[0].name  # type: ignore[return-value]


def user_target(folder: Path, name: str, replace: Mapping[str, str]) -> Path:
    """A copy of the bundled DPU target file with text replacements, saved as ``<folder>/<name>.toml``."""
    text = (TARGETS_DIR / "dpu-b4096.toml").read_text().replace('name = "dpu-b4096"', f'name = "{name}"')
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new, 1)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def refine_copy(pass_: Any, model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int], list[str]]:
    """Run a pass on a copy; check the result loads in ORT and that a second run changes nothing."""
    work = to_ir(onnx.ModelProto.FromString(model.SerializeToString()))
    result = pass_(work)
    after = to_proto(result.model)
    check_loadable(after, full_check=False)
    again = pass_(to_ir(onnx.ModelProto.FromString(after.SerializeToString())))
    assert again.changes.total == 0 and not again.modified, dict(again.changes.counts)
    assert again.changes.misses == result.changes.misses
    return after, dict(result.changes.counts), result.changes.misses
