"""``inspect_model`` on hand-made, torch-exported and real PP-OCR models: exact MACs, parameters, shapes, rendering."""

from __future__ import annotations

import io
import json
import math
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from rich.console import Console
from torch import nn

from tests.helpers import parse
from zonnx import zoo
from zonnx.errors import OptionError
from zonnx.inspection import inspect_model, render

PPOCR_SHAPES = {"ppocr_cls": (1, 3, 48, 192), "ppocr_rec": (1, 3, 48, 320), "ppocr_det": (1, 3, 320, 320)}

MAC_OPS_TEXT = """<ir_version: 8, opset_import: ["": 13]>
g (float[N, 3, 8, 8] x, float[N, 4] v) => (float[N, 16, 8, 8] a, float[N, 6, 6, 6] b, float[N, 4, 17, 17] t,
                                           float[N, 6] gm, float[3, N, 6] mm) {
  a = Conv <pads = [1, 1, 1, 1]> (x, w_conv)
  b = Conv <group = 3, dilations = [2, 2]> (x, w_group)
  t = ConvTranspose <strides = [2, 2]> (x, w_tr)
  vt = Transpose <perm = [1, 0]> (v)
  gm = Gemm <transA = 1> (vt, w_gemm)
  v4 = Unsqueeze (v, axes)
  mm = MatMul (v4, w_mm)
}"""


def _mac_ops_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    shapes = {
        "w_conv": (16, 3, 3, 3),
        "w_group": (6, 1, 2, 2),
        "w_tr": (3, 4, 3, 3),
        "w_gemm": (4, 6),
        "w_mm": (3, 4, 6),
    }
    arrays = [(k, rng.standard_normal(v).astype(np.float32)) for k, v in shapes.items()]
    return parse(MAC_OPS_TEXT, *arrays, ("axes", np.array([0], np.int64)))


def test_hand_computed_macs_scale_with_batch() -> None:
    model = _mac_ops_model()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": np.ones((3, 3, 8, 8), np.float32), "v": np.ones((3, 4), np.float32)}
    assert [o.shape for o in sess.run(None, feeds)] == [
        (3, 16, 8, 8),
        (3, 6, 6, 6),
        (3, 4, 17, 17),
        (3, 6),
        (3, 3, 6),
    ]
    # Conv 3->16 3x3 pad 1: N*16*8*8 * 3*9; grouped (3) dilated 2x2 conv: N*6*6*6 * 1*2*2;
    # ConvTranspose 3->4 3x3 stride 2: N*3*8*8 (input) * 4*3*3; Gemm transA [4,N]^T x [4,6]: N*6 * K=4;
    # MatMul [1,N,4] x [3,4,6] -> [3,N,6]: 3*N*6 * K=4 (broadcast batch dim included).
    per_n = {
        "Conv": 16 * 64 * 27 + 6 * 36 * 4,
        "ConvTranspose": 3 * 64 * 36,
        "Gemm": 6 * 4,
        "MatMul": 3 * 6 * 4,
    }
    for batch in (1, 3):
        s = inspect_model(model, batch=batch)
        assert {e.op_type: e.macs for e in s.macs.by_op} == {k: v * batch for k, v in per_n.items()}
        assert s.macs.total == sum(per_n.values()) * batch and s.macs.complete
        assert s.macs.batch == batch
        assert {(f.input, f.axis, f.symbol, f.value) for f in s.macs.fixed_dims} == {
            ("x", 0, "N", batch),
            ("v", 0, "N", batch),
        }
        assert any(f"x[0] ('N') = {batch} (batch)" in n for n in s.notes)


