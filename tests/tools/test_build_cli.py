"""``zonnx build``, the main job, as a user runs it on the default model and on a file."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from tests.helpers import assert_one_line_error, run_cli
from zonnx import zoo


def test_build_default_model(tmp_path: Path) -> None:
    proc = run_cli("build", "-o", str(tmp_path), check=True)
    report = json.loads((tmp_path / "report.json").read_text())
    assert list(report["stages"]) == ["load", "optimize", "inspect", "evaluate"]
    evaluation = report["stages"]["evaluate"]
    assert evaluation["samples"] == 450
    assert evaluation["float_top1"] >= 0.97
    assert evaluation["optimized_top1"] == evaluation["float_top1"]
    assert report["stages"]["optimize"]["max_relative_error"] <= 1e-5
    optimized = onnx.load(tmp_path / "digits_cnn.opt.onnx")
    assert not [n for n in optimized.graph.node if n.op_type == "BatchNormalization"]
    assert "folded Conv+BatchNormalization" in proc.stdout and "MACs" in proc.stdout


def test_build_a_file(tmp_path: Path) -> None:
    src = tmp_path / "cls.onnx"
    src.write_bytes(zoo.get("ppocr_cls").read_bytes())
    run_cli("build", str(src), "-o", str(tmp_path / "out"), "--no-verify", check=True)
    assert (tmp_path / "out" / "cls.opt.onnx").is_file()
    assert src.read_bytes() == zoo.get("ppocr_cls").read_bytes()


def test_build_bad_model(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("build", str(tmp_path / "nope.onnx"), "-o", str(tmp_path)), "no such file")
    assert not (tmp_path / "report.json").exists()
