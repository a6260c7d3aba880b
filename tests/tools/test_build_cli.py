"""``zonnx build``, the main job, as a user runs it on the default model and on a file."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from tests.helpers import assert_one_line_error, run_cli
from zonnx import zoo


def test_build_default_model(tmp_path: Path) -> None:
    proc = run_cli("build", "-o", str(tmp_path), check=True)
    report = json.loads((tmp_path / "report.json").read_text())
    stages = ["load", "optimize", "inspect", "quantize", "compile", "host", "npu", "evaluate"]
    assert list(report["stages"]) == stages
    host = report["stages"]["host"]  # the build's own process (under qemu-user it runs natively)
    assert set(host) == {"isa", "u8s8_exact", "integer_path"} and host["integer_path"] in ("u8s8", "u8u8")
    assert host["u8s8_exact"] or host["integer_path"] == "u8u8"
    assert (
        f"host: integer ISA {host['isa']}" in proc.stdout and f"path: {host['integer_path']}" in proc.stdout
    )
    evaluation = report["stages"]["evaluate"]
    assert evaluation["samples"] == 450
    assert evaluation["float_top1"] >= 0.97
    assert evaluation["optimized_top1"] == evaluation["float_top1"]
    assert report["stages"]["optimize"]["max_relative_error"] <= 1e-5
    optimized = onnx.load(tmp_path / "digits_cnn.opt.onnx")
    assert not [n for n in optimized.graph.node if n.op_type == "BatchNormalization"]
    assert "folded Conv+BatchNormalization" in proc.stdout and "MACs" in proc.stdout
    npu = report["stages"]["npu"]
    assert npu["npu_top1"] >= npu["float_top1"] - 0.005  # issue 5: NPU within 0.5 points of float
    assert report["stages"]["quantize"]["format"] == "FixNeuron"
    assert "dpu-b4096: 1 NPU subgraph(s)" in proc.stdout
    assert (tmp_path / "digits_cnn.dpu-b4096.q.onnx").is_file()
    # the closing summary (README's first command) and the self-contained page
    summary = proc.stdout.rsplit("summary", 1)[1]
    top1 = f"float {npu['float_top1']:.4f} / int8 {npu['quantized_top1']:.4f} / NPU {npu['npu_top1']:.4f}"
    assert top1 in summary and "100.0% of the model's known MACs on the NPU" in summary
    assert "estimated NPU latency: 0.0" in summary and f"report: {tmp_path / 'report.html'}" in summary
    assert "plotly" in (tmp_path / "report.html").read_text()


@pytest.mark.parametrize("target", ["bm1684x", "zhouyi-x2"])
def test_build_for_a_float_scale_target(tmp_path: Path, target: str) -> None:
    """The NPU gives the fake-quant model's top-1 exactly, on every CPU (issue: exact on every host)."""
    run_cli("build", "--target", target, "-o", str(tmp_path), check=True)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["stages"]["quantize"]["format"] == "QDQ"
    npu = report["stages"]["npu"]
    assert npu["npu_top1"] == npu["quantized_top1"], (npu, report["stages"]["host"])
    assert npu["npu_top1"] >= npu["float_top1"] - 0.005


def test_build_a_file(tmp_path: Path) -> None:
    src = tmp_path / "cls.onnx"
    src.write_bytes(zoo.get("ppocr_cls").read_bytes())
    run_cli("build", str(src), "-o", str(tmp_path / "out"), "--no-verify", "--no-deploy", check=True)
    assert (tmp_path / "out" / "cls.opt.onnx").is_file()
    proc = run_cli("build", str(src), "-o", str(tmp_path / "out2"), "--no-verify")
    assert_one_line_error(proc, "--calib")
    assert src.read_bytes() == zoo.get("ppocr_cls").read_bytes()


def test_build_bad_model(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("build", str(tmp_path / "nope.onnx"), "-o", str(tmp_path)), "no such file")
    assert not (tmp_path / "report.json").exists()


