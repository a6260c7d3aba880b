"""``zonnx inspect`` as a user runs it: tables, JSON, input shapes and one-line errors on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import assert_one_line_error, run_cli
from zonnx import zoo
from zonnx.inspection import inspect_model


@pytest.fixture(scope="module")
def cls_model() -> Path:
    return zoo.get("ppocr_cls")


def test_plain_tables_when_piped(cls_model: Path) -> None:
    proc = run_cli("inspect", str(cls_model), "--input-shape", "x:1,3,48,192", check=True)
    out = proc.stdout
    assert out.isascii() and "\x1b" not in out  # piped: no colors, no box drawing
    assert out.splitlines()[0] == f"model: {cls_model}"
    assert "MACs: 16,315,376 (16.3 M)" in out  # checked against ORT shapes in tests/inspection
    for title in ("Inputs and outputs", "Ops (by count)", "MACs by op type", "Parameters by dtype"):
        assert title in out
    assert "save_infer_model/scale_0.tmp_1" in out and proc.stderr == ""


def test_json_matches_the_api(cls_model: Path) -> None:
    proc = run_cli("inspect", str(cls_model), "--json", "--batch", "2", check=True)
    data = json.loads(proc.stdout)
    assert data == json.loads(inspect_model(cls_model, batch=2).to_json())
    assert data["macs"]["batch"] == 2 and data["macs"]["complete"] is False
    assert data["op_histogram"]["Conv"] == 53 and data["quantization"]["format"] == "none"


def test_bad_input_gives_one_line(tmp_path: Path, cls_model: Path) -> None:
    assert_one_line_error(run_cli("inspect", str(tmp_path / "missing.onnx")), "missing.onnx", "no such file")
    assert_one_line_error(run_cli("inspect", str(tmp_path)), "is a directory")
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n")
    assert_one_line_error(run_cli("inspect", str(text)), "notes.onnx", "not")
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(cls_model.read_bytes()[:100_000])
    assert_one_line_error(run_cli("inspect", str(cut)), "cut.onnx", "truncated")
    assert_one_line_error(
        run_cli("inspect", str(cls_model), "--input-shape", "xx:1,3,48,192"), "'xx'", "Did you mean 'x'"
    )
