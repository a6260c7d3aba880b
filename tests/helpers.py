"""Shared model builders and checks for the tests: small models from ONNX text, pass-and-compare."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir

from zonnx.ir.io import ModelLike, to_ir, to_proto
from zonnx.passes.base import ZonnxPass, ZonnxPassResult
from zonnx.verify import check_loadable, compare_outputs, make_inputs, run_ort

#: Bound the issue sets for every pass: max abs error / output range.
RTOL = 1e-5


def parse(text: str, *initializers: tuple[str, np.ndarray]) -> onnx.ModelProto:
    """Build a model from ONNX text syntax, adding numpy initializers by name."""
    model = onnx.parser.parse_model(text)
    for name, arr in initializers:
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(arr), name))
    onnx.checker.check_model(model)
    return model


def op_types(model: ModelLike) -> list[str]:
    """Op types of the main graph, in order."""
    return [n.op_type for n in to_proto(model).graph.node]


def run_pass_and_compare(
    pass_: ZonnxPass,
    model: ModelLike,
    *,
    feeds: Mapping[str, np.ndarray] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    rtol: float = RTOL,
) -> tuple[ir.Model, ZonnxPassResult]:
    """Run ``pass_`` on a copy of ``model``; assert the result loads and matches ORT outputs within rtol."""
    before = to_proto(model)
    feeds = dict(feeds) if feeds is not None else make_inputs(before, shapes=shapes)
    expected = run_ort(before, feeds)
    work = to_ir(onnx.ModelProto.FromString(before.SerializeToString()))
    result = pass_(work)
    after = to_proto(result.model)
    check_loadable(after, full_check=False)
    for diff in compare_outputs(expected, run_ort(after, feeds)):
        assert diff.within(rtol), f"{type(pass_).__name__}: output {diff.name} off by {diff.relative:.3g}"
    return result.model, result


def run_cli(*args: str, check: bool = False, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``zonnx ARGS`` in a subprocess exactly as a user would (console entry point of this venv)."""
    exe = Path(sys.executable).with_name("zonnx")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "zonnx.tools.main"]
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=cwd, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"zonnx {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """The CLI failed with exit code 2 and one 'error:' line that contains every fragment; no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def digits_feeds(n: int, start: int = 0) -> list[dict[str, np.ndarray]]:
    """Samples ``start .. start + n`` of the digits CNN's calibration split, one image per feed."""
    from zonnx.zoo.digits import digits_data

    x, _ = digits_data("calib")
    return [{"input": x[i : i + 1]} for i in range(start, start + n)]
