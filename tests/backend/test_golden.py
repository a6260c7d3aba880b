"""Per-layer dump and golden comparison on the quantized digits CNN compiled for dpu-b4096 and bm1684x."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from tests.backend.partition_models import quantize
from zonnx import zoo
from zonnx.backend.compile_api import compile_model
from zonnx.backend.compiled import npu_nodes, read_program
from zonnx.backend.dump import dump_layers, sanitize, write_dump
from zonnx.backend.golden import compare_layers
from zonnx.backend.runtime.ort_lowering import program_to_model
from zonnx.backend.runtime.reference import run_program
from zonnx.backend.session import InferenceSession
from zonnx.errors import OptionError
from zonnx.zoo.digits import digits_data

FORMS = {"dpu-b4096": "fix", "bm1684x": "qdq"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Per target: the quantized model's path, the compiled ModelProto and 32 test images."""
    d = tmp_path_factory.mktemp("golden")
    x, _ = digits_data("calib")
    calib = [{"input": x[i : i + 1]} for i in range(32)]
    out = {}
    for target, form in FORMS.items():
        q = quantize(zoo.get("digits_cnn"), d / f"{form}.onnx", calib, form)
        out[target] = {"qdq": q, "compiled": compile_model(q, target).model}
    return out


@pytest.fixture(scope="module")
def feeds() -> dict[str, np.ndarray]:
    x, _ = digits_data("test")
    return {"input": x[:32]}


def corrupt_weights(compiled: onnx.ModelProto, op_name: str) -> onnx.ModelProto:
    """A copy whose program has op ``op_name``'s output channels' weights reversed (node and hash rewritten)."""
    model = onnx.ModelProto()
    model.CopyFrom(compiled)
    node = npu_nodes(model)[0]
    prog = read_program(node)
    op = next(o for o in prog.ops if o.name == op_name)
    op.params["w"] = np.ascontiguousarray(op.params["w"][::-1])
    blob = prog.to_bytes()
    for a in node.attribute:
        if a.name == "program":
            a.s = blob
        elif a.name == "program_sha256":
            a.s = hashlib.sha256(blob).hexdigest().encode()
    return model


def _input_codes(prog, x: np.ndarray) -> dict[str, np.ndarray]:
    """The program's input codes for float images (round half to even, as QuantizeLinear and FixNeuron)."""
    info = prog.inputs[0]
    q = np.rint(x / info.scale[0]) + info.zero_point[0]
    return {info.name: np.clip(q, info.qmin, info.qmax).astype(info.dtype)}


@pytest.mark.parametrize("target", FORMS)
def test_dump_files_equal_reference_and_ort_lowering(built, feeds, tmp_path: Path, target: str) -> None:
    compiled = built[target]["compiled"]
    result = dump_layers(compiled, feeds)
    assert result.checked == 1 and result.mismatches == []
    index = json.loads(write_dump(result, tmp_path).read_text())["tensors"]
    prog = read_program(npu_nodes(compiled)[0])
    op_outputs = [t for op in prog.ops for t in op.outputs]
    assert [e["tensor"] for e in index] == op_outputs  # every op output, in program order
    codes = _input_codes(prog, feeds["input"])
    ref = run_program(prog, codes, debug=True)
    lowered = program_to_model(prog, name="p", expose=op_outputs)
    sess = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    ort_values = dict(zip(names, sess.run(None, {f"p/{k}": v for k, v in codes.items()}), strict=True))
    for entry in index:
        arr = np.load(tmp_path / entry["file"])
        assert entry["file"] == f"npu_subgraph_0/{sanitize(entry['tensor'])}.npy"
        assert arr.dtype == np.dtype(prog.tensors[entry["tensor"]].dtype) == np.dtype(entry["dtype"])
        assert list(arr.shape) == entry["shape"] and arr.shape[0] == 32
        assert entry["scale"] == prog.tensors[entry["tensor"]].scale
        assert np.array_equal(arr, ref[entry["tensor"]])  # the numpy reference, bit for bit
        assert np.array_equal(arr, ort_values[f"p/{entry['tensor']}"])  # and the ORT lowering
    last = result.layers[-1]
    npu = InferenceSession(compiled, providers=["ZonnxNPUExecutionProvider", "CPUExecutionProvider"])
    np.testing.assert_allclose(npu.run(None, feeds)[0], last.dequantize(), rtol=1e-6, atol=1e-6)
    assert len({e["file"] for e in index}) == len(index)


