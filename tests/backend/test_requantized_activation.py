"""HardSwish / HardSigmoid after a convolution's quantizer on dpu-b4096: the DPU applies them to the
convolution's int8 result (its compiler fuses hard-swish-fix into conv2d-fix), so they join the
convolution's group instead of splitting the graph; the program runs them as a lookup on codes.
FixNeuron models stay bit-exact against their fake-quantized run. QDQ models group the same way, but
their QuantizeLinear rounds ties to even where the DPU rounds activations half up (``dpu-b4096.toml``
``activation_round_mode``), so there the NPU may differ by one code at a tie, as any DPU program run
on a QDQ model does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import zonnx
from zonnx.backend.compile_api import compile_model
from zonnx.backend.partition import propose
from zonnx.build_npu import target_quantize_kwargs
from zonnx.ir.io import load_model
from zonnx.quantization.calibration.readers import ListReader
from zonnx.quantization.enums import QuantFormat
from zonnx.verify import ort_session


def _conv_hardswish(shared: bool = False) -> onnx.ModelProto:
    """x -> Conv -> HardSwish -> Conv -> HardSigmoid -> Conv -> y; with ``shared`` the first Conv's
    output is also a second output (another reader: the activation cannot stay inside)."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["c1"], ["h1"], name="hswish"),
        helper.make_node("Conv", ["h1", "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("HardSigmoid", ["c2"], ["h2"], name="hsigmoid", alpha=1.0 / 6, beta=0.5),
        helper.make_node("Conv", ["h2", "w3", "b3"], ["y"], name="conv3"),
    ]
    rng = np.random.default_rng(5)  # its own draw, whichever tests ran before
    shapes = {"w1": (8, 3, 3, 3), "b1": (8,), "w2": (8, 8, 1, 1), "b2": (8,), "w3": (4, 8, 1, 1), "b3": (4,)}
    inits = [
        onnx.numpy_helper.from_array((rng.standard_normal(s) * 0.4).astype(np.float32), n)
        for n, s in shapes.items()
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])]
    if shared:
        outputs.append(helper.make_tensor_value_info("c1", TensorProto.FLOAT, [1, 8, 8, 8]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])], outputs, inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


def _feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((1, 3, 8, 8)) * 2).astype(np.float32)} for _ in range(n)]


def _quantized(folder: Path, fmt: QuantFormat | None, shared: bool = False) -> Path:
    out = folder / f"hswish_{'qdq' if fmt else 'fix'}{'_shared' if shared else ''}.onnx"
    kwargs = target_quantize_kwargs("dpu-b4096", fmt)
    kwargs["extra_options"].update(BiasCorrection=False, IncludeCLE=False)
    zonnx.quantize_static(_conv_hardswish(shared), out, ListReader(_feeds(4, seed=6)), **kwargs)
    return out


@pytest.mark.parametrize("fmt", [None, QuantFormat.QDQ], ids=["fixneuron", "qdq"])
def test_hard_activations_join_the_convolution_and_run_exactly(
    tmp_path: Path, fmt: QuantFormat | None
) -> None:
    qpath = _quantized(tmp_path, fmt)
    cap = propose(load_model(qpath), "dpu-b4096")
    for act, conv in (("hswish", "conv1"), ("hsigmoid", "conv2")):
        verdict = cap.nodes[act]
        assert (verdict.role, verdict.group, verdict.supported) == ("activation", conv, True), verdict
        assert cap.nodes[conv].reason == f"dpu-b4096 conv2d + {cap.nodes[act].op_type}"
    compiled = compile_model(qpath, "dpu-b4096")
    assert (
        compiled.partition.num_subgraphs == 1 and compiled.partition.npu_ops == compiled.partition.total_ops
    )
    assert sum(op.kind == "lut" for p in compiled.programs for op in p.ops) == 2
    if fmt is not None:
        return  # QDQ: ties round differently on the DPU (module docstring); the grouping is what is checked
    sess = zonnx.InferenceSession(
        str(qpath),
        providers=["ZonnxNPUExecutionProvider"],
        provider_options=[{"target": "dpu-b4096", "cache_dir": str(tmp_path / "cache")}],
    )
    fake = ort_session(onnx.load(str(qpath)))
    for feed in _feeds(3, seed=7):
        np.testing.assert_array_equal(sess.run(None, feed)[0], fake.run(None, feed)[0])


def test_a_convolution_output_read_elsewhere_keeps_the_activation_apart(tmp_path: Path) -> None:
    """The first Conv's output is also a graph output: its quantized codes leave the NPU, so the HardSwish
    reading them is an op of its own, which the DPU's table does not have."""
    cap = propose(load_model(_quantized(tmp_path, None, shared=True)), "dpu-b4096")
    assert cap.nodes["hswish"].role == "op" and cap.nodes["hswish"].rule == "op_type"
    assert cap.nodes["hsigmoid"].role == "activation" and cap.nodes["hsigmoid"].supported
