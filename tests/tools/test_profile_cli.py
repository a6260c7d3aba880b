"""``zonnx profile``: per-layer table, JSON, a quantized model compiled first, one-line errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.backend.partition_models import quantize
from tests.helpers import assert_one_line_error, run_cli
from zonnx import zoo
from zonnx.backend.compile_api import compile_model
from zonnx.zoo.digits import digits_data


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    x, _ = digits_data("calib")
    feeds = [{"input": x[i : i + 1]} for i in range(32)]
    d = tmp_path_factory.mktemp("profile_cli")
    fix = quantize(zoo.get("digits_cnn"), d / "fix.onnx", feeds, "fix")
    return {"fix": fix, "compiled": compile_model(fix, "dpu-b4096").save(d / "compiled.onnx")}


def test_profile_prints_layers_and_totals(models: dict[str, Path]) -> None:
    proc = run_cli("profile", str(models["compiled"]), check=True)
    out = proc.stdout
    assert "on dpu-b4096: 300 MHz, PE 8x16x16" in out
    stem = next(line for line in out.splitlines() if "/stem/stem.0/Conv" in line).split()
    assert stem[2:6] == ["conv", "npu", "9,216", "136"] and "8x8x16" in stem and stem[-1] == "compute"
    assert "NPU total:" in out and "MACs: 366,592 on the NPU, 0 on the CPU" in out
    assert "assumed: layer_group = false" in out


def test_profile_json_with_clock_and_a_quantized_model(models: dict[str, Path]) -> None:
    proc = run_cli(
        "profile", str(models["fix"]), "--json", "--clock-mhz", "150", "-t", "dpu-b4096", check=True
    )
    data = json.loads(proc.stdout)
    assert data["compiled_here"] and data["hardware"]["clock_mhz"] == 150.0
    assert any("compiled it for dpu-b4096 first" in n for n in data["notes"])
    t = data["totals"]
    assert t["macs_npu"] == 366_592 and abs(t["ms"] - t["cycles"] / 150e3) < 1e-12
    assert sum(layer["cycles"] for layer in data["layers"]) == t["cycles"]


def test_profile_bad_input(models: dict[str, Path], tmp_path: Path) -> None:
    proc = run_cli("profile", str(models["compiled"]), "--target", "dpu-b409")
    assert_one_line_error(proc, "unknown target 'dpu-b409'", "Known targets")
    proc = run_cli("profile", str(models["compiled"]), "--clock-mhz", "0")
    assert_one_line_error(proc, "--clock-mhz 0", "positive")
    proc = run_cli("profile", str(tmp_path / "missing.onnx"))
    assert_one_line_error(proc, "no such file")
