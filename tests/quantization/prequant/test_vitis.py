"""Retargeting FixNeuron / VitisQDQ models (power-of-two, vai_q_onnx style, written by zonnx's quantizer)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from zonnx import quantize_static, zoo
from zonnx.backend.compile_api import compile_model
from zonnx.build_npu import target_quantize_kwargs
from zonnx.errors import UnsupportedModelError
from zonnx.ir.io import to_ir
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.enums import PowerOfTwoMethod, VitisQuantFormat
from zonnx.quantization.prequant import import_prequantized
from zonnx.zoo.digits import digits_data


@pytest.fixture(scope="module")
def vitis_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The digits CNN quantized for dpu-b4096 in both vai_q_onnx forms."""
    x, _ = digits_data("calib")
    feeds = [{"input": x[i : i + 1]} for i in range(16)]
    d = tmp_path_factory.mktemp("vitis")
    out = {}
    for fmt in (VitisQuantFormat.FixNeuron, VitisQuantFormat.QDQ):
        out[fmt.name] = d / f"digits_{fmt.name}.onnx"
        quantize_static(zoo.get("digits_cnn"), out[fmt.name], ListReader(feeds), quant_format=fmt,
                        calibrate_method=PowerOfTwoMethod.NonOverflow, extra_options={"Target": "dpu-b4096"})  # fmt: skip
    return out


def _outputs(path: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


@pytest.mark.parametrize("form", ["FixNeuron", "QDQ"])
def test_import_keeps_power_of_two_grids(vitis_models: dict[str, Path], form: str) -> None:
    model = to_ir(onnx.load(str(vitis_models[form])))
    imported = import_prequantized(model)
    assert imported is not None and imported.form == "fixneuron"
    assert not [n for n in model.graph if n.domain == "com.zonnx"]
    assert imported.weights and imported.activations
    for grid in [*imported.weights.values(), *imported.activations.values()]:  # 2^-pos, zero point 0
        s = grid.scale.reshape(-1).astype(np.float64)
        assert np.all(np.log2(s) == np.round(np.log2(s))) and not grid.zero_point.any()


@pytest.mark.parametrize(("form", "target"), [("FixNeuron", "zhouyi-x2"), ("QDQ", "bm1684x")])
def test_retarget_to_other_npus(
    vitis_models: dict[str, Path], form: str, target: str, tmp_path: Path
) -> None:
    x, _ = digits_data("test")
    out = tmp_path / "r.onnx"
    res = quantize_static(vitis_models[form], out, ListReader([{"input": x[i : i + 1]} for i in range(8)]),
                          **target_quantize_kwargs(target))  # fmt: skip
    assert res.prequant.form == "fixneuron"
    ops = Counter((n.domain, n.op_type) for n in res.model.graph.node)
    assert not [k for k in ops if k[0] == "com.zonnx"]  # one layer of ONNX Q/DQ, none of the source's left
    counts = res.prequant.counts()
    # every grid of the digits CNN comes from the source (6 weights, 11 activations), none calibrated;
    # the target's own scale rules re-express each power-of-two grid
    assert sum(v for k, v in counts.items() if k.startswith("weight")) == 6
    assert sum(v for k, v in counts.items() if k.startswith("activation")) == 11
    assert not [k for k in counts if "calibrated" in k]
    src, got = _outputs(vitis_models[form], x[:32]), _outputs(out, x[:32])
    cos = float((src * got).sum() / np.linalg.norm(src) / np.linalg.norm(got))
    assert cos > 0.99, cos
    assert (src.argmax(1) == got.argmax(1)).mean() > 0.95
    assert compile_model(out, target).partition.mac_share > 0.95


def test_activation_grid_without_code_type_is_one_line(vitis_models: dict[str, Path], tmp_path: Path) -> None:
    model = onnx.load(str(vitis_models["FixNeuron"]))
    consts = {t.name for t in model.graph.initializer}
    node = next(n for n in model.graph.node if n.op_type == "FixNeuron" and n.input[0] not in consts)
    next(a for a in node.attribute if a.name == "bit_width").i = 4
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    x, _ = digits_data("test")
    with pytest.raises(
        UnsupportedModelError, match=r"4-bit signed codes, which no ONNX code type holds"
    ) as e:
        quantize_static(
            bad, tmp_path / "out.onnx", ListReader([{"input": x[:1]}]), **target_quantize_kwargs("bm1684x")
        )
    assert "\n" not in str(e.value) and node.name in str(e.value)
    assert not (tmp_path / "out.onnx").exists()
