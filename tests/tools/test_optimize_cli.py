"""``zonnx optimize`` as a user runs it: real PP-OCR model, verification, bad input, no overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

from tests.helpers import assert_one_line_error, run_cli
from zonnx import zoo


@pytest.fixture(scope="module")
def cls_model() -> Path:
    return zoo.get("ppocr_cls")


def test_optimize_verify_on_ppocr_cls(tmp_path: Path, cls_model: Path) -> None:
    out = tmp_path / "cls.opt.onnx"
    proc = run_cli(
        "optimize", str(cls_model), str(out), "--verify", "--input-shape", "x:1,3,48,192", check=True
    )
    assert "fold-batchnorm" in proc.stdout and "verify: max error" in proc.stdout
    model = onnx.load(out)
    assert model.ir_version <= 13
    assert {i.domain: i.version for i in model.opset_import}[""] == 17
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert len(model.graph.node) < len(onnx.load(cls_model).graph.node)


def test_json_report(tmp_path: Path, cls_model: Path) -> None:
    proc = run_cli(
        "optimize", str(cls_model), str(tmp_path / "o.onnx"), "--json", "--passes", "clean", check=True
    )
    report = json.loads(proc.stdout)
    assert [p["name"] for p in report["passes"]][0] == "opset-upgrade"
    assert report["nodes_after"] <= report["nodes_before"]


def test_never_overwrites_the_input(tmp_path: Path, cls_model: Path) -> None:
    copy = tmp_path / "m.onnx"
    copy.write_bytes(cls_model.read_bytes())
    before = copy.read_bytes()
    assert_one_line_error(run_cli("optimize", str(copy), str(copy)), "--inplace")
    assert copy.read_bytes() == before
    run_cli("optimize", str(copy), "--inplace", "--passes", "dead-code", check=True)
    assert onnx.load(copy).ir_version <= 13


@pytest.mark.parametrize(
    ("setup", "fragment"),
    [
        (lambda d: (d / "missing.onnx", d / "o.onnx"), "no such file"),
        (lambda d: (d, d / "o.onnx"), "is a directory"),
        (lambda d: (_write(d / "bad.onnx", b"\x08\x07garbage" * 10), d / "o.onnx"), "not"),
    ],
)
def test_bad_inputs_give_one_line(tmp_path: Path, setup, fragment: str) -> None:
    src, out = setup(tmp_path)
    assert_one_line_error(run_cli("optimize", str(src), str(out)), fragment, str(src))
    assert not out.exists()


def test_truncated_model_and_unwritable_output(tmp_path: Path, cls_model: Path) -> None:
    cut = _write(tmp_path / "cut.onnx", cls_model.read_bytes()[:100_000])
    assert_one_line_error(run_cli("optimize", str(cut), str(tmp_path / "o.onnx")), "cut.onnx")
    target = tmp_path / "no_such_dir" / "o.onnx"
    assert_one_line_error(run_cli("optimize", str(cls_model), str(target)), "does not exist")
    assert not target.exists()


def test_option_errors(tmp_path: Path, cls_model: Path) -> None:
    out = str(tmp_path / "o.onnx")
    assert_one_line_error(
        run_cli("optimize", str(cls_model), out, "--skip", "fold-batchnrom"), "fold-batchnorm"
    )
    assert_one_line_error(run_cli("optimize", str(cls_model), out, "--opset", "11"), "--opset 11")
    assert_one_line_error(
        run_cli("optimize", str(cls_model), out, "--verify", "--input-shape", "x:1,3"), "x:1,3"
    )


def test_version_and_help() -> None:
    assert run_cli("--version", check=True).stdout.startswith("zonnx ")
    for sub in ("optimize", "inspect", "build"):
        assert "Usage" in run_cli(sub, "--help", check=True).stdout


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("flag", [["--inputs", "in.npz"]])
def test_verify_inputs_without_verify_are_refused(tmp_path: Path, cls_model: Path, flag: list[str]) -> None:
    """--inputs only feeds --verify (--input-shape also fixes the dims the passes see, so it stands alone)."""
    out = tmp_path / "o.onnx"
    proc = run_cli("optimize", str(cls_model), str(out), *flag)
    assert_one_line_error(
        proc, f"{flag[0]} only feed --verify's checks and do nothing without it: add --verify."
    )
    assert not out.exists()
