"""PyTorch frontend on real torch modules: CNN, transformer block, LSTM, dynamic batch and sequence, the zoo's
ResNet-18, torch-quantized models (PTQ fbgemm/qnnpack, QAT), TorchScript and torch.export files, bad models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.ao.quantization as tq
from torch import nn

import zonnx.convert
from zonnx.converters.common import ConversionError, ConversionResult
from zonnx.converters.dispatch import ConvertOptions
from zonnx.converters.from_torch import from_torch
from zonnx.converters.torch_check import QNNPACK_REFERENCE, check_against_torch, check_args, torch_u8s8_exact
from zonnx.inspection import inspect_model
from zonnx.verify import exact_integer_form
from zonnx.zoo.torch_models import resnet18_module

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*torch.ao.quantization is deprecated"),
    pytest.mark.filterwarnings("ignore:.*quantize_per_tensor, torch.quantize_per_channel"),
    pytest.mark.filterwarnings("ignore:Please use quant_min and quant_max"),
]


# ---------------------------------------------------------------- models


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.head = nn.Linear(8, 5)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(image).mean(dim=(2, 3)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.layer(tokens)


class Tagger(nn.Module):
    """Embedding + 2-layer LSTM; returns a dict (its keys become the output names)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.lstm = nn.LSTM(16, 24, num_layers=2, batch_first=True)
        self.out = nn.Linear(24, 3)

    def forward(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        seq, _ = self.lstm(self.emb(ids))
        return {"logits": self.out(seq[:, -1]), "states": seq}


class SeqPool(nn.Module):
    """Conv1d over a sequence, masked mean and a softmax attention written with plain ops (exports dynamic)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(12, 16)
        self.conv = nn.Conv1d(16, 16, 3, padding=1)
        self.score = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.proj(x))
        h = self.conv(h.transpose(1, 2)).transpose(1, 2)
        w = torch.softmax(self.score(h).squeeze(-1) + (mask - 1) * 1e4, dim=1)
        return (w.unsqueeze(-1) * h).sum(1)


class QuantNet(nn.Module):
    """Eager-mode quantizable CNN: conv-bn-relu, depthwise conv, residual add, pool, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.conv, self.bn, self.relu = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()
        self.dw, self.relu2 = nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU()
        self.add = nn.quantized.FloatFunctional()
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn(self.conv(self.quant(x))))
        x = self.add.add(x, self.relu2(self.dw(x)))
        return self.dequant(self.fc(torch.flatten(self.pool(x), 1)))

    def fuse(self) -> QuantNet:
        return tq.fuse_modules(self, [["conv", "bn", "relu"], ["dw", "relu2"]], inplace=False)


def quantized_net(engine: str, *, qat: bool = False, seed: int = 0) -> nn.Module:
    """QuantNet quantized with torch's own eager-mode flow (PTQ calibration, or a few QAT steps)."""
    torch.backends.quantized.engine = engine
    torch.manual_seed(seed)
    data = [torch.randn(4, 3, 16, 16) for _ in range(8)]
    if qat:
        model = QuantNet().train()
        model = tq.fuse_modules_qat(model, [["conv", "bn", "relu"], ["dw", "relu2"]])
        model.qconfig = tq.get_default_qat_qconfig(engine)
        prepared = tq.prepare_qat(model)
        opt = torch.optim.SGD(prepared.parameters(), lr=0.01)
        for x in data:
            opt.zero_grad()
            prepared(x).square().mean().backward()
            opt.step()
        prepared.eval()
    else:
        model = QuantNet().eval().fuse()
        model.qconfig = tq.get_default_qconfig(engine)
        prepared = tq.prepare(model)
        with torch.no_grad():
            for x in data:
                prepared(x)
    return tq.convert(prepared.eval())


# ---------------------------------------------------------------- checks every result must pass


