"""ORT's dynamic quantization of a BERT encoder: embedding tables are int8 codes read by Gather, then
DequantizeLinear. Retargeting selects rows of the dequantized float table, so a power-of-two target
(dpu-b4096) takes the embeddings too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import zonnx.zoo as zoo
from zonnx import quantize_static
from zonnx.backend.compile_api import compile_model
from zonnx.build_npu import target_quantize_kwargs
from zonnx.ir.io import to_ir
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.prequant import import_prequantized


def _ort_dynamic(tmp_path: Path) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = tmp_path / "bert_dyn.onnx"
    quantize_dynamic(str(zoo.get("bert_encoder")), str(out), weight_type=QuantType.QInt8)
    return out


def test_gathered_tables_become_float_with_their_grid(tmp_path: Path) -> None:
    src = _ort_dynamic(tmp_path)
    proto = onnx.load(str(src))
    tables = {
        n.input[0] for n in proto.graph.node if n.op_type == "Gather" and n.input[0].endswith("_quantized")
    }
    assert len(tables) == 3  # word, position and token-type embeddings, int8 codes in the source
    model = to_ir(proto)
    imported = import_prequantized(model)
    gathers = [n for n in model.graph if n.op_type == "Gather" and n.inputs[0].is_initializer()]
    floats = [n for n in gathers if n.inputs[0].dtype == onnx.TensorProto.FLOAT]
    assert len(floats) == 3 and all(n.outputs[0].name in imported.activations for n in floats)
    assert not any(n.op_type == "DequantizeLinear" for n in model.graph)


def test_dynamic_bert_to_dpu(tmp_path: Path) -> None:
    src = _ort_dynamic(tmp_path)
    calib = zoo.sample_inputs("bert_encoder", 8)
    out = tmp_path / "dpu.onnx"
    res = quantize_static(src, out, ListReader(calib), **target_quantize_kwargs("dpu-b4096"))
    assert min(r["cosine"] for r in res.prequant.outputs.values()) > 0.99, res.prequant.summary()
    shapes = {k: v.shape for k, v in calib[0].items()}
    part = compile_model(out, "dpu-b4096", input_shapes=shapes).partition
    # every node the DPU can compute runs there: what stays is the attention's activation x activation
    # MatMuls (dpu-b4096 multiplies by constant weights only) and shape arithmetic
    assert part.mac_share > 0.92 and "dtype" not in {
        r for n, r in part.rules.items() if "Gather" in n or "embed" in n
    }
    held = zoo.sample_inputs("bert_encoder", 16, seed=1)[8:]
    a = np.concatenate([ort.InferenceSession(str(src)).run(None, f)[0].ravel() for f in held])
    b = np.concatenate([ort.InferenceSession(str(out)).run(None, f)[0].ravel() for f in held])
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > 0.985  # logits on a 2^-5 grid
