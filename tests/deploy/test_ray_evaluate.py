"""Evaluation batches as Ray tasks on a real local Ray (2 CPUs) give exactly the in-process numbers."""

from __future__ import annotations

import json

import numpy as np

from tests.deploy.conftest import build
from zonnx.deploy.evaluate import RayExecutor, run_batch
from zonnx.quantization.search.executor import LocalExecutor
from zonnx.zoo.digits import digits_data


def test_ray_evaluation_matches_in_process(digits_build) -> None:
    x, _ = digits_data("test")
    path, local = digits_build
    out = local.out_dir
    executor = (
        RayExecutor()
    )  # one local Ray for the whole test (its start is the slow part); the build uses it
    try:
        ray_run = build(path, only="evaluate", backend="ray")
        assert executor.ray.is_initialized()
        tasks = [
            (str(out / "model_npu.onnx"), [{"input": x[i : i + 1]} for i in range(j, j + 5)])
            for j in (0, 5, 10)
        ]
        remote = list(executor.map(run_batch, tasks))
    finally:
        executor.close()
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


def test_a_ray_address_that_does_not_answer_is_refused_at_once() -> None:
    import socket

    import pytest

    from zonnx.errors import OptionError

    with socket.socket() as s:  # a free port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(
        OptionError, match=rf"ray_address ray://127.0.0.1:{port}: no Ray answers there.*backend = \"local\""
    ):
        RayExecutor(f"ray://127.0.0.1:{port}")