def assert_valid(result: ConversionResult, inputs: list[str], outputs: list[str]) -> onnx.ModelProto:
    """checker (full), ORT 1.31 loads it, IR <= 13, the source's I/O names, provenance metadata."""
    model = result.model
    onnx.checker.check_model(model, full_check=True)
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert model.ir_version <= 13
    assert [i.name for i in model.graph.input] == inputs
    assert [o.name for o in model.graph.output] == outputs
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["zonnx.framework"] == result.info.framework
    assert meta["zonnx.framework_version"] == result.info.framework_version
    assert meta["zonnx.source"] == result.info.source
    assert isinstance(json.loads(meta["zonnx.convert_options"]), dict)
    return model


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ORT with its optimizations, on the model's exact integer form (uint8 weights where this host's u8 x s8
    kernels saturate: ``zonnx.verify.exact_integer_form``), so a fused QDQ group sums exactly on every CPU."""
    model = exact_integer_form(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# ---------------------------------------------------------------- float models


def test_cnn_matches_torch_on_fresh_inputs() -> None:
    torch.manual_seed(0)
    module = SmallCNN().eval()
    result = from_torch(module, torch.randn(1, 3, 16, 16), dynamic_axes={"image": {0: "batch"}})
    model = assert_valid(result, ["image"], ["output"])
    assert result.info.framework == "torch" and result.info.framework_version == torch.__version__
    assert all(c.cosine > 0.9999 for c in result.checks)
    x = torch.randn(3, 3, 16, 16)
    got = run(model, {"image": x.numpy()})[0]
    with torch.no_grad():
        want = module(x).numpy()
    assert cosine(got, want) > 0.9999 and np.abs(got - want).max() < 1e-4
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_transformer_block() -> None:
    torch.manual_seed(1)
    module = Block().eval()
    result = from_torch(module, torch.randn(2, 7, 32))
    model = assert_valid(result, ["tokens"], ["output"])
    assert result.checks[0].cosine > 0.9999
    ops = {n.op_type for n in model.graph.node}
    assert {"MatMul", "Softmax"} <= ops


def test_lstm_with_dict_outputs_and_dynamic_sizes() -> None:
    torch.manual_seed(2)
    module = Tagger().eval()
    ids = torch.randint(0, 50, (2, 9))
    result = from_torch(module, ids, dynamic_axes={"ids": {0: "batch", 1: "seq"}})
    model = assert_valid(result, ["ids"], ["logits", "states"])
    assert "LSTM" in {n.op_type for n in model.graph.node}
    assert {c.name: c.cosine > 0.9999 for c in result.checks} == {"logits": True, "states": True}
    longer = torch.randint(0, 50, (3, 20))
    logits, states = run(model, {"ids": longer.numpy()})
    with torch.no_grad():
        want = module(longer)
    assert states.shape == (3, 20, 24)
    assert cosine(logits, want["logits"].numpy()) > 0.9999 and cosine(states, want["states"].numpy()) > 0.9999


def test_dynamic_batch_and_sequence_two_sizes() -> None:
    torch.manual_seed(3)
    module = SeqPool().eval()
    x, mask = torch.randn(2, 6, 12), torch.ones(2, 6)
    axes = {"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}}
    result = from_torch(module, (x, mask), dynamic_axes=axes)
    model = assert_valid(result, ["x", "mask"], ["output"])
    dims = [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims[:2] == ["batch", "seq"]
    for batch, seq in ((1, 3), (4, 17)):
        x, mask = torch.randn(batch, seq, 12), (torch.rand(batch, seq) > 0.3).float()
        got = run(model, {"x": x.numpy(), "mask": mask.numpy()})[0]
        with torch.no_grad():
            want = module(x, mask).numpy()
        assert got.shape == (batch, 16) and cosine(got, want) > 0.9999


def test_traced_size_caught_by_dynamic_check() -> None:
    """nn.MultiheadAttention exports a traced sequence size: the check at doubled sizes must say so."""
    with pytest.raises(ConversionError, match=r"Reshape.*traced a size") as info:
        from_torch(Block().eval(), torch.randn(2, 7, 32), dynamic_axes={"tokens": {0: "batch", 1: "seq"}})
    assert "\n" not in str(info.value) and "tokens:4,14,32" in str(info.value)


def test_zoo_resnet18_module() -> None:
    module = resnet18_module()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32))
    result = from_torch(module, x, input_names=["input"], output_names=["logits"])
    model = assert_valid(result, ["input"], ["logits"])
    assert result.checks[0].cosine > 0.9999
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") == 20 and ops.count("Add") == 8


def test_python_facade() -> None:
    torch.manual_seed(4)
    result = zonnx.convert.from_torch(SmallCNN().eval(), torch.randn(1, 3, 8, 8))
    assert isinstance(result, ConversionResult) and result.checks[0].cosine > 0.9999


# ---------------------------------------------------------------- quantized models


@pytest.mark.parametrize(("engine", "qat"), [("fbgemm", False), ("qnnpack", False), ("fbgemm", True)])
def test_torch_quantized_model_imports_as_qdq(engine: str, qat: bool) -> None:
    module = quantized_net(engine, qat=qat)
    result = from_torch(module, torch.randn(1, 3, 16, 16), dynamic_axes={"x": {0: "N"}},
                        check_inputs=[torch.randn(4, 3, 16, 16) for _ in range(4)])  # fmt: skip
    model = assert_valid(result, ["x"], ["output"])
    ops = [n.op_type for n in model.graph.node]
    assert (
        ops.count("QuantizeLinear") >= 6 and "Conv" in ops and not any(o.startswith("QLinear") for o in ops)
    )
    assert result.checks[0].max_lsb is not None and result.checks[0].max_lsb <= 1
    # the check compares with an exact torch run: fbgemm's own where its u8 x s8 sums are exact (VNNI), else
    # the module re-packed for QNNPACK (without VNNI fbgemm saturates: 3 codes off on this QAT model's check)
    exact_here = all(torch_u8s8_exact(e) for e in ("fbgemm", "x86", "onednn"))
    assert result.checks[0].reference == ("" if exact_here else QNNPACK_REFERENCE)
    summary = inspect_model(model).quantization
    assert (
        summary.format == "QDQ" and "int8" in summary.weight_dtypes and "uint8" in summary.activation_dtypes
    )
    assert summary.per_tensor > 0 and (
        summary.per_channel >= 3 if engine == "fbgemm" else summary.per_channel == 0
    )
    # independent check: integer codes of torch's output vs ORT's, on fresh inputs of the calibration range
    # (standard normal: codes stay low enough that fbgemm's pair sums do not saturate here either)
    final_dq = next(n for n in model.graph.node if n.output[0] == "output")
    scale = float(
        onnx.numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == final_dq.input[1]))
    )
    worst, differing = 0, 0
    for seed in range(5):
        x = torch.from_numpy(np.random.default_rng(seed).standard_normal((4, 3, 16, 16)).astype(np.float32))
        with torch.no_grad():
            want = np.round(module(x).numpy() / scale)
        got = np.round(run(model, {"x": x.numpy()})[0] / scale)
        worst = max(worst, int(np.abs(got - want).max()))
        differing += int((got != want).sum())
    assert worst <= 1 and differing < 4 * 10 * 5 * 0.1


def _qnnpack_copy_fails(module: object) -> object:
    raise RuntimeError("QNNPACK cannot pack this")


def test_torch_inexact_source_is_named_when_no_exact_rerun(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where torch's kernels saturate and no exact re-run can be made, a mismatch says torch is inexact here."""
    import zonnx.converters.torch_check as torch_check

    module = quantized_net("fbgemm", qat=True)
    x = torch.randn(1, 3, 16, 16)
    model = from_torch(module, x, check=False).model
    made_by = {o: n for n in model.graph.node for o in n.output}
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    bias_dq = made_by[gemm.input[2]]  # DequantizeLinear of fc's int32 bias, scale x_scale * w_scale
    inits = {t.name: t for t in model.graph.initializer}
    bias = inits[bias_dq.input[0]]
    bias_scale = onnx.numpy_helper.to_array(inits[bias_dq.input[1]]).astype(np.float64)
    out_scale = float(onnx.numpy_helper.to_array(inits[made_by["output"].input[1]]))
    shift = np.round(-6 * out_scale / bias_scale).astype(np.int32)  # 6 output codes down: a real mismatch
    bias.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(bias) + shift, bias.name))
    samples = check_args((x,), ["x"], {}, {})
    monkeypatch.setattr(torch_check, "_torch_saturates", lambda: True)
    monkeypatch.setattr(torch_check, "_qnnpack_copy", _qnnpack_copy_fails)
    with pytest.raises(ConversionError) as e:
        check_against_torch(module, model, samples, ["x"], min_cosine=0.9999, max_lsb=1)
    message = str(e.value)
    assert "does not match the source framework:" in message and "LSB (allowed 1)" in message
    assert "torch's own result is not exact on this CPU" in message and "QNNPACK cannot pack this" in message
    # with a working re-run the mismatch names what it compared with (the QNNPACK copy), and still fails
    monkeypatch.undo()
    monkeypatch.setattr(torch_check, "_torch_saturates", lambda: True)
    with pytest.raises(ConversionError, match=r"source framework \(torch re-run with QNNPACK, exact"):
        check_against_torch(module, model, samples, ["x"], min_cosine=0.9999, max_lsb=1)


