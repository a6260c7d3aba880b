"""Names that are not valid UTF-8 (node, tensor, graph input, initializer, attribute, opset domain) give one
line naming the field in every command and in the Python API, never a traceback (issue 17, item 2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import assert_one_line_error, run_cli
from zonnx.errors import ZonnxError

_MARK = b"\xff\xfe"


def _model_with_bad(field: str, folder: Path) -> Path:
    """A valid two-node model, then the bytes of one name replaced by invalid UTF-8 of the same length."""
    node = helper.make_node("Add", ["x", "wwwwAA"], ["tttttt"], name="nnnnAA")
    relu = helper.make_node("LeakyRelu", ["tttttt"], ["y"], name="relu", alpha=0.1)
    graph = helper.make_graph(
        [node, relu],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.ones((1, 4), np.float32), "wwwwAA")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("cccc.AA", 1)]
    )
    model.ir_version = 10
    data = model.SerializeToString()
    text = {"node": b"nnnnAA", "tensor": b"tttttt", "initializer": b"wwwwAA", "domain": b"cccc.AA"}.get(field)
    if field == "attribute":
        data = data.replace(b"alpha", b"alp" + _MARK)
    else:
        data = data.replace(text, text[: -len(_MARK)] + _MARK)
    path = folder / f"bad_{field}.onnx"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("field", ["node", "tensor", "initializer", "attribute", "domain"])
def test_inspect_names_the_field(tmp_path: Path, field: str) -> None:
    path = _model_with_bad(field, tmp_path)
    assert_one_line_error(run_cli("inspect", str(path)), str(path), "is not valid UTF-8")


@pytest.mark.parametrize(
    "args",
    [
        ["optimize", "{m}", "{d}/o.onnx"],
        ["quantize", "{m}", "{d}/q.onnx", "--calib", "{d}"],
        ["compile", "{m}", "-o", "{d}/c.onnx"],
        ["run", "{m}"],
        ["profile", "{m}"],
        ["build", "{m}", "-o", "{d}/out"],
    ],
    ids=lambda a: a[0],
)
def test_every_command_gives_one_line(tmp_path: Path, args: list[str]) -> None:
    path = _model_with_bad("tensor", tmp_path)
    before = path.read_bytes()
    proc = run_cli(*[a.format(m=path, d=tmp_path) for a in args])
    assert_one_line_error(proc, "is not valid UTF-8")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_python_api_raises_a_zonnx_error(tmp_path: Path) -> None:
    import zonnx

    path = _model_with_bad("node", tmp_path)
    with pytest.raises(ZonnxError, match="not valid UTF-8"):
        zonnx.InferenceSession(
            path.read_bytes(), providers=["ZonnxNPUExecutionProvider", "CPUExecutionProvider"]
        )
    with pytest.raises(ZonnxError, match="not valid UTF-8"):
        zonnx.quantize_static(str(path), str(tmp_path / "q.onnx"), None)
    assert onnx.ModelProto.FromString(path.read_bytes()).graph.node[0].name.startswith(b"nnnn")


def _two_writers(folder: Path) -> Path:
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["y"], name="a"),
            helper.make_node("Sigmoid", ["x"], ["y"], name="b"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = folder / "two_writers.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("command", ["inspect", "compile", "run", "profile", "optimize"])
def test_a_tensor_with_two_writers_is_named(tmp_path: Path, command: str) -> None:
    """Two nodes writing one tensor (issue 17, item 3): one line naming the tensor and both writers."""
    path = _two_writers(tmp_path)
    extra = [str(tmp_path / "o.onnx")] if command == "optimize" else []
    proc = run_cli(command, str(path), *extra)
    assert_one_line_error(proc, "tensor 'y' is written by node 'a' (Relu) and by node 'b' (Sigmoid)")
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def _miswired(folder: Path, case: str) -> Path:
    nodes = {
        "dangling": [helper.make_node("Add", ["x", "ghost"], ["y"], name="add")],
        "unsorted": [helper.make_node("Relu", ["t"], ["y"], name="late"), helper.make_node("Neg", ["x"], ["t"], name="early")],
        "cycle": [helper.make_node("Add", ["x", "u"], ["t"], name="a"), helper.make_node("Relu", ["t"], ["u"], name="b"),
                  helper.make_node("Identity", ["t"], ["y"], name="c")],
        "no_writer": [helper.make_node("Relu", ["x"], ["t"], name="r")],
    }[case]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = folder / f"{case}.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        ("dangling", "reads 'ghost', which no node, input or initializer produces"),
        ("unsorted", "node 'late' (Relu) reads 't' before node 'early' writes it"),
        ("cycle", "node 'a' (Add) depends on its own output through a cycle"),
        ("no_writer", "graph output 'y' is produced by no node"),
    ],
)
@pytest.mark.parametrize("command", ["inspect", "optimize"])
def test_invalid_graphs_are_called_invalid(tmp_path: Path, case: str, fragment: str, command: str) -> None:
    """optimize no longer writes a checker-failing model from an invalid one, and inspect reports the same
    problem (issue 17, item 12)."""
    path = _miswired(tmp_path, case)
    extra = [str(tmp_path / "o.onnx")] if command == "optimize" else []
    assert_one_line_error(run_cli(command, str(path), *extra), fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