def test_symbolic_spatial_dims_make_macs_unknown_not_zero() -> None:
    model = parse(
        """<ir_version: 8, opset_import: ["": 13]>
        g (float[N, 3, H, W] x) => (float[N, 4, H, W] y, float[1, 2] z) {
          y = Conv <pads = [1, 1, 1, 1]> (x, w)
          f = Constant <value = float[1, 8] {1, 2, 3, 4, 5, 6, 7, 8}> ()
          z = Gemm (f, wf)
        }""",
        ("w", np.ones((4, 3, 3, 3), np.float32)),
        ("wf", np.ones((8, 2), np.float32)),
    )
    s = inspect_model(model)
    assert s.macs.total == 16 and not s.macs.complete  # the Gemm is known: 1*2*8
    conv = next(e for e in s.macs.by_op if e.op_type == "Conv")
    assert (conv.nodes, conv.macs, conv.unknown) == (1, 0, 1)
    assert s.macs.unknown_dims == ["x[2] ('H')", "x[3] ('W')"]
    assert any("unknown, not zero" in n and "x[2] ('H')" in n for n in s.notes)
    full = inspect_model(model, shapes={"x": (2, 3, 10, 12)})
    assert full.macs.complete and full.macs.total == 2 * 4 * 120 * 27 + 16
    with pytest.raises(OptionError, match="Did you mean 'x'"):
        inspect_model(model, shapes={"xx": (1, 3, 4, 4)})
    with pytest.raises(OptionError, match="rank 4"):
        inspect_model(model, shapes={"x": (1, 3, 4)})
    with pytest.raises(OptionError, match="dim 1"):
        inspect_model(model, shapes={"x": (1, 4, 4, 4)})
    with pytest.raises(OptionError, match="batch"):
        inspect_model(model, batch=0)


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = (
            None
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class _ResNet18(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        blocks, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            blocks += [_Block(cin, cout, stride), _Block(cout, cout, 1)]
            cin = cout
        self.blocks, self.fc = nn.Sequential(*blocks), nn.Linear(512, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


def export_torch(module: nn.Module, shape: tuple[int, ...], **kw: object) -> onnx.ModelProto:
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the legacy TorchScript exporter is deprecated (no onnxscript here)
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module, (torch.randn(*shape),), buf, dynamo=False, opset_version=13, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}}, **kw)  # fmt: skip
    return onnx.load_from_string(buf.getvalue())


def test_resnet18_macs_match_torch_hooks() -> None:
    torch.manual_seed(0)
    net = _ResNet18().eval()
    for bn in (
        m for m in net.modules() if isinstance(m, nn.BatchNorm2d)
    ):  # distinct values: no dedup on export
        for t in (bn.weight, bn.bias, bn.running_mean):
            t.data.uniform_(-1, 1)
        bn.running_var.data.uniform_(0.5, 2)
    model = export_torch(net, (1, 3, 224, 224))  # the exporter folds each BatchNormalization into its Conv
    macs = 0

    def hook(mod: nn.Module, _inp: object, out: torch.Tensor) -> None:
        nonlocal macs
        if isinstance(mod, nn.Conv2d):
            macs += out.numel() * mod.in_channels // mod.groups * math.prod(mod.kernel_size)
        else:
            macs += out.numel() * mod.in_features

    for mod in net.modules():
        if isinstance(mod, nn.Conv2d | nn.Linear):
            mod.register_forward_hook(hook)
    with torch.no_grad():
        net(torch.randn(2, 3, 224, 224))
    start = time.perf_counter()
    s = inspect_model(model, batch=2)
    print(f"resnet18 (46 MB in memory): inspect {time.perf_counter() - start:.3f} s, {s.macs.total:,} MACs")
    assert s.macs.total == macs == 2 * 1_814_073_344  # the published ResNet-18 figure, 1.814 GMACs per image
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    folded = sum(c.weight.numel() + c.out_channels for c in convs)  # weights + the bias each BN leaves
    assert s.parameters.count == folded + net.fc.weight.numel() + net.fc.bias.numel() == 11_684_712
    assert s.parameters.bytes == 4 * s.parameters.count and s.parameters.tensors == 42
    assert s.op_histogram["Conv"] == 20 and "BatchNormalization" not in s.op_histogram


