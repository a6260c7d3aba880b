"""Tests for the partitioner: subgraph counts, boundaries, convexity, min_nodes and the report."""

from __future__ import annotations

import json

import pytest

import zonnx.zoo
from tests.backend.partition_models import Models, acyclic, diamond_model
from zonnx.backend.partition import format_partition, partition, propose, to_dict
from zonnx.errors import OptionError
from zonnx.ir.io import load_model

TARGETS = ("dpu-b4096", "zhouyi-x2", "bm1684x")


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return Models(tmp_path_factory.mktemp("partition_models"))


def test_digits_fixneuron_is_one_subgraph_on_dpu_and_bm(models: Models) -> None:
    model = load_model(models.get("digits_cnn", "fix"))
    for target in ("dpu-b4096", "bm1684x"):
        part = partition(model, propose(model, target))
        assert part.num_subgraphs == 1 and not part.cpu_nodes
        (sg,) = part.subgraphs
        # 15 ops (5 Conv, 5 Relu, Add, MaxPool, Concat, Flatten, Gemm) + 10 output FixNeurons + 13 copied
        assert (sg.ops, len(sg.node_names), part.npu_nodes, part.total_nodes) == (15, 38, 38, 38)
        assert sg.inputs == ["input"] and sg.outputs == ["logits"]
        assert sg.macs == part.total_macs == 366_592 and part.mac_share == 1.0


def test_digits_zhouyi_splits_at_the_add(models: Models) -> None:
    model = load_model(models.get("digits_cnn", "fix"))
    part = partition(model, propose(model, "zhouyi-x2"))
    assert [s.ops for s in part.subgraphs] == [5, 8]
    assert part.subgraphs[0].outputs == ["/stem/stem.2/Relu_output_0_fix", "/res/res.3/Conv_output_0_fix"]
    assert part.subgraphs[1].inputs == ["/Relu_output_0_fix"]
    assert set(part.cpu_nodes) == {"/Add", "/Relu", "/Relu_output_0_FixNeuron"}
    assert part.rules["/Add"] == "activation" and acyclic(model, part)


def test_digits_qdq_boundaries_are_integer_tensors(models: Models) -> None:
    model = load_model(models.get("digits_cnn", "qdq"))
    part = partition(model, propose(model, "bm1684x"))
    assert part.num_subgraphs == 1
    (sg,) = part.subgraphs
    assert sg.inputs == ["input_QuantizeLinear_Output"] and sg.outputs == ["logits_QuantizeLinear_Output"]
    # 57 / 59 nodes: ORT's symmetric layout gives each of the 5 Relus a Q/DQ pair on its input too
    assert sg.ops == 15 and (part.npu_nodes, part.total_nodes) == (57, 59)
    assert part.rules == {"input_QuantizeLinear": "boundary", "logits_DequantizeLinear": "boundary"}
    assert "input_DequantizeLinear" in sg.node_names and "logits_QuantizeLinear" in sg.node_names
    dpu = partition(model, propose(model, "dpu-b4096"))  # float scales: nothing for a shift-only DPU
    assert dpu.num_subgraphs == 0 and dpu.rules["/fc/Gemm"] == "scale"


def test_diamond_is_split_not_cyclic(models: Models) -> None:
    model = load_model(diamond_model(models.folder / "diamond_fix.onnx"))
    cap = propose(model, "dpu-b4096")
    part = partition(model, cap, min_nodes=1)
    # A -> B (Softmax, CPU) -> D and A -> C -> D: {A, C, D} would need B both after and before it
    owner = {n: s.id for s in part.subgraphs for n in s.node_names if n in "ACD"}
    assert part.num_subgraphs == 2 and owner["A"] == owner["C"] != owner["D"]
    assert acyclic(model, part)
    assert part.rules["B"] == "op_type" and part.rules["E"] == "kernel"
    default = partition(model, cap)  # min_nodes=2: the lone Add goes back to the CPU
    assert default.num_subgraphs == 1 and default.subgraphs[0].ops == 2
    assert (
        default.cpu_nodes["D"] == "subgraph of 1 ops and 0 MACs is below the minimum 2 ops / 1,000,000 MACs"
    )
    assert default.rules["D"] == "min_nodes" and acyclic(model, default)


