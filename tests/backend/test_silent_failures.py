"""Issue 11 part B: what used to fail silently on real models now warns, refuses or works (items 10-16, 19)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper as nh
import onnx.parser
import pytest
from onnxruntime.quantization import QuantFormat, QuantType
from onnxruntime.quantization import quantize_static as ort_quantize_static
from typer.testing import CliRunner

import zonnx
from tests.backend.partition_models import quantize
from zonnx import zoo
from zonnx.backend.compile_api import compile_model
from zonnx.backend.compiled import lower_npu_nodes
from zonnx.backend.partition import LowCoverageError, partition, propose
from zonnx.backend.runtime.ort_lowering import lower_program
from zonnx.backend.session import InferenceSession
from zonnx.build_npu import target_quantize_kwargs
from zonnx.errors import OptionError
from zonnx.ir.io import load_model
from zonnx.quantization.calibration.readers import ListReader
from zonnx.tools.main import app
from zonnx.verify import ort_session

NPU = ["ZonnxNPUExecutionProvider", "CPUExecutionProvider"]


def _fake_quant(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The quantized model's first output in ORT with its fusions, in its exact integer form
    (``verify.ort_session``: uint8 weights where this host's u8 x s8 kernels saturate)."""
    return ort_session(path, optimize=True).run(None, feeds)[0]


