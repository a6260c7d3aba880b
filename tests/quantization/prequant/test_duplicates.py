"""A pre-quantized model holding one layer twice, float and quantized on the same input, is refused.

The models: the trained digits CNN quantized by ONNX Runtime itself (QDQ, QOperator, dynamic), with a
float copy of one of its layers, taken from the float model ORT quantized, grafted onto the same input
and read as an extra graph output (a half-converted model, or a QAT export that kept its float branch).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tests.helpers import run_cli
from zonnx import quantize_static, zoo
from zonnx.build_npu import target_quantize_kwargs
from zonnx.errors import UnsupportedModelError
from zonnx.ir.io import to_ir
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.prequant import import_prequantized

#: layer, the tensor its float copy reads in the QDQ form (the quantized Conv's DequantizeLinear output)
_RES0 = ("/res/res.0/Conv", "/stem/stem.2/Relu_output_0_DequantizeLinear_Output")


@pytest.fixture(scope="module")
def ort_digits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The digits CNN prepared (BN folded) and quantized by ORT: QDQ and QOperator (u8s8 per-channel),
    and ``quantize_dynamic``."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic
    from onnxruntime.quantization import quantize_static as ort_quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    d = tmp_path_factory.mktemp("dup")
    out = {"float": d / "digits_pre.onnx"}
    quant_pre_process(str(zoo.get("digits_cnn")), str(out["float"]))
    for fmt in ("QDQ", "QOperator"):
        out[fmt] = d / f"digits_{fmt}.onnx"
        ort_quantize_static(str(out["float"]), str(out[fmt]), ListReader(zoo.sample_inputs("digits_cnn", 4)),
                            quant_format=getattr(QuantFormat, fmt), per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
    out["dynamic"] = d / "digits_dynamic.onnx"
    quantize_dynamic(str(out["float"]), str(out["dynamic"]), weight_type=QuantType.QInt8)
    return out


def _graft(quantized: Path, float_model: Path, layer: str, reads: str, out: Path, nudge: float = 0.0,
           **attrs: object) -> Path:  # fmt: skip
    """``quantized`` plus a float copy of ``layer`` (weights from ``float_model``, the first weight moved
    by ``nudge`` steps of the quantized copy's grid) reading ``reads``, its output a graph output."""
    q, f = onnx.load(str(quantized)), onnx.load(str(float_model))
    node = next(n for n in f.graph.node if n.name == layer)
    inits = {t.name: t for t in f.graph.initializer}
    names = [reads]
    for k, name in enumerate(node.input[1:]):
        arr = numpy_helper.to_array(inits[name]).copy()
        if k == 0 and nudge:
            scales = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
            arr.reshape(-1)[0] += nudge * float(scales[f"{name}_scale"].reshape(-1)[0])
        q.graph.initializer.append(numpy_helper.from_array(arr, f"{name}_floatcopy"))
        names.append(f"{name}_floatcopy")
    copy = helper.make_node(node.op_type, names, [f"{node.output[0]}_floatcopy"], name=f"{layer}_floatcopy")
    copy.attribute.extend(a for a in node.attribute if a.name not in attrs)
    copy.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    q.graph.node.append(copy)
    q.graph.output.append(helper.make_tensor_value_info(copy.output[0], onnx.TensorProto.FLOAT, None))
    onnx.save(q, str(out))
    return out


@pytest.mark.parametrize(
    ("form", "layer", "reads", "quantized"),
    [
        ("QDQ", *_RES0, "/res/res.0/Conv"),
        ("QOperator", "/stem/stem.0/Conv", "input", "/stem/stem.0/Conv_quant"),  # QLinearConv
        ("dynamic", "/fc/Gemm", "/Flatten_output_0", "/fc/Gemm_MatMul_quant"),  # Gemm vs MatMulInteger
    ],
)
def test_api_refuses_a_layer_held_float_and_quantized(
    ort_digits: dict[str, Path], tmp_path: Path, form: str, layer: str, reads: str, quantized: str
) -> None:
    src = _graft(ort_digits[form], ort_digits["float"], layer, reads, tmp_path / "dup.onnx")
    before = src.read_bytes()
    out = tmp_path / "out.onnx"
    reader = ListReader(zoo.sample_inputs("digits_cnn", 4))
    with pytest.raises(UnsupportedModelError) as err:
        quantize_static(src, out, reader, **target_quantize_kwargs("zhouyi-x2"))
    msg = str(err.value)
    assert "\n" not in msg and "holds a layer twice" in msg
    assert f"float '{layer}_floatcopy'" in msg and f"quantized '{quantized}'" in msg
    assert "re-export the model without the float branch" in msg and "zonnx quantize FLOAT.onnx" in msg
    assert not out.exists() and src.read_bytes() == before


@pytest.mark.parametrize("form", ["QDQ", "QOperator"])
def test_cli_exits_2_with_one_line_and_writes_nothing(
    ort_digits: dict[str, Path], tmp_path: Path, form: str
) -> None:
    src = _graft(ort_digits[form], ort_digits["float"], "/stem/stem.0/Conv", "input", tmp_path / "dup.onnx")
    before = src.read_bytes()
    calib = tmp_path / "calib.npz"
    np.savez(calib, input=np.concatenate([f["input"] for f in zoo.sample_inputs("digits_cnn", 4)]))
    out = tmp_path / "out.onnx"
    proc = run_cli("quantize", str(src), str(out), "--target", "bm1684x", "--calib", str(calib))
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert (
        len(errors) == 1 and "'/stem/stem.0/Conv_floatcopy'" in errors[0] and "Keep one of them" in errors[0]
    )
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert not out.exists() and not list(tmp_path.glob("out.onnx*")) and src.read_bytes() == before


def _imports(path: Path) -> bool:
    """Whether the import takes the model (False: refused as a layer held twice)."""
    try:
        return import_prequantized(to_ir(onnx.load(str(path)))) is not None
    except UnsupportedModelError as e:
        assert "holds a layer twice" in str(e)
        return False


def test_the_rule_holds_within_one_step_and_the_same_attributes(
    ort_digits: dict[str, Path], tmp_path: Path
) -> None:
    """ORT's models as written are taken; a float copy is the quantized layer's twin while each weight
    lies within one step of the quantized one (rounding puts it within half a step), not beyond, and
    not with other attributes (strides) or on another input."""
    qdq, flt = ort_digits["QDQ"], ort_digits["float"]
    assert all(_imports(ort_digits[f]) for f in ("QDQ", "QOperator", "dynamic"))
    assert not _imports(_graft(qdq, flt, *_RES0, tmp_path / "a.onnx", nudge=0.4))  # <= 0.9 step away
    assert _imports(_graft(qdq, flt, *_RES0, tmp_path / "b.onnx", nudge=2.0))  # >= 1.5 steps away
    assert _imports(_graft(qdq, flt, *_RES0, tmp_path / "c.onnx", strides=[2, 2]))
    assert _imports(_graft(qdq, flt, "/res/res.0/Conv", "/res/res.2/Relu_output_0_DequantizeLinear_Output",
                           tmp_path / "d.onnx"))  # fmt: skip
