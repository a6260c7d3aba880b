"""FixNeuron nodes the target refinement adds or copies keep their rounding overload, so every one of them
names a function the model carries and ORT loads the model (PP-OCR's direction classifier with fixed
input dims on the DPU: its average pool's NPU factor made a copied quantizer that lost the overload)."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort

import zonnx
from bench.bench_npu_fidelity import static_model, zoo_feeds
from zonnx.quantization.calibration.readers import ListReader


def test_every_fixneuron_names_a_function_of_the_model(tmp_path: Path) -> None:
    out = tmp_path / "cls_dpu.onnx"
    result = zonnx.quantize_static(
        str(static_model("ppocr_cls", tmp_path)),  # fixed input dims: the pools' windows are known
        str(out),
        ListReader(zoo_feeds("ppocr_cls", 2, seed=1)),
        quant_format=zonnx.VitisQuantFormat.FixNeuron,
        calibrate_method=zonnx.PowerOfTwoMethod.NonOverflow,
        extra_options={"Target": "dpu-b4096"},
    )
    model = onnx.load(out)
    functions = {(f.domain, f.name, f.overload) for f in model.functions}
    fix = [n for n in model.graph.node if n.op_type == "FixNeuron"]
    assert len(fix) > 100 and len({n.overload for n in fix}) == 2  # half_even weights, half_up activations
    assert all((n.domain, n.op_type, n.overload) in functions for n in fix)
    assert result.report is not None  # the per-layer report ran the model in ORT
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