@pytest.fixture(scope="module")
def r18_u8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ResNet-18 quantized by ONNX Runtime itself: u8 activations, the CPU provider's favourite."""
    out = tmp_path_factory.mktemp("u8") / "r18_u8.onnx"
    ort_quantize_static(
        str(zoo.get("resnet18-random")), str(out), ListReader(zoo.sample_inputs("resnet18-random", 2)),
        quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def r18_zhouyi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("zx") / "r18_zhouyi.onnx"
    kwargs = target_quantize_kwargs("zhouyi-x2")
    kwargs["calibrate_method"] = zonnx.CalibrationMethod.MinMax
    zonnx.quantize_static(
        zoo.get("resnet18-random"), out, ListReader(zoo.sample_inputs("resnet18-random", 2)), **kwargs
    )
    return out


# -- item 11: low NPU coverage is said, with the cause and the fix; strict refuses it ---------------------
def test_u8_model_on_dpu_warns_with_the_fix(r18_u8: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        compiled = compile_model(r18_u8, "dpu-b4096")
    assert compiled.partition.npu_nodes == 0
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "only 0 of 220 nodes" in warning and "is uint8" in warning
    assert "--target dpu-b4096" in warning and "power-of-two" in warning
    assert compiled.partition.advice  # kept in the compiled model's partition for cache hits
    with pytest.raises(LowCoverageError, match="strict"):
        compile_model(r18_u8, "dpu-b4096", strict=True)


def test_session_strict_option_and_cache_hit_warn(
    r18_u8: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    opts = {"cache_dir": str(tmp_path / "cache")}
    with pytest.raises(LowCoverageError):
        InferenceSession(r18_u8, providers=NPU, provider_options=[{**opts, "strict": "1"}, {}])
    InferenceSession(r18_u8, providers=NPU, provider_options=[opts, {}])  # fills the cache
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        sess = InferenceSession(r18_u8, providers=NPU, provider_options=[opts, {}])
    assert sess.from_cache and any("is uint8" in r.getMessage() for r in caplog.records)
    x = zoo.sample_inputs("resnet18-random", 1)[0]
    ref = _fake_quant(r18_u8, x)
    np.testing.assert_allclose(sess.run(None, x)[0], ref, atol=1e-5)


def test_compiled_model_refuses_an_explicit_other_target(r18_zhouyi: Path, tmp_path: Path) -> None:
    out = compile_model(r18_zhouyi, "zhouyi-x2").save(tmp_path / "c.onnx")
    # "dpu-b4096" is also the default value: given explicitly it must still be checked
    with pytest.raises(OptionError, match="compiled for 'zhouyi-x2'"):
        InferenceSession(out, providers=NPU, provider_options=[{"target": "dpu-b4096"}, {}])
    sess = InferenceSession(out, providers=NPU)
    assert sess.partition is not None and sess.partition.target == "zhouyi-x2"


# -- item 12: quantizing for a target gives what its compiler takes -------------------------------------
def test_zhouyi_resnet_is_one_subgraph(r18_zhouyi: Path) -> None:
    compiled = compile_model(r18_zhouyi, "zhouyi-x2")
    part = compiled.partition
    assert part.num_subgraphs == 1 and part.npu_ops == part.total_ops == 49 and part.mac_share == 1.0
    x = zoo.sample_inputs("resnet18-random", 1)[0]
    fake = _fake_quant(r18_zhouyi, x)
    npu = InferenceSession(compiled.model, providers=NPU).run(None, x)[0]
    assert npu.argmax() == fake.argmax() and np.abs(npu - fake).max() < 0.1


def _landmark_net(path: Path) -> Path:
    import torch

    torch.manual_seed(0)

    def block(i: int, o: int, s: int = 1) -> list[torch.nn.Module]:
        return [torch.nn.Conv2d(i, o, 3, s, 1), torch.nn.BatchNorm2d(o), torch.nn.PReLU(o)]

    net = torch.nn.Sequential(
        *block(3, 16, 2),
        *block(16, 16),
        *block(16, 32, 2),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 8 * 8, 10),
    ).eval()
    torch.onnx.export(
        net, torch.randn(1, 3, 32, 32), str(path), input_names=["x"], opset_version=17, dynamo=False
    )
    return path


@pytest.mark.parametrize("target", ["zhouyi-x2", "bm1684x"])
def test_prelu_net_runs_on_the_npu(tmp_path: Path, target: str) -> None:
    src = _landmark_net(tmp_path / "landmark.onnx")
    feeds = [{"x": np.random.default_rng(i).normal(size=(1, 3, 32, 32)).astype(np.float32)} for i in range(2)]
    out = tmp_path / "q.onnx"
    zonnx.quantize_static(src, out, ListReader(feeds), **target_quantize_kwargs(target))
    model = onnx.load(out)
    producers = {o: n for n in model.graph.node for o in n.output}
    prelus = [n for n in model.graph.node if n.op_type == "PRelu"]
    assert len(prelus) == 3
    assert all(producers[n.input[1]].op_type == "DequantizeLinear" for n in prelus)  # slopes quantized
    used = {i for n in model.graph.node for i in n.input}
    assert all(t.name in used for t in model.graph.initializer)  # the float slopes are gone
    compiled = compile_model(out, target)
    # before: every PRelu on the CPU; the Gemm after PRelu -> Flatten read a float tensor
    assert compiled.partition.num_subgraphs == 1 and compiled.partition.mac_share == 1.0
    assert all(compiled.partition.subgraph_of(n.name) for n in prelus)
    kinds = [op.kind for prog in compiled.programs for op in prog.ops]
    assert kinds.count("prelu") == 3
    fake = _fake_quant(out, feeds[0])
    outs = [
        InferenceSession(compiled.model, providers=NPU, provider_options=[{"executor": ex}, {}]).run(
            None, feeds[0]
        )[0]
        for ex in ("ort", "reference")
    ]
    np.testing.assert_array_equal(outs[0], outs[1])  # the ORT lowering is the reference, bit for bit
    if target == "bm1684x":  # float-scale requant matches fake-quant here exactly
        np.testing.assert_array_equal(outs[0], fake)
    else:
        assert np.abs(outs[0] - fake).max() <= 2 * np.abs(fake).max() / 127


# -- item 14: small groups are judged by cost ---------------------------------------------------------
def test_min_macs_keeps_costly_small_groups(tmp_path: Path) -> None:
    feeds = zoo.sample_inputs("digits_cnn", 4)
    q = quantize(zoo.get("digits_cnn"), tmp_path / "fix.onnx", feeds, "fix")
    model = load_model(q)
    cap = propose(model, "dpu-b4096")
    by_ops = partition(model, cap, min_nodes=50, min_macs=0)  # 0: op count alone decides
    assert by_ops.num_subgraphs == 0 and by_ops.npu_macs == 0
    by_cost = partition(model, cap, min_nodes=50, min_macs=300_000)  # the 15-op group has 366,592 MACs
    assert by_cost.num_subgraphs == 1 and by_cost.npu_macs == by_cost.total_macs == 366_592
    too_small = partition(model, cap, min_nodes=50, min_macs=400_000)
    assert too_small.num_subgraphs == 0
    reason = next(v for n, v in too_small.cpu_nodes.items() if too_small.rules[n] == "min_nodes")
    assert "366,592 MACs" in reason and "400,000 MACs" in reason


# -- item 10 and 16: If bodies keep their initializers; lowered graphs carry no unused ones; ORT is quiet --
def _if_model(path: Path) -> Path:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1,3,16,16] x, bool[1] c) => (float[1,8,16,16] y) {
      a = Conv <pads=[1,1,1,1]> (x, W1, B1)
      r = Relu (a)
      b = Conv <pads=[1,1,1,1]> (r, W2, B2)
      r2 = Relu (b)
      y = If (c) <then_branch = t () => (float[1,8,16,16] yt) { yt = Add (r2, K) },
                  else_branch = e () => (float[1,8,16,16] ye) { ye = Mul (r2, K) }>
    }
    """
    model = onnx.parser.parse_model(text)
    rng = np.random.default_rng(0)
    for name, shape in [
        ("W1", (8, 3, 3, 3)),
        ("B1", (8,)),
        ("W2", (8, 8, 3, 3)),
        ("B2", (8,)),
        ("K", (1, 8, 1, 1)),
    ]:
        model.graph.initializer.append(nh.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name))
    onnx.save(model, path)
    return path


def test_if_model_compiles_to_a_loadable_model(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = _if_model(tmp_path / "if.onnx")
    rng = np.random.default_rng(1)
    feeds = [
        {"x": rng.normal(size=(1, 3, 16, 16)).astype(np.float32), "c": np.array([i % 2 == 0])}
        for i in range(4)
    ]
    q = tmp_path / "if_q.onnx"
    with caplog.at_level(logging.WARNING):
        zonnx.quantize_static(src, q, ListReader(feeds), **target_quantize_kwargs("dpu-b4096"))
    assert any("If" in r.getMessage() and "not quantized" in r.getMessage() for r in caplog.records)
    compiled = compile_model(q, "dpu-b4096")
    assert compiled.partition.num_subgraphs == 1
    names = {t.name for t in compiled.model.graph.initializer}
    assert "K" in names  # read only inside the branches
    path = compiled.save(tmp_path / "if_c.onnx")
    sess = InferenceSession(path, providers=NPU)
    fake = ort_session(q, optimize=True)
    for f in feeds[:2]:
        np.testing.assert_allclose(sess.run(None, f)[0], fake.run(None, f)[0], atol=1e-6)
    assert sess.get_session_options().log_severity_level == 3  # ORT's warnings are not printed


def test_lowered_graph_has_no_unused_initializers(r18_zhouyi: Path) -> None:
    compiled = compile_model(r18_zhouyi, "zhouyi-x2").model
    compiled.graph.initializer.append(nh.from_array(np.zeros(3, np.float32), "left_over"))
    low = lower_npu_nodes(compiled, lower_program, opset=17)
    used = {i for n in low.graph.node for i in n.input}
    assert [t.name for t in low.graph.initializer if t.name not in used] == []


# -- item 13: compile --input-shape fixes dims and folds the shape arithmetic -----------------------
def test_compile_input_shape_folds_shape_arithmetic(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.fc = torch.nn.Linear(8 * 8 * 8, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.conv(x))
            return self.fc(y.reshape(y.shape[0], -1))

    src = tmp_path / "dyn.onnx"
    torch.manual_seed(0)
    torch.onnx.export(Net().eval(), torch.randn(1, 3, 8, 8), str(src), input_names=["x"], opset_version=17,
                      dynamic_axes={"x": {0: "N"}}, dynamo=False)  # fmt: skip
    feeds = [{"x": np.random.default_rng(i).normal(size=(1, 3, 8, 8)).astype(np.float32)} for i in range(2)]
    q = tmp_path / "dyn_q.onnx"
    zonnx.quantize_static(src, q, ListReader(feeds), **target_quantize_kwargs("zhouyi-x2"))
    with caplog.at_level(logging.WARNING):
        loose = compile_model(q, "zhouyi-x2", min_nodes=1)
    assert any(
        "dynamic input dims" in r.getMessage() and "--input-shape" in r.getMessage() for r in caplog.records
    )
    fixed = compile_model(q, "zhouyi-x2", min_nodes=1, input_shapes={"x": (1, 3, 8, 8)})
    assert "Shape" not in {n.op_type for n in fixed.model.graph.node}  # the shape arithmetic is folded
    assert (
        loose.partition.npu_macs == 13_824
        and fixed.partition.npu_macs == fixed.partition.total_macs == 18_944
    )


# -- item 19: compile's output fits a terminal ------------------------------------------------------
def test_compile_cli_summary_is_short(r18_u8: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        app, ["compile", str(r18_u8), "-o", str(tmp_path / "c.onnx")], env={"COLUMNS": "120"}
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) < 20 and "boundary" in result.stdout
    assert "weight_DequantizeLinear" not in result.stdout  # weight dequantizers are counted, not listed
    verbose = runner.invoke(app, ["compile", str(r18_u8), "-o", str(tmp_path / "c.onnx"), "--verbose"])
    assert "weight_DequantizeLinear" in verbose.stdout
    strict = runner.invoke(app, ["compile", str(r18_u8), "-o", str(tmp_path / "c.onnx"), "--strict"])
    assert strict.exit_code != 0 and isinstance(strict.exception, LowCoverageError)


def test_provider_options_for_coverage_and_noise() -> None:
    from zonnx.backend.provider_options import parse_provider_options

    opts = parse_provider_options({"strict": "1", "input_shapes": "x:1,3,8,8;t:1", "min_macs": "0"})
    assert opts.strict and opts.min_macs == 0 and opts.ort_log_level == 3
    assert opts.shapes() == {"x": [1, 3, 8, 8], "t": [1]}
    assert opts.explicit == {"strict", "input_shapes", "min_macs"}
    assert "explicit" not in opts.as_strings()
    with pytest.raises(OptionError, match="input_shapes"):
        parse_provider_options({"input_shapes": "x=1,3"})
    with pytest.raises(OptionError, match="strict"):
        parse_provider_options({"strict": "maybe"})