# ---------------------------------------------------------------- files and bad models


def test_torchscript_and_export_files(tmp_path: Path) -> None:
    torch.manual_seed(5)
    module = SmallCNN().eval()
    x = torch.randn(2, 3, 16, 16)
    torch.jit.script(module).save(str(tmp_path / "s.pt"))
    torch.jit.trace(module, x).save(str(tmp_path / "t.pt"))
    batch = torch.export.Dim("batch", min=1, max=64)
    torch.export.save(
        torch.export.export(module, (x,), dynamic_shapes={"image": {0: batch}}), tmp_path / "e.pt2"
    )
    shapes = ConvertOptions(input_shapes={"image": (1, 3, 16, 16)})
    for name, opts in (("s.pt", shapes), ("t.pt", shapes), ("e.pt2", ConvertOptions())):
        converted = zonnx.convert.convert(str(tmp_path / name), opts)
        model = assert_valid(converted.result, ["image"], ["output"])
        assert converted.result.checks[0].cosine > 0.9999, name
        assert converted.ops_before is not None and converted.ops_after["Conv"] == 2
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 3, 16, 16]  # the .pt2's symbolic batch stays dynamic


def test_unexportable_op_names_op_and_node() -> None:
    class Head(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.erfinv(torch.tanh(x))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.head = nn.Linear(4, 4), Head()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.lin(x))

    with pytest.raises(ConversionError) as info:
        from_torch(Model(), torch.randn(2, 4))
    message = str(info.value)
    assert "aten::erfinv" in message and "/head/erfinv" in message and "test_from_torch.py" in message
    assert "\n" not in message and "Traceback" not in message


def test_example_inputs_that_do_not_fit_name_the_input() -> None:
    with pytest.raises(ConversionError, match=r"image:1,3,16 .*--input-shape"):
        from_torch(SmallCNN(), torch.randn(1, 3, 16))


class _BatchOfOne(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != 1:
            raise ValueError("batch of one only")
        return x * 2


def test_a_test_input_torch_cannot_run_is_an_error_not_dropped() -> None:
    """A given check input on which the source module raises fails the conversion (never silently skipped)."""
    x = torch.ones(1, 4)
    with pytest.raises(ConversionError, match=r"fails on test input 1 \(x:2,4\).*batch of one only"):
        from_torch(
            _BatchOfOne(),
            (x,),
            input_names=["x"],
            dynamic_axes={"x": {0: "n"}},
            check_inputs=[(torch.ones(2, 4),)],
        )
