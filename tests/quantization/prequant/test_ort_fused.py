"""A dynamic model as ONNX Runtime's own graph optimizer leaves it: ``quantize_dynamic`` then a session's
``optimized_model_filepath`` fuses DynamicQuantizeLinear + MatMulInteger + Mul + Add into com.microsoft
DynamicQuantizeMatMul, which is retargeted like the unfused form."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from zonnx import quantize_static
from zonnx.backend.compile_api import compile_model
from zonnx.build_npu import target_quantize_kwargs
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.prequant import quantized_form

D = 64


def _dynamic_then_ort_optimized(path: Path, nodes: list, inits: list, output: str) -> Path:
    """Save the float graph (input ``x`` [1, D] -> ``output``) at ``path``, quantize it with ORT's
    ``quantize_dynamic``, and return the model ORT's own optimizer (EXTENDED level) writes from it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, D])],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, [1, D])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    dynamic, fused = path.with_name(path.stem + "_dyn.onnx"), path.with_name(path.stem + "_fused.onnx")
    quantize_dynamic(str(path), str(dynamic), weight_type=QuantType.QInt8)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(fused)
    ort.InferenceSession(str(dynamic), opts, providers=["CPUExecutionProvider"])
    return fused


def _ort_fused(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(3):
        inits += [numpy_helper.from_array((rng.standard_normal((D, D)) / 8).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array((rng.standard_normal(D) / 8).astype(np.float32), f"b{i}")]  # fmt: skip
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"])]  # fmt: skip
        x = f"r{i}"
    return _dynamic_then_ort_optimized(tmp_path / "mlp.onnx", nodes, inits, x)


def test_dynamic_quantize_matmul_from_ort_retargets(tmp_path: Path) -> None:
    src = _ort_fused(tmp_path)
    ops = [n.op_type for n in onnx.load(str(src)).graph.node]
    assert ops.count("DynamicQuantizeMatMul") == 3 and quantized_form(onnx.load(str(src))) == "dynamic"
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((1, D)).astype(np.float32)} for _ in range(16)]
    out = tmp_path / "bm.onnx"
    res = quantize_static(src, out, ListReader(feeds[:8]), **target_quantize_kwargs("bm1684x"))
    assert res.prequant.counts()["weight kept"] + res.prequant.counts()["weight snapped"] == 3
    assert not {n.op_type for n in res.model.graph.node} & {"DynamicQuantizeMatMul", "MatMulInteger"}
    a = np.concatenate([ort.InferenceSession(str(src)).run(None, f)[0].ravel() for f in feeds[8:]])
    b = np.concatenate([ort.InferenceSession(str(out)).run(None, f)[0].ravel() for f in feeds[8:]])
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > 0.99
    assert compile_model(out, "bm1684x").partition.mac_share > 0.95


def _ort_shared_input(tmp_path: Path) -> Path:
    """Three MatMul + bias branches reading one input (an attention block's Q/K/V projections): after
    ``quantize_dynamic``, ORT's optimizer keeps the shared DynamicQuantizeLinear and fuses each branch into
    com.microsoft MatMulIntegerToFloat (with its bias)."""
    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array((rng.standard_normal((D, D)) / 8).astype(np.float32), f"w{i}")
        for i in range(3)
    ]
    inits += [
        numpy_helper.from_array((rng.standard_normal(D) / 8).astype(np.float32), f"b{i}") for i in range(3)
    ]
    nodes = []
    for i in range(3):
        nodes += [helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]  # fmt: skip
    nodes += [helper.make_node("Add", ["a0", "a1"], ["s"]), helper.make_node("Add", ["s", "a2"], ["y"])]
    return _dynamic_then_ort_optimized(tmp_path / "qkv.onnx", nodes, inits, "y")


def test_matmul_integer_to_float_from_ort_retargets(tmp_path: Path) -> None:
    src = _ort_shared_input(tmp_path)
    ops = [n.op_type for n in onnx.load(str(src)).graph.node]
    assert ops.count("MatMulIntegerToFloat") == 3 and ops.count("DynamicQuantizeLinear") == 1
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((1, D)).astype(np.float32)} for _ in range(16)]
    out = tmp_path / "zhouyi.onnx"
    res = quantize_static(src, out, ListReader(feeds[:8]), **target_quantize_kwargs("zhouyi-x2"))
    assert not {n.op_type for n in res.model.graph.node} & {"MatMulIntegerToFloat", "DynamicQuantizeLinear"}
    a = np.concatenate([ort.InferenceSession(str(src)).run(None, f)[0].ravel() for f in feeds[8:]])
    b = np.concatenate([ort.InferenceSession(str(out)).run(None, f)[0].ravel() for f in feeds[8:]])
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > 0.99
    assert compile_model(out, "zhouyi-x2").partition.mac_share > 0.95
