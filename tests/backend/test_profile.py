"""zonnx.backend.profile on real quantized and compiled zoo models: sums, hand-checked layers, targets, errors."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from tests.backend.partition_models import quantize
from tests.backend.test_tiling import user_target
from zonnx import zoo
from zonnx.backend.compile_api import compile_model
from zonnx.backend.profile import ProfileReport, profile_model, render_profile
from zonnx.errors import OptionError, UnsupportedModelError
from zonnx.zoo.digits import digits_data

DIGITS_MACS = 366_592


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("profile")
    x, _ = digits_data("calib")
    feeds = [{"input": x[i : i + 1]} for i in range(32)]
    paths = {f: quantize(zoo.get("digits_cnn"), d / f"{f}.onnx", feeds, f) for f in ("fix", "qdq_asym")}
    paths["compiled"] = compile_model(paths["fix"], "dpu-b4096").save(d / "compiled.onnx")
    return paths


@pytest.fixture(scope="module")
def resnet_dpu(tmp_path_factory: pytest.TempPathFactory) -> ProfileReport:
    """ResNet-18 in the FixNeuron form (4 calibration samples), compiled and profiled for dpu-b4096."""
    d = tmp_path_factory.mktemp("profile_resnet")
    path = quantize(
        zoo.get("resnet18-random"), d / "fix.onnx", zoo.sample_inputs("resnet18-random", 4, seed=1), "fix"
    )
    return profile_model(path, "dpu-b4096")


def _row(report: ProfileReport, name: str):
    return next(r for r in report.rows if r.name == name)


def test_compiled_model_rows_add_up(models: dict[str, Path]) -> None:
    report = profile_model(models["compiled"])
    assert report.engine.target == report.compiled_for == "dpu-b4096" and not report.compiled_here
    npu = report.npu_rows
    assert npu and all(r.cycles == max(r.compute_cycles, r.memory_cycles) for r in npu)
    assert all(r.bound == ("compute" if r.compute_cycles >= r.memory_cycles else "memory") for r in npu)
    t = report.totals
    assert t["cycles"] == sum(r.cycles for r in npu) and math.isclose(t["ms"], t["cycles"] / 300e3)
    assert t["macs_npu"] == DIGITS_MACS and t["macs_cpu"] == 0
    assert t["ddr_read"] == sum(r.plan.ddr_read for r in npu)
    assert t["ddr_read"] + t["ddr_write"] == t["weight_read"] + t["in_read"] + t["out_write"] + t["spill"]
    stem = _row(report, "/stem/stem.0/Conv")  # 1 -> 16 channels, 3x3 on 8x8: ceil(64/8) * 1 * 1 * 9 + 64
    assert stem.macs == 16 * 9 * 64 and stem.compute_cycles == 8 * 9 + 64 and stem.plan.n_tiles == 1
    assert stem.plan.in_read == 64 and stem.plan.weight_read == 16 * 9  # the program input, int8


def test_quantized_model_is_compiled_first(models: dict[str, Path]) -> None:
    report = profile_model(models["fix"])
    assert report.compiled_here and report.compiled_for == "dpu-b4096"
    assert any("is not compiled: compiled it for dpu-b4096 first" in n for n in report.notes)
    assert report.totals == profile_model(models["compiled"]).totals


def test_clock_and_target_overrides(models: dict[str, Path], tmp_path: Path) -> None:
    base = profile_model(models["compiled"])
    slow = profile_model(models["compiled"], clock_mhz=150)
    assert [r.compute_cycles for r in slow.npu_rows] == [r.compute_cycles for r in base.npu_rows]
    assert all(s.memory_cycles <= b.memory_cycles for s, b in zip(slow.npu_rows, base.npu_rows, strict=True))
    assert math.isclose(slow.totals["ms"], slow.totals["cycles"] / 150e3)
    assert any("clock 150 MHz given" in n for n in slow.notes)
    small = profile_model(models["compiled"], user_target(tmp_path, activation_buffer_bytes=1024))
    assert small.target_path.endswith(".toml") and small.engine.act_buffer == 1024
    assert small.totals["tiled_layers"] > base.totals["tiled_layers"] == 0
    assert (
        small.totals["ddr_read"] >= base.totals["ddr_read"] and small.totals["cycles"] > base.totals["cycles"]
    )
    other = profile_model(models["compiled"], "bm1684x")
    assert other.engine.target == "bm1684x" and other.engine.layer_group
    assert any(
        "compiled for dpu-b4096; profiled with the hardware numbers of bm1684x" in n for n in other.notes
    )
    assert other.totals["spill"] < base.totals["spill"]  # layer groups keep tensors on chip


def test_cpu_nodes_are_listed_with_macs_only(models: dict[str, Path]) -> None:
    report = profile_model(
        models["qdq_asym"], "bm1684x"
    )  # asymmetric activations: everything stays on the CPU
    assert report.rows and all(r.device == "cpu" and r.plan is None for r in report.rows)
    convs = [r for r in report.rows if r.kind == "Conv"]
    assert sorted(r.macs for r in convs) == [2048, 9216, 55296, 147456, 147456]
    t = report.totals
    assert t["macs_cpu"] == DIGITS_MACS and t["cycles"] == 0 and t["fps"] is None


def test_render_and_json(models: dict[str, Path]) -> None:
    report = profile_model(models["compiled"])
    buf = io.StringIO()
    render_profile(report, Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    assert "PE 8x16x16" in text and "activation buffer 256 KiB" in text and "tile HxWxC" in text
    assert "/stem/stem.0/Conv" in text and "8x8x16" in text and "NPU total:" in text
    assert (
        "assumed: 64 cycles of overhead per tile" in text and "assumed in the target file: clock_mhz" in text
    )
    data = json.loads(json.dumps(report.to_dict()))
    assert data["totals"]["cycles"] == report.totals["cycles"] and data["hardware"]["pe"] == [8, 16, 16]
    layer = data["layers"][0]
    assert {"tile", "n_tiles", "weights_resident", "ddr_read", "ddr_write", "bound", "cycles"} <= set(layer)


def test_errors(models: dict[str, Path]) -> None:
    with pytest.raises(UnsupportedModelError, match="not quantized"):
        profile_model(zoo.get("digits_cnn"))
    with pytest.raises(OptionError, match="--clock-mhz 0"):
        profile_model(models["compiled"], clock_mhz=0)
    with pytest.raises(OptionError, match="unknown target"):
        profile_model(models["compiled"], "dpu-b409")


def test_resnet18_on_dpu_b4096(resnet_dpu: ProfileReport) -> None:
    conv = _row(resnet_dpu, "/layers/layers.0/conv1/Conv")  # the 3x3 conv 64 -> 64 on 56 x 56 by hand
    assert conv.macs == 115_605_504 and conv.plan.tile == (35, 56, 64) and conv.compute_cycles == 56576
    assert (
        conv.plan.spill_read == (36 + 22) * 64 * 56
    )  # an intermediate tensor on a target without layer groups
    t = resnet_dpu.totals
    assert t["macs_npu"] == 1_814_073_344 and t["macs_cpu"] == 0
    assert t["weight_read"] >= 11_000_000  # every weight is read at least once
    fc = _row(resnet_dpu, "/fc/Gemm")
    assert fc.bound == "memory" and fc.memory_cycles == math.ceil((512_000 + 512 + 1000) / 64)
    assert 100 < t["fps"] < 1000


def test_cpu_macs_fold_shape_arithmetic(tmp_path: Path) -> None:
    """A CPU MatMul behind a Reshape whose target shape is computed (Shape -> Slice -> ReduceProd) gets
    its MACs counted in a model ORT quantized (the shape arithmetic folded once the batch is fixed, as
    ``zonnx inspect`` counts)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Slice", ["s", "one", "three"], ["tail"]),
        helper.make_node("ReduceProd", ["tail"], ["width"], keepdims=1),
        helper.make_node("Concat", ["n", "width"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([3], np.int64), "three"),
        numpy_helper.from_array(rng.standard_normal((64, 10)).astype(np.float32), "w"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 8, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), src)
    feeds = [{"x": rng.standard_normal((1, 8, 8)).astype(np.float32)} for _ in range(4)]
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(feeds)

        def get_next(self) -> dict | None:
            return next(self.items, None)

    qpath = tmp_path / "q.onnx"
    quantize_static(str(src), str(qpath), Reader())  # ORT's quantizer keeps the shape arithmetic
    report = profile_model(qpath, "bm1684x")
    matmul = [r for r in report.rows if r.kind == "MatMul"]
    assert [r.macs for r in matmul] == [64 * 10]
