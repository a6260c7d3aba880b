"""Work as Ray tasks on a real local Ray (2 CPUs) gives exactly the in-process numbers: evaluation
batches, calibration shards and the budget search's sensitivity candidates.

One local Ray serves the whole module (its start is the slow part); builds and calls made while it
runs use it and leave it running.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.deploy.conftest import build
from tests.quantization.calibration.test_shards import assert_same_stats, initializers
from zonnx import zoo
from zonnx.build_npu import target_quantize_kwargs
from zonnx.deploy.evaluate import RayExecutor, run_batch
from zonnx.quantization.api import build_config, quantize_static
from zonnx.quantization.calibration.collector import collect
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.calibration.shards import collect_sharded
from zonnx.quantization.observe import float_activations
from zonnx.quantization.search.executor import LocalExecutor
from zonnx.quantization.search.run import quantize_with_budget
from zonnx.zoo.digits import digits_data


def test_a_ray_address_that_does_not_answer_is_refused_at_once() -> None:
    """Runs first: a Ray already started here would be used as it is, unchecked."""
    import socket

    from zonnx.errors import OptionError

    with socket.socket() as s:  # a free port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(
        OptionError, match=rf"ray_address ray://127.0.0.1:{port}: no Ray answers there.*backend = \"local\""
    ):
        RayExecutor(f"ray://127.0.0.1:{port}")


@pytest.fixture(scope="module")
def ray_executor() -> Iterator[RayExecutor]:
    executor = RayExecutor()
    assert executor.started
    yield executor
    executor.close()


def test_ray_evaluation_matches_in_process(digits_build, ray_executor) -> None:
    x, _ = digits_data("test")
    path, local = digits_build
    out = local.out_dir
    executor = ray_executor
    ray_run = build(path, only="evaluate", backend="ray")
    assert executor.ray.is_initialized()
    tasks = [
        (str(out / "model_npu.onnx"), [{"input": x[i : i + 1]} for i in range(j, j + 5)]) for j in (0, 5, 10)
    ]
    remote = list(executor.map(run_batch, tasks))
    assert ray_run.executed == ["evaluate"]
    assert ray_run.results["evaluate"]["backend"] == "ray"
    assert ray_run.results["evaluate"]["scores"] == local.results["evaluate"]["scores"]
    assert json.loads((out / "evaluate.json").read_text())["scores"] == local.results["evaluate"]["scores"]
    # the raw NPU outputs too, task by task
    here = list(LocalExecutor().map(run_batch, tasks))
    assert len(remote) == 3
    for a, b in zip(remote, here, strict=True):
        for oa, ob in zip(a, b, strict=True):
            np.testing.assert_array_equal(oa[0], ob[0])


def test_sharded_calibration_on_ray_matches_in_process(ray_executor) -> None:
    """Statistics of a zoo CNN from 2 Ray shards, and the scales quantize_static writes from them."""
    model = onnx.shape_inference.infer_shapes(onnx.load(zoo.get("mobilenetv2-random")))
    names, feeds = float_activations(model), zoo.sample_inputs("mobilenetv2-random", 4)
    kw = {"methods_needed": ("percentile", "nstd")}
    one = collect(model, names, ListReader(feeds), **kw)
    merged = collect_sharded(model, names, ListReader(feeds), executor=ray_executor, shards=2, **kw)
    assert_same_stats(one, merged)
    assert merged[names[-1]].batches == 4

    digits, few = zoo.get("digits_cnn"), zoo.sample_inputs("digits_cnn", 8)
    extra = {"CalibShards": 2, "CalibHistogramSample": 1024}
    here = quantize_static(digits, None, ListReader(few), calibrate_method="Percentile")
    there = quantize_static(digits, None, ListReader(few), calibrate_method="Percentile", extra_options=extra,
                            calibration_executor=ray_executor)  # fmt: skip
    a, b = initializers(here.model), initializers(there.model)
    assert a.keys() == b.keys() and sum(n.endswith("_scale") for n in a) > 5
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_budget_search_sensitivity_on_ray_matches_in_process(ray_executor, tmp_path: Path) -> None:
    """A small search (3 layers measured one by one) scores every candidate as in process."""
    path, feeds = zoo.get("digits_cnn"), zoo.sample_inputs("digits_cnn", 16)
    cfg = build_config(**target_quantize_kwargs("zhouyi-x2"))
    runs = {}
    for tag, executor in (("local", LocalExecutor()), ("ray", ray_executor)):
        _, search, _ = quantize_with_budget(path, tmp_path / f"{tag}.onnx", ListReader(feeds), cfg, budget=0.0,
                                            metric="cosine", measure_layers=3, executor=executor)  # fmt: skip
        runs[tag] = search
    local, remote = runs["local"], runs["ray"]
    assert len(local.sensitivity) == 3
    assert [(n, c.score, c.npu_mac_share) for n, c in remote.sensitivity.items()] == [
        (n, c.score, c.npu_mac_share) for n, c in local.sensitivity.items()
    ]
    assert all(c.score < 1.0 for c in local.sensitivity.values())
    assert (remote.chosen.overrides, remote.chosen.score) == (local.chosen.overrides, local.chosen.score)


def test_budget_search_trials_on_ray_match_two_probes_in_process(ray_executor, tmp_path: Path) -> None:
    """On Ray (2 CPUs) each round scores 2 prefixes at once; in process with trials_per_round=2, the same."""
    path, feeds = zoo.get("digits_cnn"), zoo.sample_inputs("digits_cnn", 32)
    cfg = build_config(per_channel=True, extra_options={"QuantPlacement": "kernels"})
    kw = dict(budget=0.002, metric="cosine", eval_feeds=zoo.sample_inputs("digits_cnn", 16, seed=5))
    assert ray_executor.workers == 2
    remote = quantize_with_budget(path, tmp_path / "ray.onnx", ListReader(feeds), cfg, executor=ray_executor,
                                  **kw)[1]  # fmt: skip
    local = quantize_with_budget(path, tmp_path / "local.onnx", ListReader(feeds), cfg, trials_per_round=2,
                                 **kw)[1]  # fmt: skip
    assert len(local.candidates) >= 3 and local.baseline.score < local.threshold
    assert [(c.raised, c.score) for c in remote.candidates] == [(c.raised, c.score) for c in local.candidates]
    assert remote.chosen.overrides == local.chosen.overrides


def test_quantize_cli_shards_on_ray(ray_executor, tmp_path: Path) -> None:
    """zonnx quantize --shards 2 --ray (the module's Ray, left running) writes the one-process model."""
    from typer.testing import CliRunner

    from zonnx.tools.main import app

    x, _ = digits_data("calib")
    np.savez(tmp_path / "calib.npz", input=x[:12])
    src = str(zoo.get("digits_cnn"))
    for name, extra in (("one.onnx", []), ("ray.onnx", ["--shards", "2", "--ray"])):
        result = CliRunner().invoke(app, ["quantize", src, str(tmp_path / name), "--calib",
                                          str(tmp_path / "calib.npz"), *extra])  # fmt: skip
        assert result.exit_code == 0, result.output
    one, ray = (onnx.load(tmp_path / n) for n in ("one.onnx", "ray.onnx"))
    assert one.graph.SerializeToString() == ray.graph.SerializeToString()
    assert ray_executor.ray.is_initialized()


def test_build_config_shards_calibration_on_ray(digits_build, ray_executor, tmp_path: Path) -> None:
    """[quantize] shards = 2 with the Ray backend writes the quantized model of the in-process build."""
    path, local = digits_build
    out = tmp_path / "out"
    shutil.copytree(local.out_dir, out)
    text = path.read_text().replace("samples = 32", "samples = 32\nshards = 2")
    config = tmp_path / "build.toml"
    config.write_text(text)
    run = build(config, only="quantize", backend="ray")
    assert run.executed == ["quantize"]
    assert run.results["quantize"]["calibration_shards"] == {"shards": 2, "backend": "ray"}
    sharded, one = (onnx.load(d / "model_int8.onnx") for d in (out, local.out_dir))
    assert sharded.graph.SerializeToString() == one.graph.SerializeToString()  # metadata names the folder
