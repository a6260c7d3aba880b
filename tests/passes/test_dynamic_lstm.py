"""DynamicQuantizeLSTM (written by onnxruntime's quantize_dynamic) to a float LSTM on its dequantized weights."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from zonnx.ir.io import to_ir, to_proto
from zonnx.passes.common.dynamic_to_qdq import DynamicToQDQPass

SEQ, IN, HID = 6, 16, 32


def _lstm_model(path: Path, direction: str) -> Path:
    rng = np.random.default_rng(0)
    d = 2 if direction == "bidirectional" else 1
    inits = [
        numpy_helper.from_array((rng.standard_normal((d, 4 * HID, IN)) * 0.3).astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal((d, 4 * HID, HID)) * 0.3).astype(np.float32), "R"),
        numpy_helper.from_array((rng.standard_normal((d, 8 * HID)) * 0.1).astype(np.float32), "B"),
    ]
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "y_h"], hidden_size=HID, direction=direction)
    graph = helper.make_graph([node], "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [SEQ, 1, IN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("y_h", TensorProto.FLOAT, None)], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _run(model: onnx.ModelProto | Path, x: np.ndarray) -> list[np.ndarray]:
    arg = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(arg, providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


def test_dynamic_quantize_lstm_becomes_float_lstm(tmp_path: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    x = np.random.default_rng(1).standard_normal((SEQ, 1, IN)).astype(np.float32)
    for direction in ("forward", "bidirectional"):
        src = _lstm_model(tmp_path / f"{direction}.onnx", direction)
        dyn = tmp_path / f"{direction}_dyn.onnx"
        quantize_dynamic(str(src), str(dyn), weight_type=QuantType.QInt8)
        model = to_ir(onnx.load(str(dyn)))
        assert Counter(n.op_type for n in model.graph)["DynamicQuantizeLSTM"] == 1
        result = DynamicToQDQPass()(model)
        ops = Counter((n.domain, n.op_type) for n in model.graph)
        assert ops == {("", "LSTM"): 1} and not result.changes.misses
        out = to_proto(model)
        assert "com.microsoft" not in {o.domain for o in out.opset_import}
        got, ref, flt = _run(out, x), _run(dyn, x), _run(src, x)
        for g, r, f in zip(got, ref, flt, strict=True):
            # the int8 weights are exact; the kernel also rounds X and the hidden state to u8 per step
            assert _cos(g, r) > 0.999 and _cos(g, f) > 0.999
            assert np.abs(g - r).max() < 0.05 * np.abs(r).max()


def test_quantize_retargets_a_dynamic_lstm(tmp_path: Path) -> None:
    """``quantize --target`` on the dynamic model: the LSTM comes back in float (no NPU target quantizes
    LSTM), nothing of the com.microsoft form is left, and the output follows the source's."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from zonnx import quantize_static
    from zonnx.build_npu import target_quantize_kwargs
    from zonnx.quantization.calibration.readers import ListReader

    src, dyn = _lstm_model(tmp_path / "f.onnx", "forward"), tmp_path / "dyn.onnx"
    quantize_dynamic(str(src), str(dyn), weight_type=QuantType.QInt8)
    feeds = [
        {"x": np.random.default_rng(i).standard_normal((SEQ, 1, IN)).astype(np.float32)} for i in range(4)
    ]
    res = quantize_static(dyn, tmp_path / "q.onnx", ListReader(feeds), **target_quantize_kwargs("bm1684x"))
    assert res.prequant.form == "dynamic"
    assert Counter(n.op_type for n in res.model.graph.node) == {"LSTM": 1}
    x = feeds[0]["x"]
    assert _cos(_run(tmp_path / "q.onnx", x)[0], _run(dyn, x)[0]) > 0.999
