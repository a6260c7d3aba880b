"""``zonnx build build.toml``: stages, the content-hash cache, --from/--only, bad configs, failing stages."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.deploy.conftest import build, write_config
from zonnx.backend.targets import load_target
from zonnx.deploy import EXAMPLE, config_from_dict, load_build_config
from zonnx.deploy.cache import compiled_digest
from zonnx.errors import OptionError

ALL = ["source", "optimize", "quantize", "compile", "evaluate", "report"]


def test_cache_skips_unchanged_stages_and_a_target_edit_only_recompiles(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    first = build(path)
    assert first.executed == ALL and first.skipped == []
    out = tmp_path / "out"
    for name in ("model.onnx", "model_opt.onnx", "model_int8.onnx", "calib_stats.npz", "model_npu.onnx",
                 "report.json", "report.html"):  # fmt: skip
        assert (out / name).is_file(), name
    scores = first.results["evaluate"]["scores"]
    assert first.results["evaluate"]["samples"] == 100
    assert scores["float"] >= 0.95 and scores["npu"] >= scores["float"] - 0.02

    again = build(path)
    assert again.executed == ["report"] and again.skipped == ALL[:-1]

    # the same quantization rules with other hardware numbers: recompile, no recalibration
    mine = tmp_path / "my-dpu.toml"
    text = Path(load_target("dpu-b4096").path).read_text()
    clock = tomllib.loads(text)["hardware"]["clock_mhz"]
    mine.write_text(text.replace('name = "dpu-b4096"', 'name = "my-dpu"').replace(
        f"clock_mhz = {clock}", f"clock_mhz = {clock * 2}", 1))  # fmt: skip
    assert tomllib.loads(mine.read_text())["hardware"]["clock_mhz"] == clock * 2
    path.write_text(path.read_text().replace('target = "dpu-b4096"', 'target = "my-dpu.toml"'))
    retarget = build(path)
    assert "quantize" in retarget.skipped and "compile" in retarget.executed
    compiled = retarget.results["compile"]
    assert compiled["target"] == "my-dpu" and compiled["clock_mhz"] == 2 * clock
    # compute cycles take half the time; DDR traffic, at the same bandwidth, costs more cycles
    assert first.results["compile"]["npu_ms"] / 2 < compiled["npu_ms"] < first.results["compile"]["npu_ms"]

    # another quantization scheme: the quantize stage runs again
    path.write_text(path.read_text().replace('target = "my-dpu.toml"', 'target = "bm1684x"'))
    scheme = build(path)
    assert scheme.executed == ALL[2:] and scheme.results["quantize"]["format"] == "QDQ"

    assert build(path, from_stage="compile").executed == ["compile", "evaluate", "report"]
    assert build(path, only="evaluate").executed == ["evaluate"]
    report = json.loads((out / "report.json").read_text())
    assert report["stages"]["compile"]["target"] == "bm1684x" and report["error"] is None


def test_a_compile_edit_that_changes_no_program_recompiles_but_does_not_re_evaluate(tmp_path: Path) -> None:
    path = write_config(tmp_path, samples=50)
    first = build(path)
    out = tmp_path / "out"
    before = (out / "model_npu.onnx").read_bytes()
    # min_nodes 1 instead of 2: the digits CNN is one 37-node subgraph either way
    path.write_text(path.read_text().replace("[compile]", "[compile]\nmin_nodes = 1"))
    edited = build(path)
    assert edited.executed == ["compile", "report"] and "evaluate" in edited.skipped
    after = (out / "model_npu.onnx").read_bytes()
    assert after != before  # the partition report in the metadata records min_nodes 1 ...
    assert compiled_digest(out / "model_npu.onnx") == first_digest(before, tmp_path)  # ... nothing else
    assert edited.results["evaluate"] == first.results["evaluate"]
    # a real change of the compiled model still re-runs the evaluation
    path.write_text(path.read_text().replace('target = "dpu-b4096"', 'target = "zhouyi-x2"'))
    assert build(path).executed == ["quantize", "compile", "evaluate", "report"]


def first_digest(data: bytes, folder: Path) -> str:
    copy = folder / "before_npu.onnx"
    copy.write_bytes(data)
    return compiled_digest(copy)


def test_a_failing_stage_keeps_earlier_artifacts_and_writes_the_report(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    import numpy as np

    np.savez(bad, input=np.zeros((4, 8, 8), np.float32))  # rank 3: the model takes [N, 1, 8, 8]
    path = write_config(tmp_path)
    text = path.read_text().replace('dataset = "digits"', 'dataset = "bad.npz"').replace(
        "[evaluate]", '[evaluate]\nmetric = "cosine"')  # fmt: skip
    path.write_text(text)
    with pytest.raises(OptionError, match=r"bad.npz: input 'input' has shape \[1, 8, 8\]"):
        build(path)
    out = tmp_path / "out"
    assert (out / "model_npu.onnx").is_file() and not (out / "evaluate.json").exists()
    report = json.loads((out / "report.json").read_text())
    assert report["error"].startswith("stage evaluate failed") and "compile" in report["stages"]
    assert "stage evaluate failed" in (out / "report.html").read_text()


def test_input_shape_as_a_table_fixes_the_source_model(tmp_path: Path) -> None:
    import onnx

    from zonnx import zoo

    dims = lambda m: [d.dim_value or d.dim_param for d in m.graph.input[0].type.tensor_type.shape.dim]  # noqa: E731
    assert isinstance(dims(onnx.load(zoo.get("digits_cnn")))[0], str)  # the zoo model's batch is dynamic
    path = write_config(tmp_path)
    path.write_text(path.read_text().replace("[model]", "[model]\ninput_shape = {input = [1, 1, 8, 8]}"))
    run = build(path, only="source")
    assert run.executed == ["source"]
    assert dims(onnx.load(tmp_path / "out" / "model.onnx")) == [1, 1, 8, 8]


def test_bad_configs_say_what_to_fix(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"\[compile\] unknown key 'taget'. Did you mean 'target'\?"):
        config_from_dict({"model": {}, "compile": {"taget": "x"}}, tmp_path)
    with pytest.raises(OptionError, match=r"unknown section \[evaluat\]. Did you mean 'evaluate'\?"):
        config_from_dict({"model": {}, "evaluat": {}}, tmp_path)
    (tmp_path / "a.toml").write_text("[compile]\ntarget = 'bm1684x'\n")
    with pytest.raises(OptionError, match=r"a.toml: no \[model\] section"):
        load_build_config(tmp_path / "a.toml")
    with pytest.raises(OptionError, match="config file not found"):
        load_build_config(tmp_path / "none.toml")
    path = write_config(tmp_path / "b")
    path.write_text(path.read_text().replace('source = "digits_cnn"', 'source = "nope.onnx"'))
    with pytest.raises(OptionError, match=r"source .*nope.onnx: no such file"):
        build(path)
    with pytest.raises(OptionError, match=r"--from compil: no such stage. Did you mean 'compile'\?"):
        build(path, from_stage="compil")
    path = write_config(tmp_path / "d")
    path.write_text(path.read_text().replace("[model]", "[model]\ninput_shape = {input = [1, 0, 8, 8]}"))
    with pytest.raises(
        OptionError, match=r"\[model\] input_shape input = \[1, 0, 8, 8\]: give a list of positive"
    ):
        build(path)
    path = write_config(tmp_path / "c")
    path.write_text(path.read_text().replace("samples = 32", "samples = 32\nshards = 0"))
    with pytest.raises(OptionError, match=r"\[quantize\] shards = 0: give a whole number >= 1"):
        build(path)


def test_the_example_config_is_valid_and_documents_every_section(tmp_path: Path) -> None:
    (tmp_path / "build.toml").write_text(EXAMPLE)
    config = load_build_config(tmp_path / "build.toml")
    assert config.get("compile", "target") == "dpu-b4096" and config.get("evaluate", "metric") == "accuracy"
    assert config.out_dir == tmp_path / "out"
    assert all(
        f"[{s}]" in EXAMPLE for s in ("model", "optimize", "quantize", "compile", "evaluate", "report")
    )


def test_a_budgeted_build_tries_smooth_quant_unless_the_config_says_no(tmp_path: Path) -> None:
    """With ``accuracy_budget`` the quantize stage runs the search, which tries SmoothQuant; an explicit
    ``SmoothQuant = false`` in ``[quantize.extra_options]`` keeps it out of the search too, and so does
    ``BiasCorrection = false`` for the search's bias-correction trial."""
    path = write_config(tmp_path, samples=20)
    path.write_text(path.read_text().replace("samples = 32\n", "samples = 32\naccuracy_budget = 1.0\n", 1))
    tried = build(path).results["quantize"]["search"]
    assert "SmoothQuant" in (tmp_path / "out" / tried["config"]).read_text()
    path.write_text(path.read_text() + "[quantize.extra_options]\nSmoothQuant = false\nBiasCorrection = false\n")
    refused = (tmp_path / "out" / build(path).results["quantize"]["search"]["config"]).read_text()
    assert "SmoothQuant" not in refused and "bias correction" not in refused
