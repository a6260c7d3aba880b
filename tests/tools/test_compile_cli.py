"""``zonnx compile``: writes the compiled model, prints the partition, one-line errors with exit code 2."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.backend.partition_models import quantize
from tests.helpers import assert_one_line_error, run_cli
from zonnx import zoo
from zonnx.zoo.digits import digits_data


@pytest.fixture(scope="module")
def qdq(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    x, _ = digits_data("calib")
    feeds = [{"input": x[i : i + 1]} for i in range(32)]
    d = tmp_path_factory.mktemp("cli")
    return {f: quantize(zoo.get("digits_cnn"), d / f"{f}.onnx", feeds, f) for f in ("qdq", "qdq_asym")}


def test_compile_prints_partition(qdq: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "compiled.onnx"
    proc = run_cli("compile", str(qdq["qdq"]), "--target", "bm1684x", "-o", str(out), check=True)
    assert "bm1684x: 1 NPU subgraph(s)" in proc.stdout and "100.0% of 366,592 MACs on the NPU" in proc.stdout
    assert f"wrote {out}" in proc.stdout.replace("\n", "")
    model = onnx.load(out)
    assert any(n.op_type == "NpuSubgraph" and n.domain == "com.zonnx" for n in model.graph.node)


def test_compile_lists_cpu_nodes_with_rules(qdq: dict[str, Path], tmp_path: Path) -> None:
    proc = run_cli(
        "compile", str(qdq["qdq_asym"]), "--target", "bm1684x", "-o", str(tmp_path / "c.onnx"), check=True
    )
    assert "CPU nodes by rule" in proc.stdout and "zero_point" in proc.stdout


def test_compile_bad_input(qdq: dict[str, Path], tmp_path: Path) -> None:
    proc = run_cli("compile", str(qdq["qdq"]), "--target", "dpu-b409", "-o", str(tmp_path / "c.onnx"))
    assert_one_line_error(proc, "unknown target 'dpu-b409'", "Known targets")
    proc = run_cli("compile", str(zoo.get("digits_cnn")), "-o", str(tmp_path / "c.onnx"))
    assert_one_line_error(proc, "not quantized", "zonnx quantize")
    proc = run_cli("compile", str(tmp_path / "missing.onnx"))
    assert_one_line_error(proc, "no such file")