def test_subgraph_ops_are_counted() -> None:
    model = parse(
        """<ir_version: 8, opset_import: ["": 13]>
        g (float[N, 4] x, bool c, int64 trip) => (float[N, 3] y, float[N, 5] z) {
          y = If (c) <then_branch = g1 () => (float[N, 3] t) { t = MatMul (x, w1) },
                      else_branch = g2 () => (float[N, 3] e) { e = MatMul (x, w2) }>
          z0 = MatMul (x, w4)
          z = Loop (trip, c, z0) <body = b (int64 i, bool ci, float[N, 5] zi) => (bool co, float[N, 5] zo) {
              co = Identity (ci)
              zo = MatMul (zi, w3)
          }>
        }""",
        ("w1", np.ones((4, 3), np.float32)),
        ("w2", np.ones((4, 3), np.float32)),
        ("w3", np.ones((5, 5), np.float32)),
        ("w4", np.ones((4, 5), np.float32)),
    )
    s = inspect_model(model, batch=2)
    assert s.op_histogram == {"MatMul": 4, "Identity": 1, "If": 1, "Loop": 1}
    assert (s.nodes, s.subgraph_nodes, s.control_flow) == (7, 4, {"If": 1, "Loop": 1})
    assert s.macs.total == 2 * (3 * 4 + 3 * 4 + 5 * 5 + 5 * 4) and s.macs.complete
    assert any("4 node(s) inside the subgraphs of 1 If, 1 Loop" in n for n in s.notes)


def test_external_data_is_never_read(tmp_path: Path) -> None:
    model = parse(
        '<ir_version: 8, opset_import: ["": 13]> g (float[B, 1024] x) => (float[B, 4096] y) { y = Gemm <transB = 1> (x, w) }',
        ("w", np.ones((4096, 1024), np.float32)),
    )
    start = time.perf_counter()
    in_memory = inspect_model(model)
    print(f"16 MiB Gemm model in memory: inspect {time.perf_counter() - start:.3f} s")
    path = tmp_path / "big.onnx"
    onnx.save(model, path, save_as_external_data=True, location="big.onnx.data")
    (tmp_path / "big.onnx.data").unlink()  # reading the data would fail now
    s = inspect_model(path)
    assert s.parameters.external == 1 and s.parameters.bytes == in_memory.parameters.bytes == 4096 * 1024 * 4
    assert s.macs.total == in_memory.macs.total == 4096 * 1024
    assert any("big.onnx.data" in n and "not found" in n for n in s.notes)


def _ort_macs(path: Path, shape: tuple[int, ...]) -> int:
    """MACs from the shapes ORT really produces, by the formulas, independent of onnx shape inference."""
    model = onnx.load(path)
    dims = {t.name: tuple(t.dims) for t in model.graph.initializer}
    dims |= {n.output[0]: tuple(n.attribute[0].t.dims) for n in model.graph.node if n.op_type == "Constant"}
    nodes = [n for n in model.graph.node if n.op_type in ("Conv", "ConvTranspose", "MatMul", "Gemm")]
    wanted = sorted({n.input[0] for n in nodes} | {n.output[0] for n in nodes})
    model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in wanted)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    got = dict(zip(wanted, sess.run(wanted, {model.graph.input[0].name: x})[: len(wanted)], strict=True))
    total = 0
    for n in nodes:
        out, inp = got[n.output[0]].shape, got[n.input[0]].shape
        if n.op_type == "Conv":
            total += math.prod(out) * math.prod(dims[n.input[1]][1:])
        elif n.op_type == "ConvTranspose":
            total += math.prod(inp) * math.prod(dims[n.input[1]][1:])
        else:
            total += math.prod(out) * inp[-1]
    return total


