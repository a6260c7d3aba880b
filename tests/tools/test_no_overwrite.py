"""No command overwrites one of its inputs: every form the reliability issue reproduced (item 1) now exits 2
with one line naming both paths, writes nothing, and leaves the input byte-identical."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import zonnx
from tests.helpers import assert_one_line_error, run_cli
from zonnx import zoo
from zonnx.errors import OptionError
from zonnx.paths import refuse_overwrites
from zonnx.quantization.calibration.readers import ListReader
from zonnx.zoo.digits import digits_data


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("paths")
    flt = d / "float.onnx"
    shutil.copy(zoo.get("digits_cnn"), flt)
    x, _ = digits_data("calib")
    quant = d / "q.onnx"
    zonnx.quantize_static(str(flt), str(quant), ListReader([{"input": x[i : i + 1]} for i in range(8)]))
    feeds = d / "a.npz"
    np.savez(feeds, input=x[:2])
    calib = d / "c.npz"
    np.savez(calib, input=x[:8])
    return {"float": flt, "quant": quant, "feeds": feeds, "calib": calib}


def _forms(f: dict[str, Path]) -> dict[str, tuple[list[str], Path]]:
    """(command line, the input it would destroy) for each reproduced form."""
    q, flt, a, c = (str(f[k]) for k in ("quant", "float", "feeds", "calib"))
    golden = ["--compare", "golden", "--float-model", flt]
    return {
        "run -i a -o a": (["run", q, "-i", a, "-o", a], f["feeds"]),
        "run -o MODEL": (["run", q, "-i", a, "-o", q], f["quant"]),
        "run --report INPUTS": (["run", q, "-i", a, *golden, "--report", a], f["feeds"]),
        "run --report FLOAT": (["run", q, "-i", a, *golden, "--report", flt], f["float"]),
        "run --report MODEL": (["run", q, "-i", a, *golden, "--report", q], f["quant"]),
        "run -o FLOAT --float-model FLOAT": (["run", q, "-i", a, *golden, "-o", flt], f["float"]),
        "quantize OUT = --calib": (["quantize", flt, c, "--calib", c], f["calib"]),
        "quantize --save-stats = --calib": (
            ["quantize", flt, str(f["quant"].parent / "new.onnx"), "--calib", c, "--save-stats", c],
            f["calib"],
        ),
        "optimize OUT = --inputs": (["optimize", flt, a, "--verify", "--inputs", a], f["feeds"]),
    }


@pytest.mark.parametrize("form", list(_forms({k: Path(k) for k in ("quant", "float", "feeds", "calib")})))
def test_an_output_never_overwrites_an_input(files: dict[str, Path], form: str) -> None:
    args, victim = _forms(files)[form]
    folder = sorted(p.name for p in files["quant"].parent.iterdir())
    before = victim.read_bytes()
    proc = run_cli(*args)
    assert_one_line_error(proc, "is the same file as", str(victim), "choose another output path")
    assert victim.read_bytes() == before
    assert sorted(p.name for p in files["quant"].parent.iterdir()) == folder  # nothing written


def _save_with_external_data(path: Path, location: str) -> None:
    """A one-MatMul model whose weights live in ``location`` beside it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, path, save_as_external_data=True, location=location, size_threshold=0)


def test_links_and_external_data_count_as_the_input(tmp_path: Path) -> None:
    data = tmp_path / "w.bin"
    data.write_bytes(b"\0" * 8)
    link = tmp_path / "link.npz"
    link.symlink_to(data)
    with pytest.raises(OptionError, match="same file as --inputs"):
        refuse_overwrites({"--inputs": data}, {"--output": link})
    hard = tmp_path / "hard.npz"
    hard.hardlink_to(data)
    with pytest.raises(OptionError, match="same file as --inputs"):
        refuse_overwrites({"--inputs": data}, {"--output": hard})
    _save_with_external_data(tmp_path / "m.onnx", "m.weights")
    with pytest.raises(OptionError, match=r"MODEL \(external data\)"):
        refuse_overwrites({"MODEL": tmp_path / "m.onnx"}, {"--report": tmp_path / "m.weights"})
    refuse_overwrites({"MODEL": tmp_path / "m.onnx"}, {"--report": tmp_path / "other.json", "--x": None})


def test_convert_never_writes_over_its_sources_external_data(tmp_path: Path) -> None:
    """``convert src.onnx -o dst.onnx`` would write dst.onnx.data: refused when that is src's weights file."""
    src = tmp_path / "src.onnx"
    _save_with_external_data(src, "dst.onnx.data")
    weights = (tmp_path / "dst.onnx.data").read_bytes()
    proc = run_cli("convert", str(src), "-o", str(tmp_path / "dst.onnx"))
    assert_one_line_error(proc, "dst.onnx.data", "is the same file as SOURCE (external data)")
    assert (tmp_path / "dst.onnx.data").read_bytes() == weights
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst.onnx.data", "src.onnx"]


def test_build_never_writes_over_its_model(tmp_path: Path) -> None:
    """A model kept where the build writes its report: refused before any work, the model intact."""
    out = tmp_path / "out"
    out.mkdir()
    model = out / "report.json"
    shutil.copy(zoo.get("digits_cnn"), model)
    before = model.read_bytes()
    proc = run_cli("build", str(model), "-o", str(out), "--no-deploy")
    assert_one_line_error(proc, "report.json", "is the same file as MODEL")
    assert model.read_bytes() == before and [p.name for p in out.iterdir()] == ["report.json"]
