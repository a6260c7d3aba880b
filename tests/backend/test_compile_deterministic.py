"""Compiling the same quantized model twice writes the same bytes: in one process, and in another process
started seconds later with another hash seed (so set/dict order, timestamps and counters would show)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import zonnx
from tests.backend.partition_models import quantize
from zonnx import zoo
from zonnx.backend.compile_api import compile_model
from zonnx.build_npu import target_quantize_kwargs
from zonnx.quantization.calibration.readers import ListReader
from zonnx.zoo.digits import digits_data

_COMPILE = """
import sys
from zonnx.backend.compile_api import compile_model
for src, target, out in zip(*[iter(sys.argv[1:])] * 3):
    compile_model(src, target).save(out)
"""


def test_compile_writes_the_same_bytes_across_runs_and_processes(tmp_path: Path) -> None:
    x, _ = digits_data("calib")
    digits = quantize(
        zoo.get("digits_cnn"),
        tmp_path / "digits_fix.onnx",
        [{"input": x[i : i + 1]} for i in range(8)],
        "fix",
    )
    yolo = tmp_path / "yolo_int8.onnx"
    zonnx.quantize_static(zoo.get("yolo_det"), yolo, ListReader(zoo.sample_inputs("yolo_det", 2, seed=1)),
                          **target_quantize_kwargs("zhouyi-x2"))  # fmt: skip
    cases = [(digits, "dpu-b4096"), (yolo, "zhouyi-x2")]
    here = {}
    for src, target in cases:
        first = compile_model(src, target)
        assert first.partition.npu_ops > 10 and first.programs  # real NPU programs, not an empty partition
        again = compile_model(src, target).model.SerializeToString()
        assert first.model.SerializeToString() == again, f"{src.name} for {target}: two compiles differ"
        here[target] = again
    seed = "12345" if os.environ.get("PYTHONHASHSEED") != "12345" else "54321"
    args = [str(a) for src, target in cases for a in (src, target, tmp_path / f"{target}.onnx")]
    env = {**os.environ, "PYTHONHASHSEED": seed}
    subprocess.run([sys.executable, "-c", _COMPILE, *args], check=True, env=env, cwd=tmp_path, timeout=120)
    for target, data in here.items():
        assert (tmp_path / f"{target}.onnx").read_bytes() == data, (
            f"{target}: another process wrote other bytes"
        )
