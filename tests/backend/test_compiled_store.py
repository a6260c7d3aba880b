"""Compiled models saved with external data: weights and the stored executable in NAME.onnx.data.

The real paths run on the digits CNN; ``ZONNX_PROTO_LIMIT`` lowers the 2 GiB limit so the automatic
choice is exercised on a small model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.backend.partition_models import quantize
from zonnx import zoo
from zonnx.backend.compile_api import CompiledModel, compile_model
from zonnx.backend.compiled import npu_nodes, read_program
from zonnx.backend.compiled_store import ALIGN, EXECUTABLE_KEY, needs_external
from zonnx.backend.session import InferenceSession
from zonnx.errors import ModelLoadError
from zonnx.ir.io import load_proto, save_model
from zonnx.zoo.digits import digits_data

NPU = ["ZonnxNPUExecutionProvider", "CPUExecutionProvider"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> CompiledModel:
    x, _ = digits_data("calib")
    feeds = [{"input": x[i : i + 1]} for i in range(16)]
    src = quantize(zoo.get("digits_cnn"), tmp_path_factory.mktemp("s") / "fix.onnx", feeds, "fix")
    return compile_model(src, "dpu-b4096")


def _session(path: Path, **extra: str) -> InferenceSession:
    return InferenceSession(path, providers=NPU, provider_options=[{"enable_cache": "0", **extra}, {}])


def _batch() -> dict[str, np.ndarray]:
    x, _ = digits_data("test")
    return {"input": x[:1]}


def test_small_models_stay_inline_and_byte_identical(compiled: CompiledModel, tmp_path: Path) -> None:
    assert not needs_external(compiled.model)
    path = compiled.save(tmp_path / "c.onnx")
    assert not (tmp_path / "c.onnx.data").exists()
    assert path.read_bytes() == save_model(compiled.model, tmp_path / "ref.onnx").read_bytes()


def test_external_save_runs_from_the_stored_executable(compiled: CompiledModel, tmp_path: Path) -> None:
    inline = compiled.save(tmp_path / "inline.onnx")
    ext = compiled.save(tmp_path / "ext.onnx", external_data=True)
    assert ext.stat().st_size < 20_000 < (tmp_path / "ext.onnx.data").stat().st_size
    light = onnx.load(ext, load_external_data=False)
    for node in npu_nodes(light):  # programs are UINT8 tensors whose bytes lie in the data file, aligned
        tensor = next(a.t for a in node.attribute if a.name == "program")
        offset = int({e.key: e.value for e in tensor.external_data}["offset"])
        assert tensor.data_location == onnx.TensorProto.EXTERNAL and offset % ALIGN == 0
    again = CompiledModel.from_proto(load_proto(ext))  # loaded: the programs read back byte for byte
    assert [p.to_bytes() for p in again.programs] == [p.to_bytes() for p in compiled.programs]
    want = _session(inline).run(None, _batch())[0]
    sess = _session(ext)
    assert sess.executable == "stored" and sess.partition.npu_nodes == compiled.partition.npu_nodes
    np.testing.assert_array_equal(sess.run(None, _batch())[0], want)
    assert read_program(npu_nodes(sess.compiled_model)[0]).to_bytes() == compiled.programs[0].to_bytes()
    ref = _session(ext, executor="reference")  # the numpy reference reads the programs from the data file
    assert ref.executable == "lowered"
    np.testing.assert_array_equal(ref.run(None, _batch())[0], want)


def test_proto_limit_makes_external_automatic(
    compiled: CompiledModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZONNX_PROTO_LIMIT", "20000")
    assert needs_external(compiled.model)
    compiled.save(tmp_path / "c.onnx")
    assert (tmp_path / "c.onnx.data").is_file()
    assert _session(tmp_path / "c.onnx").executable == "stored"


def test_executable_of_another_host_is_lowered_again(compiled: CompiledModel, tmp_path: Path) -> None:
    path = compiled.save(tmp_path / "c.onnx", external_data=True)
    want = _session(path).run(None, _batch())[0]
    model = onnx.load(path, load_external_data=False)
    prop = next(p for p in model.metadata_props if p.key == EXECUTABLE_KEY)
    prop.value = json.dumps({**json.loads(prop.value), "id": "another-host"})
    path.write_bytes(model.SerializeToString())
    sess = _session(path)
    assert sess.executable == "lowered"
    np.testing.assert_array_equal(sess.run(None, _batch())[0], want)


def test_truncated_or_missing_data_file_is_named(compiled: CompiledModel, tmp_path: Path) -> None:
    path = compiled.save(tmp_path / "c.onnx", external_data=True)
    data = tmp_path / "c.onnx.data"
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(ModelLoadError, match=r"c\.onnx\.data.*truncated"):
        _session(path)
    data.unlink()
    with pytest.raises(ModelLoadError, match=r"c\.onnx\.data"):
        _session(path)


def test_source_with_external_data_keeps_it(compiled: CompiledModel, tmp_path: Path) -> None:
    from zonnx.backend.compiled import compiled_info

    src = save_model(
        load_proto(compiled_info(compiled.model)["source"]), tmp_path / "q.onnx", external_data=True
    )
    again = compile_model(src, "dpu-b4096")
    assert again.external_data and again.wants_external() and not compiled.wants_external()
    again.save(tmp_path / "c.onnx")
    assert (tmp_path / "c.onnx.data").is_file() and _session(tmp_path / "c.onnx").executable == "stored"