@pytest.mark.parametrize("target", FORMS)
def test_good_model_is_within_tolerance(built, feeds, target: str) -> None:
    b = built[target]
    report = compare_layers(b["compiled"], feeds, float_model=zoo.get("digits_cnn"), qdq_model=b["qdq"])
    assert report.first_divergence is None, report.summary()
    assert report.summary().startswith(f"all {len(report.rows)} NPU layers within tolerance")
    assert all(r.float_tensor is not None and r.cos_float > 0.99 for r in report.rows)
    assert min(r.sqnr_db for r in report.rows) > 20
    fq_rows = [r for r in report.rows if r.max_lsb is not None]
    assert len(fq_rows) == len(report.rows) - (target == "bm1684x")  # the Concat input rescale has none
    # measured: 0 LSB on dpu-b4096; on bm1684x 1 LSB in one element of the Conv before a Relu, whose
    # output is quantized on its own in ORT's symmetric layout (integer requantization vs float rounding)
    assert max(r.max_lsb for r in fq_rows) <= (target == "bm1684x")
    assert all(r.codes_diff <= (target == "bm1684x") and r.cos_fq > 0.9999 for r in fq_rows)
    conv = next(r for r in report.rows if r.op == "/res/res.0/Conv")
    # dpu-b4096 fuses the Relu into the Conv's quantizer (target rules); the ORT layout quantizes both
    fused = {"dpu-b4096": "/res/res.2/Relu_output_0", "bm1684x": "/res/res.0/Conv_output_0"}
    assert conv.float_tensor == fused[target]
    json.dumps(report.to_dict(), allow_nan=False)


def test_float_only_maps_names_from_the_compiled_model(built, feeds) -> None:
    report = compare_layers(built["dpu-b4096"]["compiled"], feeds, float_model=zoo.get("digits_cnn"))
    assert all(r.float_tensor is not None and r.max_lsb is None for r in report.rows)
    assert report.first_divergence is None
    assert any("fake-quant (LSB) is skipped" in n for n in report.notes)


@pytest.mark.parametrize("target", FORMS)
def test_corrupted_program_names_that_layer(built, feeds, target: str) -> None:
    b = built[target]
    bad = corrupt_weights(b["compiled"], "/res/res.0/Conv")
    report = compare_layers(bad, feeds, float_model=zoo.get("digits_cnn"), qdq_model=b["qdq"])
    first = report.first_divergence
    assert first is not None and first.op == "/res/res.0/Conv"
    assert first.index >= 1 and not any(r.diverged for r in report.rows[: first.index])
    assert first.cos_float < 0.9 and first.max_lsb > 10 and first.local_lsb > 10
    assert "the op alone differs" in report.summary()


def test_wrong_quantized_model_names_that_layer(built, feeds, tmp_path: Path) -> None:
    b = built["bm1684x"]
    qdq = onnx.load(b["qdq"])
    scale = next(t for t in qdq.graph.initializer if t.name == "/res/res.2/Relu_output_0_scale")
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * 2, scale.name))
    report = compare_layers(b["compiled"], feeds, qdq_model=qdq)
    first = report.first_divergence
    assert first is not None and first.tensor == "/res/res.2/Relu_output_0_QuantizeLinear_Output"
    assert first.max_lsb > 1 and first.cos_float is None
    assert any("no float model" in n for n in report.notes)


def test_bad_arguments(built, feeds) -> None:
    compiled = built["dpu-b4096"]["compiled"]
    with pytest.raises(OptionError, match="needs a float model or the quantized"):
        compare_layers(compiled, feeds)
    with pytest.raises(OptionError, match="is a compiled model"):
        compare_layers(compiled, feeds, qdq_model=compiled)
    with pytest.raises(OptionError, match="tol_cos must be in"):
        compare_layers(compiled, feeds, qdq_model=built["dpu-b4096"]["qdq"], tol_cos=2.0)
