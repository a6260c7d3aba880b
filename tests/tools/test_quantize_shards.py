"""``zonnx quantize --shards N [--ray]``: sharded calibration from the command line writes the model of one
process; options that would do nothing are refused; without Ray installed ``--ray`` says so in one line.
(The same flags on a real local Ray: tests/deploy/test_ray_evaluate.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from zonnx import zoo
from zonnx.errors import ZonnxError
from zonnx.tools.main import app
from zonnx.zoo.digits import digits_data


def digits_calib(folder: Path, n: int = 12) -> Path:
    x, _ = digits_data("calib")
    path = folder / "calib.npz"
    np.savez(path, input=x[:n])
    return path


def quantize(*args: str) -> tuple[int, str]:
    """Exit code and output as ``zonnx.tools.main.main`` gives them (a ZonnxError: its code and one line)."""
    result = CliRunner().invoke(app, ["quantize", *args])
    if isinstance(result.exception, ZonnxError):
        return result.exception.exit_code, str(result.exception)
    return result.exit_code, result.output


def test_shards_in_process_write_the_one_process_model(tmp_path: Path) -> None:
    calib, src = digits_calib(tmp_path), str(zoo.get("digits_cnn"))
    common = ["--calib", str(calib), "--method", "percentile", "--extra", "CalibHistogramSample=1024"]
    code, out = quantize(src, str(tmp_path / "one.onnx"), *common)
    assert code == 0, out
    code, out = quantize(src, str(tmp_path / "three.onnx"), *common, "--shards", "3")
    assert code == 0, out
    one, three = (onnx.load(tmp_path / n) for n in ("one.onnx", "three.onnx"))
    scales = [t for t in one.graph.initializer if t.name.endswith("_scale")]
    assert len(scales) > 5
    assert one.graph.SerializeToString() == three.graph.SerializeToString()


def test_ray_without_ray_installed_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        sys.modules, "ray", None
    )  # `import ray` raises ImportError, as on a machine without it
    calib = digits_calib(tmp_path, 4)
    code, out = quantize(str(zoo.get("digits_cnn")), str(tmp_path / "q.onnx"), "--calib", str(calib),
                         "--shards", "2", "--ray")  # fmt: skip
    assert code == 2
    assert out.strip().count("\n") == 0 and "--ray: Ray is not installed; pip install 'zonnx[ray]'" in out
    assert not (tmp_path / "q.onnx").exists()


def test_shards_and_ray_that_would_do_nothing_are_refused(tmp_path: Path) -> None:
    calib, src, dst = digits_calib(tmp_path, 4), str(zoo.get("digits_cnn")), str(tmp_path / "q.onnx")
    code, out = quantize(src, dst, "--calib", str(calib), "--ray")
    assert code == 2 and "--ray runs the --shards tasks" in out
    code, out = quantize(src, dst, "--calib", str(calib), "--save-stats", str(tmp_path / "st.npz"))
    assert code == 0, out
    code, out = quantize(src, dst, "--load-stats", str(tmp_path / "st.npz"), "--shards", "2")
    assert code == 2 and "--shards 2 cuts calibration, which --load-stats / --load-table replace" in out
    code, out = quantize(src, dst, "--calib", str(calib), "--shards", "0")
    assert code == 2 and "--shards" in out
