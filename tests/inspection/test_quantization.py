"""Quantization detection on ORT-quantized (QDQ, QOperator, int16, int4), FixNeuron and mixed models."""

from __future__ import annotations

import io
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from torch import nn

from tests.helpers import parse
from zonnx.inspection import inspect_model


def _export(module: nn.Module, shape: tuple[int, ...]) -> onnx.ModelProto:
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the legacy TorchScript exporter is deprecated (no onnxscript here)
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module, (torch.randn(*shape),), buf, dynamo=False, opset_version=13,
                          input_names=["x"], dynamic_axes={"x": {0: "batch"}})  # fmt: skip
    return onnx.load_from_string(buf.getvalue())


class _SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.c2(torch.relu(self.c1(x)))).mean(dim=(2, 3)))


class _Reader(CalibrationDataReader):
    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.it = iter([{"x": rng.random((1, 3, 16, 16), dtype=np.float32)} for _ in range(4)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.it, None)


SMALL_CNN_MACS = 8 * 16 * 16 * 27 + 16 * 8 * 8 * 36 + 16 * 10  # conv1 + grouped strided conv2 + fc


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("quant")
    float_path = folder / "float.onnx"
    onnx.save(_export(_SmallCNN().eval(), (1, 3, 16, 16)), float_path)
    variants = {
        "qdq": dict(quant_format=QuantFormat.QDQ, per_channel=True),
        "qop": dict(quant_format=QuantFormat.QOperator, per_channel=True),
        "int16": dict(quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt16,
                      extra_options={"UseQDQContribOps": True}),
        "int4": dict(quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt4,
                     extra_options={"UseQDQContribOps": True}),
    }  # fmt: skip
    paths = {"float": float_path}
    for name, kwargs in variants.items():
        paths[name] = folder / f"{name}.onnx"
        quantize_static(str(float_path), str(paths[name]), _Reader(), **kwargs)
    return paths


def test_quantized_models(quantized: dict[str, Path]) -> None:
    results = {name: inspect_model(path) for name, path in quantized.items()}
    for name, s in results.items():
        assert s.macs.total == SMALL_CNN_MACS and s.macs.complete, name
        ops = Counter(n.op_type for n in onnx.load(quantized[name]).graph.node)
        assert s.quantization.quantize_nodes == ops["QuantizeLinear"], name
        assert s.quantization.dequantize_nodes == ops["DequantizeLinear"], name
    assert results["float"].quantization.format == "none" and results["float"].quantization.dtypes == []
    qdq = results["qdq"].quantization
    assert (qdq.format, qdq.weight_dtypes, qdq.activation_dtypes) == ("QDQ", ["int8"], ["int8"])
    assert qdq.per_channel == 3 * 2 and qdq.qdq_pairs == qdq.quantize_nodes  # weight + bias DQ of 3 layers
    qop = results["qop"].quantization
    assert (qop.format, qop.qoperator_nodes, qop.qdq_pairs) == ("QOperator", 3, 0)
    assert qop.ops["QLinearConv"] == 2 and qop.per_channel == 2
    assert {e.op_type for e in results["qop"].macs.by_op} == {"QLinearConv", "com.microsoft:QGemm"}
    assert results["int16"].quantization.activation_dtypes == ["int16"]
    assert results["int16"].quantization.ops["com.microsoft:QuantizeLinear"] == 5
    assert (results["int4"].quantization.weight_dtypes, results["int4"].quantization.format) == (
        ["int4"],
        "QDQ",
    )


def test_fixneuron_custom_and_mixed_formats() -> None:
    fix = parse(
        """<ir_version: 8, opset_import: ["": 13, "com.vai.quantize": 1, "com.zonnx": 1]>
        g (float[1, 3, 8, 8] x) => (float[1, 4, 8, 8] y) {
          xq = com.vai.quantize.FixNeuron <bit_width = 8, pos = 5> (x)
          wq = com.vai.quantize.FixNeuron <bit_width = 8, pos = 7> (w)
          c = Conv <pads = [1, 1, 1, 1]> (xq, wq)
          d = com.zonnx.NpuCall (c)
          y = com.zonnx.FixNeuron <bit_width = 16, pos = 4> (d)
        }""",
        ("w", np.zeros((4, 3, 3, 3), np.float32)),
    )
    s = inspect_model(fix)
    q = s.quantization
    assert (q.format, q.custom_nodes, q.per_tensor) == ("FixNeuron/custom", 3, 3)
    assert (q.weight_dtypes, q.activation_dtypes) == (["int8"], ["int16", "int8"])
    assert q.ops == {"com.vai.quantize:FixNeuron": 2, "com.zonnx:FixNeuron": 1}  # NpuCall is not quantization
    assert s.macs.total == 4 * 64 * 27 and s.macs.complete  # FixNeuron keeps its input's shape
    assert [u.name for u in s.unknown_shapes] == ["xq", "wq", "c", "d"]  # onnx cannot type custom ops
    assert s.op_histogram == {
        "com.vai.quantize:FixNeuron": 2,
        "Conv": 1,
        "com.zonnx:FixNeuron": 1,
        "com.zonnx:NpuCall": 1,
    }

    mixed = parse(
        """<ir_version: 8, opset_import: ["": 13]>
        g (float[1, 3, 8, 8] x) => (float[1, 4, 6, 6] y) {
          xq = QuantizeLinear (x, s, zp)
          xd = DequantizeLinear (xq, s, zp)
          xq2 = QuantizeLinear (xd, s, zp)
          yq = QLinearConv (xq2, s, zp, wq, ws, wzp, s, zp)
          y = DequantizeLinear (yq, s, zp)
        }""",
        ("s", np.float32(0.05)),
        ("zp", np.uint8(128)),
        ("wq", np.ones((4, 3, 3, 3), np.int8)),
        ("ws", np.full(4, 0.01, np.float32)),
        ("wzp", np.zeros(4, np.int8)),
    )
    ort.InferenceSession(mixed.SerializeToString(), providers=["CPUExecutionProvider"])
    m = inspect_model(mixed)
    q = m.quantization
    assert (q.format, q.formats, q.dtypes) == ("mixed", ["QDQ", "QOperator"], ["int8", "uint8"])
    assert (q.quantize_nodes, q.dequantize_nodes, q.qdq_pairs, q.qoperator_nodes) == (2, 2, 1, 1)
    assert (q.per_tensor, q.per_channel) == (4, 1)
    assert m.macs.total == 4 * 36 * 27
