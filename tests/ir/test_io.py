"""Model I/O: every bad input gets a ZonnxError naming the file; saves are atomic and ORT-loadable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.helpers import parse
from zonnx.errors import ModelLoadError, ModelSaveError, UnsupportedModelError
from zonnx.ir.io import MAX_IR_VERSION, load_model, load_proto, save_model, to_proto

TINY = """
<ir_version: 8, opset_import: ["" : 17]>
tiny (float[1, 4] x) => (float[1, 4] y) {
    t = Add(x, bias)
    y = Relu(t)
}
"""


@pytest.fixture
def tiny() -> onnx.ModelProto:
    return parse(TINY, ("bias", np.arange(4, dtype=np.float32)))


@pytest.fixture
def tiny_file(tmp_path: Path, tiny: onnx.ModelProto) -> Path:
    path = tmp_path / "tiny.onnx"
    path.write_bytes(tiny.SerializeToString())
    return path


def test_load_roundtrip(tiny_file: Path) -> None:
    model = load_model(tiny_file)
    assert [n.op_type for n in model.graph] == ["Add", "Relu"]
    assert "bias" in model.graph.initializers


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "nope.onnx", "no such file"),
        (lambda d: d, "is a directory"),
        (lambda d: _write(d / "empty.onnx", b""), "is empty"),
        (lambda d: _write(d / "text.onnx", b"this is not a model at all\n" * 3), "not"),
    ],
)
def test_bad_files_name_the_file(tmp_path: Path, make, message: str) -> None:
    path = make(tmp_path)
    with pytest.raises(ModelLoadError, match=message) as info:
        load_proto(path)
    assert str(path) in str(info.value)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_truncated_model(tmp_path: Path) -> None:
    import zonnx.zoo

    data = zonnx.zoo.get("ppocr_cls").read_bytes()
    path = _write(tmp_path / "cut.onnx", data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated or not ONNX") as info:
        load_proto(path)
    assert "cut.onnx" in str(info.value)


def test_opset_and_ir_too_new(tmp_path: Path, tiny: onnx.ModelProto) -> None:
    tiny.opset_import[0].version = 99
    with pytest.raises(UnsupportedModelError, match="opset 99 is newer"):
        load_proto(_write(tmp_path / "new_opset.onnx", tiny.SerializeToString()))
    tiny.opset_import[0].version = 17
    tiny.ir_version = 99
    with pytest.raises(UnsupportedModelError, match="IR version 99"):
        load_proto(_write(tmp_path / "new_ir.onnx", tiny.SerializeToString()))


def test_opset_too_old(tmp_path: Path, tiny: onnx.ModelProto) -> None:
    tiny.opset_import[0].version = 5
    with pytest.raises(UnsupportedModelError, match="too old"):
        load_proto(_write(tmp_path / "old.onnx", tiny.SerializeToString()))


def test_save_clamps_ir_version_for_ort(tmp_path: Path, tiny: onnx.ModelProto) -> None:
    tiny.ir_version = 14  # what onnx 1.23 writes by default; ORT 1.31 refuses it
    out = save_model(tiny, tmp_path / "out.onnx")
    assert onnx.load(out).ir_version == MAX_IR_VERSION
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    y = sess.run(None, {"x": -np.ones((1, 4), np.float32)})[0]
    np.testing.assert_array_equal(y, [[0, 0, 1, 2]])


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path: Path, tiny: onnx.ModelProto) -> None:
    save_model(tiny, tmp_path / "a.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.onnx"]


def test_save_refuses_to_overwrite_input(tiny_file: Path, tiny: onnx.ModelProto) -> None:
    before = tiny_file.read_bytes()
    with pytest.raises(ModelSaveError, match="--inplace"):
        save_model(tiny, tiny_file, input_path=tiny_file)
    assert tiny_file.read_bytes() == before
    save_model(tiny, tiny_file, input_path=tiny_file, inplace=True)
    assert onnx.load(tiny_file).ir_version <= MAX_IR_VERSION


@pytest.mark.parametrize("where", ["missing_folder", "under_a_file", "directory", "proc"])
def test_unwritable_outputs(tmp_path: Path, tiny: onnx.ModelProto, where: str) -> None:
    target = {
        "missing_folder": tmp_path / "no" / "such" / "m.onnx",
        "under_a_file": _write(tmp_path / "file.txt", b"x") / "m.onnx",
        "directory": tmp_path,
        "proc": Path("/proc/zonnx-test.onnx"),
    }[where]
    with pytest.raises(ModelSaveError) as info:
        save_model(tiny, target)
    assert str(target) in str(info.value)
    assert not target.is_file()


def test_external_data_roundtrip_and_missing_data(tmp_path: Path, tiny: onnx.ModelProto) -> None:
    big = parse(TINY, ("bias", np.linspace(0, 1, 4, dtype=np.float32)))
    big.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(4096, np.float32), "unused_big"))
    out = save_model(big, tmp_path / "ext.onnx", external_data=True)
    data_file = tmp_path / "ext.onnx.data"
    assert data_file.is_file() and data_file.stat().st_size >= 4096 * 4
    reloaded = load_proto(out)
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(reloaded.graph.initializer[1]), np.ones(4096))
    data_file.unlink()
    with pytest.raises(ModelLoadError, match=r"ext\.onnx\.data not found"):
        load_proto(out)


def test_to_proto_from_ir_keeps_metadata() -> None:
    import zonnx.zoo

    model = load_model(zonnx.zoo.get("ppocr_rec"))
    proto = to_proto(model)
    assert "character" in {p.key for p in proto.metadata_props}
    assert proto.ir_version <= MAX_IR_VERSION


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_follow_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    """Reports, arrays and cache files get the mode any tool's output gets (issue 17, item 11)."""
    import os

    from zonnx.ir.io import current_umask, write_bytes_atomic

    old = os.umask(umask)
    try:
        assert current_umask() == umask
        out = write_bytes_atomic(tmp_path / "report.json", b"{}")
    finally:
        os.umask(old)
    assert (out.stat().st_mode & 0o777) == mode
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporaries_of_a_killed_save_go_with_the_next_save(tmp_path: Path) -> None:
    """A save killed midway leaves ``.NAME.zonnx-PID.*``; the next save of that output removes what a dead
    writer left and keeps a live writer's (issue 17, item 8)."""
    import os

    from zonnx.ir.io import write_bytes_atomic

    model = parse('<ir_version: 10, opset_import: ["" : 17]> g (float[1] x) => (float[1] y) { y = Relu(x) }')
    dead = _dead_pid()
    left_dir = tmp_path / f".m.onnx.zonnx-{dead}.abc123"
    left_dir.mkdir()
    (left_dir / "m.onnx").write_bytes(b"partial")
    left_file = tmp_path / f".m.onnx.zonnx-{dead}.xyz"
    left_file.write_bytes(b"partial")
    live = tmp_path / f".m.onnx.zonnx-{os.getpid()}.live"
    live.write_bytes(b"being written")
    other = tmp_path / ".m.onnx.not-ours"
    other.write_bytes(b"someone else's")
    save_model(model, tmp_path / "m.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.onnx", live.name, other.name])
    (tmp_path / f".r.json.zonnx-{dead}.q").write_bytes(b"x")
    write_bytes_atomic(tmp_path / "r.json", b"{}")
    assert not list(tmp_path.glob(".r.json.*"))