@pytest.mark.parametrize("name", sorted(PPOCR_SHAPES))
def test_ppocr_models(name: str) -> None:
    path = zoo.get(name)
    proto = onnx.load(path)
    start = time.perf_counter()
    s = inspect_model(path, shapes={"x": PPOCR_SHAPES[name]})
    seconds = time.perf_counter() - start
    expected = _ort_macs(path, PPOCR_SHAPES[name])
    print(f"{name}: inspect {seconds:.3f} s, {s.macs.total:,} MACs at {PPOCR_SHAPES[name]}")
    assert s.macs.complete and s.macs.total == expected
    assert s.op_histogram == Counter(n.op_type for n in proto.graph.node)
    assert list(s.op_histogram.values()) == sorted(s.op_histogram.values(), reverse=True)
    assert sum(s.op_histogram.values()) == len(proto.graph.node) == s.nodes
    constants = [
        onnx.numpy_helper.to_array(n.attribute[0].t) for n in proto.graph.node if n.op_type == "Constant"
    ]
    assert s.parameters.count == sum(a.size for a in constants) and s.parameters.constants == len(constants)
    assert s.parameters.bytes == sum(a.nbytes for a in constants)
    assert s.quantization.format == "none"
    assert s.opsets == {"ai.onnx": proto.opset_import[0].version} and s.ir_version == proto.ir_version
    assert s.inputs[0].name == "x" and s.inputs[0].shape[1] == 3 and s.inputs[0].dtype == "float32"
    plain = onnx.shape_inference.infer_shapes(proto)
    typed = {
        v.name for v in [*plain.graph.value_info, *plain.graph.output] if v.type.tensor_type.HasField("shape")
    }
    assert [u.name for u in s.unknown_shapes] == [
        o for n in plain.graph.node for o in n.output if o not in typed
    ]


def test_ppocr_defaults_and_summary_details() -> None:
    rec = inspect_model(zoo.get("ppocr_rec"))
    assert rec.metadata_keys == ["character"]
    assert rec.inputs[0].shape == ["p2o.DynamicDimension.0", 3, "?", "p2o.DynamicDimension.1"]
    assert rec.macs.batch == 1 and not rec.macs.complete and rec.macs.unknown
    assert len(rec.unknown_shapes) == 125  # measured: what onnx shape inference leaves untyped on this model
    cls = inspect_model(zoo.get("ppocr_cls"))
    assert cls.inputs[0].shape == ["?", 3, "?", "?"] and cls.macs.unknown_dims == ["x[2] ('?')", "x[3] ('?')"]
    data = json.loads(cls.to_json())
    assert list(data) == [
        "path", "ir_version", "opsets", "producer_name", "producer_version", "graph_name", "metadata_keys",
        "inputs", "outputs", "nodes", "subgraph_nodes", "control_flow", "functions", "op_histogram",
        "parameters", "macs", "quantization", "unknown_shapes", "notes",
    ]  # fmt: skip
    assert data["macs"]["total"] == cls.macs.total and data["parameters"]["by_dtype"][0]["dtype"] == "float32"


def test_input_is_never_modified_and_all_forms_agree() -> None:
    path = zoo.get("ppocr_cls")
    proto = onnx.load(path)
    before = proto.SerializeToString()
    from_proto = inspect_model(proto, shapes={"x": (1, 3, 48, 192)}).to_dict()
    assert proto.SerializeToString() == before
    from_ir = inspect_model(ir.serde.deserialize_model(proto), shapes={"x": (1, 3, 48, 192)}).to_dict()
    from_path = inspect_model(path, shapes={"x": (1, 3, 48, 192)}).to_dict()
    assert from_path.pop("path") == str(path) and from_proto.pop("path") is None
    assert from_path == from_proto
    assert from_ir["macs"] == from_proto["macs"] and from_ir["parameters"] == from_proto["parameters"]


def test_render_plain_and_terminal() -> None:
    s = inspect_model(zoo.get("ppocr_cls"), shapes={"x": (1, 3, 48, 192)})
    plain = Console(file=io.StringIO(), width=80, highlight=False)
    render(s, plain)
    text = plain.file.getvalue()
    assert text.isascii() and "\x1b" not in text
    for title in ("Inputs and outputs", "Ops (by count)", "MACs by op type", "Parameters by dtype"):
        assert title in text
    assert f"{s.macs.total:,}" in text and "save_infer_model/scale_0.tmp_1" in text
    term = Console(file=io.StringIO(), width=100, force_terminal=True, highlight=False)
    render(s, term)
    assert "─" in term.file.getvalue()