def test_min_nodes_threshold(models: Models) -> None:
    model = load_model(models.get("digits_cnn", "fix"))
    cap = propose(model, "zhouyi-x2")
    assert partition(model, cap, min_nodes=5).num_subgraphs == 2
    part = partition(model, cap, min_nodes=6)  # the 5-op subgraph goes back
    assert [s.ops for s in part.subgraphs] == [8]
    assert (
        part.cpu_nodes["/stem/stem.0/Conv"]
        == "subgraph of 5 ops and 304,128 MACs is below the minimum 6 ops / 1,000,000 MACs"
    )
    assert partition(model, cap, min_nodes=9).num_subgraphs == 0
    with pytest.raises(OptionError, match="min_nodes"):
        partition(model, cap, min_nodes=0)


def test_float_model_all_cpu() -> None:
    model = load_model(zonnx.zoo.get("digits_cnn"))
    part = partition(model, propose(model, "dpu-b4096"))
    assert part.num_subgraphs == 0 and part.npu_nodes == 0 and len(part.cpu_nodes) == len(model.graph)
    assert set(part.rules.values()) == {"not_quantized"}


@pytest.mark.parametrize("target", TARGETS)
def test_resnet18(models: Models, target: str) -> None:
    model = load_model(models.get("resnet18-random", "fix"))
    part = partition(model, propose(model, target))
    assert acyclic(model, part) and part.total_ops == 50 and part.total_macs == 1_814_073_344
    if target == "zhouyi-x2":  # every residual Add + Relu stays on the CPU
        assert all(part.rules[n] == "activation" for n in part.cpu_nodes if n.endswith("/Add"))
        # the lone 1x1 downsample convolutions (6.4M MACs each) are worth the NPU by cost (min_macs)
        assert part.num_subgraphs == 12 and part.mac_share == 1.0
    else:
        assert part.num_subgraphs == 1 and part.npu_ops == 50 and part.mac_share == 1.0


def test_resnet18_qdq_on_bm1684x(models: Models) -> None:
    model = load_model(models.get("resnet18-random", "qdq"))
    part = partition(model, propose(model, "bm1684x"))
    assert part.num_subgraphs == 1 and part.npu_ops == part.total_ops == 49
    assert set(part.cpu_nodes) == {"input_QuantizeLinear", "logits_DequantizeLinear"}


@pytest.mark.parametrize(
    "name,form,shape", [("ppocr_cls", "qdq", (1, 3, 48, 192)), ("ppocr_rec", "fix", (1, 3, 48, 320))]
)
def test_ppocr(models: Models, name: str, form: str, shape: tuple[int, ...]) -> None:
    model = load_model(models.get(name, form, samples=2))
    for target in TARGETS:
        cap = propose(model, target, input_shapes={"x": shape})
        part = partition(model, cap)
        assert acyclic(model, part), target
        assert part.npu_nodes + sum(1 for n in part.cpu_nodes if not part.subgraph_of(n)) == part.total_nodes
        # the size rule: at least min_nodes ops, or one op worth the round trip (min_macs)
        assert all(s.ops >= part.min_nodes or s.macs >= part.min_macs for s in part.subgraphs)
        if target == "dpu-b4096" and form == "fix":
            assert part.num_subgraphs > 10 and part.mac_share > 0.9
            # HardSwish (fused from paddle2onnx's four nodes when quantizing for a target) is an activation
            # the DPU applies to a convolution's int8 result: each joins its convolution's group
            hswish = [v for v in cap.nodes.values() if v.op_type == "HardSwish"]
            assert len(hswish) >= 20 and all(v.role == "activation" and v.supported for v in hswish)
            assert not any("HardSwish" in n for n in part.cpu_nodes)


def test_report(models: Models) -> None:
    model = load_model(models.get("digits_cnn", "fix"))
    part = partition(model, propose(model, "zhouyi-x2"))
    data = json.loads(json.dumps(to_dict(part)))
    assert data["summary"]["subgraphs"] == 2 and data["summary"]["npu_ops"] == 13
    assert data["summary"]["cpu_by_rule"] == {"activation": 1, "not_quantized": 2}
    assert data["cpu_nodes"][0]["node"] == "/Add" and data["subgraphs"][1]["inputs"] == ["/Relu_output_0_fix"]
    text = format_partition(part)
    assert "zhouyi-x2: 2 NPU subgraph(s); 35/38 nodes (13/15 ops) and 100.0% of 366,592 MACs" in text
    assert "activation (1)" in text and "not_quantized (2)" in text


def test_capability_must_match_model(models: Models) -> None:
    cap = propose(load_model(zonnx.zoo.get("digits_cnn")), "dpu-b4096")
    with pytest.raises(OptionError, match="run propose"):
        partition(load_model(models.get("digits_cnn", "fix")), cap)