def test_build_with_a_target_file_names_outputs_by_the_targets_name(tmp_path: Path) -> None:
    """``--target path/to/x.toml``: files carry the target's own name, not its path (issue 17, item 10)."""
    from zonnx.backend.targets import load_target

    src = load_target("zhouyi-x2").path
    mine = tmp_path / "cfg" / "my-npu.toml"
    mine.parent.mkdir()
    mine.write_bytes(Path(src).read_bytes())
    out = tmp_path / "out"
    run_cli("build", "--target", str(mine), "-o", str(out), check=True)
    name = load_target(str(mine)).name
    assert (out / f"digits_cnn.{name}.q.onnx").is_file()
    assert (out / f"digits_cnn.{name}.q.{name}.onnx").is_file()
    assert not [p for p in out.rglob("*") if ".toml" in p.name]


def test_failed_build_leaves_no_folder_and_hints_real_flags(tmp_path: Path) -> None:
    """A build that fails (no calibration data for a file outside the zoo) leaves nothing behind, and the
    flag its message suggests exists (issue 17, item 9)."""
    out = tmp_path / "out"
    proc = run_cli("build", str(zoo.get("digits_cnn")), "-o", str(out), "--no-verify")
    assert_one_line_error(proc, "--calib", "--no-deploy")
    assert not out.exists()
    help_text = run_cli("build", "--help", check=True).stdout
    assert "--no-deploy" in help_text and "--calib" in help_text
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine.txt").write_text("x")
    assert_one_line_error(
        run_cli("build", str(zoo.get("digits_cnn")), "-o", str(kept), "--no-verify"), "--calib"
    )
    assert [p.name for p in kept.iterdir()] == ["mine.txt"]


def test_build_a_users_model_evaluates_its_npu(tmp_path: Path) -> None:
    """Issue 11, item 17: a model outside the zoo gets its NPU (and fake-quant) outputs scored against float."""
    import numpy as np

    from zonnx.zoo.digits import digits_data

    src = tmp_path / "mine.onnx"
    src.write_bytes(zoo.get("digits_cnn").read_bytes())
    x, _ = digits_data("calib")
    np.savez(tmp_path / "calib.npz", input=x[:24])
    out = tmp_path / "out"
    proc = run_cli(
        "build", str(src), "--calib", str(tmp_path / "calib.npz"), "-o", str(out), "--no-verify", check=True
    )
    npu = json.loads((out / "report.json").read_text())["stages"]["npu"]
    assert npu["samples"] == 16 and npu["npu_cosine"] >= 0.99 and npu["quantized_cosine"] >= 0.99
    assert npu["min_npu_cosine"] <= npu["npu_cosine"]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("npu: "))
    assert "npu_cosine=0.99" in line or "npu_cosine=1.0" in line
    assert "accuracy: cosine to float, float 1.0000" in proc.stdout and (out / "report.html").is_file()


def test_build_init_and_config_errors(tmp_path: Path) -> None:
    run_cli("build", "--init", cwd=str(tmp_path), check=True)
    text = (tmp_path / "build.toml").read_text()
    assert "[quantize]" in text and 'target = "dpu-b4096"' in text
    assert_one_line_error(run_cli("build", "--init", cwd=str(tmp_path)), "build.toml: already exists")
    (tmp_path / "bad.toml").write_text('[model]\nsource = "digits_cnn"\n[compile]\ntarget_name = "x"\n')
    assert_one_line_error(
        run_cli("build", str(tmp_path / "bad.toml")), "unknown key 'target_name'", "'target'"
    )
    assert_one_line_error(run_cli("build", "--only", "compile"), "go with a build config")


def test_old_zoo_name_gives_the_new_one(tmp_path: Path) -> None:
    proc = run_cli("build", "resnet18", "-o", str(tmp_path / "out"), "--no-deploy")  # old name
    assert_one_line_error(proc, "zoo model 'resnet18' is now 'resnet18-random'")  # old name
