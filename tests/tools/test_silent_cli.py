"""Issue 11 item 15 and 19 (CLI side): scalar inputs in stacked .npz, optimize --verify's message and
--input-shape, quantize --help's defaults."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper as nh
import onnx.parser
from typer.testing import CliRunner

import zonnx
from zonnx.errors import VerificationError
from zonnx.quantization.calibration.readers import NpzReader
from zonnx.tools.main import app
from zonnx.verify import ort_session


def _scalar_model(path: Path) -> Path:
    model = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,3,8,8] x, float t) => (float[1,4,8,8] y) {
          a = Conv <pads=[1,1,1,1]> (x, W)
          y = Mul (a, t)
        }
        """
    )
    model.graph.input[1].CopyFrom(onnx.helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, []))
    weights = np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32)
    model.graph.initializer.append(nh.from_array(weights, "W"))
    onnx.save(model, path)
    return path


def test_stacked_npz_holds_a_scalar_input(tmp_path: Path) -> None:
    src = _scalar_model(tmp_path / "scalar.onnx")
    data = tmp_path / "calib.npz"
    x = np.random.default_rng(1).normal(size=(5, 1, 3, 8, 8)).astype(np.float32)
    np.savez(data, x=x, t=np.arange(1, 6, dtype=np.float32))
    reader = NpzReader(data)
    reader.bind({"x": 4, "t": 0})
    first = reader.get_next()
    assert first["t"].shape == () and float(first["t"]) == 1.0 and first["x"].shape == (1, 3, 8, 8)
    out = tmp_path / "q.onnx"
    zonnx.quantize_static(src, out, NpzReader(data))
    feed = {"x": x[2], "t": np.array(3.0, np.float32)}
    # ORT at its default level, the quantized model in its exact integer form: the fused u8 x s8
    # QLinearConv saturates on x86 without VNNI (zonnx.hostcpu), which is not what this test measures
    y = ort_session(out, optimize=True).run(None, feed)[0]
    ref = ort_session(src, optimize=True).run(None, feed)[0]
    assert np.abs(y - ref).max() < 0.05 * np.abs(ref).max()


def _reshape_model(path: Path) -> Path:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N,M] x) => (float[N,3,4] y) {
      s = Constant <value = int64[3] {-1, 3, 4}> ()
      r = Reshape (x, s)
      y = Relu (r)
    }
    """
    onnx.save(onnx.parser.parse_model(text), path)
    return path


def test_optimize_verify_names_generated_inputs_and_input_shape_fixes_dims(tmp_path: Path) -> None:
    src = _reshape_model(tmp_path / "rs.onnx")
    runner = CliRunner()
    failed = runner.invoke(app, ["optimize", str(src), str(tmp_path / "o.onnx"), "--verify"])
    assert isinstance(failed.exception, VerificationError)
    text = str(failed.exception)
    assert "generated inputs (x [1, 64] float32)" in text and "--input-shape" in text and "--inputs" in text
    ok = runner.invoke(
        app, ["optimize", str(src), str(tmp_path / "o.onnx"), "--verify", "--input-shape", "x:1,12"]
    )
    assert ok.exit_code == 0, ok.output
    dims = [d.dim_value for d in onnx.load(tmp_path / "o.onnx").graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 12]  # the passes saw the fixed shape, and so does the written model


def test_quantize_help_shows_defaults() -> None:
    result = CliRunner().invoke(app, ["quantize", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for text in ("default: (minmax; a --target picks its own)", "default: (qdq; a --target picks its own)",
                 "default: (int8; a --target picks its own)", "default: (kernels; ort with --target)"):  # fmt: skip
        assert text in result.stdout, text
