"""The bad-input corpus (issue 17): broken models, data files, target files and option values, built by
code, each run through every command it applies to, the Python API and ``zonnx.InferenceSession``.

Every case must end in a clean refusal (exit 2 on the CLI, a ``ZonnxError``/``ValueError`` in the API),
with no traceback, its inputs byte-identical and no file created. Commands run in-process in one
``bench.fuzz_inputs.CliWorker`` (a real CLI invocation without the interpreter start-up), so the
corpus stays cheap enough for CI.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from bench.fuzz_inputs import CliWorker, make_seeds

ModelEdit = Callable[[bytes], bytes]

#: commands reading a float model {M}; those reading the quantized one {Q}; {C} calibration, {T} target.
FLOAT_COMMANDS = [
    ["inspect", "{M}"],
    ["optimize", "{M}", "{D}/o.onnx"],
    ["quantize", "{M}", "{D}/q.onnx", "--calib", "{C}"],
    ["build", "{M}", "-o", "{D}/out", "--calib", "{C}", "--no-verify"],
    ["@quantize_static", "{M}", "{D}/q.onnx", "{C}"],
]
QUANT_COMMANDS = [
    ["compile", "{Q}", "-o", "{D}/c.onnx", "--target", "{T}"],
    ["run", "{Q}", "--target", "{T}", "-i", "{C}", "-o", "{D}/y.npz"],
    ["profile", "{Q}", "--target", "{T}"],
    ["@session", "{Q}", "{T}", "{C}"],
]
CALIB_COMMANDS = [
    FLOAT_COMMANDS[2],
    FLOAT_COMMANDS[3],
    FLOAT_COMMANDS[4],
    QUANT_COMMANDS[1],
    QUANT_COMMANDS[3],
]
TARGET_COMMANDS = [
    ["quantize", "{M}", "{D}/q.onnx", "--calib", "{C}", "--target", "{T}"],
    QUANT_COMMANDS[0],
    QUANT_COMMANDS[2],
    QUANT_COMMANDS[3],
]


def _proto_edit(edit: Callable[[onnx.ModelProto], None]) -> ModelEdit:
    def apply(data: bytes) -> bytes:
        model = onnx.ModelProto.FromString(data)
        edit(model)
        return model.SerializeToString()

    return apply


def _first_conv(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == "Conv")


def _weight(model: onnx.ModelProto) -> onnx.TensorProto:
    return next(t for t in model.graph.initializer if len(t.dims) == 4)


def _dup_writer(model: onnx.ModelProto) -> None:
    model.graph.node[1].output[0] = model.graph.node[0].output[0]


def _cycle(model: onnx.ModelProto) -> None:
    """The first node reads the last node's output (which depends on it)."""
    model.graph.node[0].input[0] = model.graph.node[-1].output[0]


def _external(model: onnx.ModelProto) -> None:
    t = _weight(model)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="weights.bin")


def _bad_utf8(field: str) -> ModelEdit:
    def apply(data: bytes) -> bytes:
        model = onnx.ModelProto.FromString(data)
        name = {"node": model.graph.node[0].name, "input": model.graph.input[0].name}.get(field)
        if field == "initializer":
            name = _weight(model).name
        if field == "output":
            name = model.graph.output[0].name
        if field == "attribute":
            name = _first_conv(model).attribute[0].name
        if field == "domain":
            model.opset_import.add(domain="cccc.AA", version=1)
            data, name = model.SerializeToString(), "cccc.AA"
        else:
            data = model.SerializeToString()
        raw = name.encode()
        return data.replace(raw, raw[:-2] + b"\xff\xfe")

    return apply


def _wrong_field_type(data: bytes) -> bytes:
    """Field 7 (graph) once more, holding bytes that are not a GraphProto: protobuf cannot parse it."""
    return data + b"\x3a\x03abc"


MODEL_CASES: dict[str, ModelEdit] = {
    "empty file": lambda data: b"",
    "truncated": lambda data: data[: len(data) // 2],
    "random bytes": lambda data: np.random.default_rng(0).integers(0, 256, len(data), np.uint8).tobytes(),
    "not a model": lambda data: b"<html>404 not found</html>\n",
    "wrong field type": _wrong_field_type,
    "no graph": _proto_edit(lambda m: m.ClearField("graph")),
    "ir version too new": _proto_edit(lambda m: setattr(m, "ir_version", 99)),
    "opset too new": _proto_edit(lambda m: setattr(m.opset_import[0], "version", 99)),
    "duplicate writer": _proto_edit(_dup_writer),
    "cycle": _proto_edit(_cycle),
    "dangling input": _proto_edit(lambda m: _first_conv(m).input.__setitem__(0, "nowhere")),
    "missing external data": _proto_edit(_external),
    "weights shorter than shape": _proto_edit(lambda m: _weight(m).dims.__setitem__(0, 999)),
    "undefined element type": _proto_edit(lambda m: setattr(_weight(m), "data_type", 0)),
    "attribute of the wrong type": _proto_edit(
        lambda m: setattr(_first_conv(m).attribute[0], "type", onnx.AttributeProto.STRING)
    ),
    "too many inputs": _proto_edit(lambda m: _first_conv(m).input.extend(["a", "b"])),
    **{
        f"invalid UTF-8 {field}": _bad_utf8(field)
        for field in ("node", "input", "output", "initializer", "attribute", "domain")
    },
}


def _npz(**arrays: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


def _pickled() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf, zf.open("input.npy", "w") as f:
        np.save(f, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return out.getvalue()


#: NaN feeds are refused for calibration; ``run`` on NaN inputs is the user's experiment
CALIB_ONLY = {"NaN values"}
CALIB_CASES: dict[str, Callable[[bytes], bytes]] = {
    "empty file": lambda data: b"",
    "truncated": lambda data: data[: len(data) // 3],
    "garbage": lambda data: b"\x93NUMPY garbage" * 10,
    "pickled objects": lambda data: _pickled(),
    "empty archive": lambda data: _npz(),
    "wrong input name": lambda data: _npz(pixels=np.zeros((2, 1, 8, 8), np.float32)),
    "wrong shape": lambda data: _npz(input=np.zeros((2, 3), np.float32)),
    "NaN values": lambda data: _npz(input=np.full((2, 1, 8, 8), np.nan, np.float32)),
    "complex values": lambda data: _npz(input=np.zeros((2, 1, 8, 8), np.complex64)),
}

#: every number of the target's [hardware] table, set to a value outside its range
HARDWARE_KEYS = [
    "clock_mhz", "macs_per_cycle", "pixel_parallel", "input_channel_parallel", "output_channel_parallel",
    "channel_parallel", "bank_depth", "bank_num", "cores", "activation_buffer_bytes", "weight_buffer_bytes",
    "onchip_memory_bytes", "global_memory_bytes", "ddr_bandwidth_gbps", "accumulator_bits",
]  # fmt: skip


def _target_case(key: str, value: str) -> Callable[[bytes], bytes]:
    def apply(data: bytes) -> bytes:
        head, table = data.decode().split("[hardware]\n", 1)
        table, count = re.subn(rf"(?m)^{key} = [^#\n]*", f"{key} = {value} ", table, count=1)
        assert count == 1, key
        return (head + "[hardware]\n" + table).encode()

    return apply


TARGET_CASES = {
    f"{key} = {value}": _target_case(key, value) for key in HARDWARE_KEYS for value in ("0", "-1")
}
TARGET_CASES |= {
    "clock_mhz = nan": _target_case("clock_mhz", "nan"),
    "cores = 1e30": _target_case("cores", "1e30"),
}

#: option values no command can honour: (command, the options)
OPTION_CASES = [
    ["compile", "{Q}", "-o", "{D}/c.onnx", "--min-nodes", "-3"],
    ["profile", "{Q}", "--clock-mhz", "0"],
    ["profile", "{Q}", "--clock-mhz", "nan"],
    ["optimize", "{M}", "{D}/o.onnx", "--opset", "999"],
    ["optimize", "{M}", "{D}/o.onnx", "--passes", "no-such-pass"],
    ["quantize", "{M}", "{D}/q.onnx", "--calib", "{C}", "--target", "no-such-npu"],
    ["run", "{Q}", "--target", "{T}", "--tol-cos", "7", "--compare", "golden", "--float-model", "{M}"],
    ["run", "{Q}", "--target", "{T}", "--compare", "silver"],
    ["build", "{M}", "-o", "{D}/out", "--calib", "{C}", "--opset", "3"],
]


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_seeds(tmp_path_factory.mktemp("seeds"))


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory):
    cache = tmp_path_factory.mktemp("npu-cache")
    w = CliWorker(dict(os.environ, ZONNX_CACHE_DIR=str(cache)))
    yield w
    w.close()


def _run_case(
    worker: CliWorker, seeds: dict[str, Path], folder: Path, template: list[str], broken: dict[str, bytes]
) -> None:
    """Copy the seeds into ``folder`` (``broken`` replacing some), run ``template`` and apply the rules."""
    folder.mkdir()
    paths = {}
    for key, seed in seeds.items():
        paths[key] = folder / seed.name
        if key in broken:
            paths[key].write_bytes(broken[key])
        else:
            shutil.copyfile(seed, paths[key])
    digests = {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in paths.items()}
    listing = sorted(p.name for p in folder.iterdir())
    args = [a.format(**{k: str(p) for k, p in paths.items()}, D=str(folder)) for a in template]
    answer = worker.run(args, folder, timeout=120)
    assert answer is not None, f"zonnx {' '.join(args)}: hung"
    assert answer["traceback"] is None, answer["traceback"]
    assert answer["exit"] == 2, (args, answer["exit"], answer["stderr"])
    assert "Traceback" not in answer["stderr"]
    assert {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in paths.items()} == digests
    assert sorted(p.name for p in folder.iterdir()) == listing


@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_broken_models(worker: CliWorker, seeds: dict[str, Path], tmp_path: Path, case: str) -> None:
    for i, template in enumerate(FLOAT_COMMANDS + QUANT_COMMANDS):
        if case == "missing external data" and template[0] == "inspect":
            continue  # inspect reads no tensor data: it summarizes and notes the missing file
        key = "M" if template in FLOAT_COMMANDS else "Q"
        broken = {key: MODEL_CASES[case](seeds[key].read_bytes())}
        _run_case(worker, seeds, tmp_path / str(i), template, broken)


@pytest.mark.parametrize("case", sorted(CALIB_CASES))
def test_broken_data_files(worker: CliWorker, seeds: dict[str, Path], tmp_path: Path, case: str) -> None:
    broken = {"C": CALIB_CASES[case](seeds["C"].read_bytes())}
    commands = CALIB_COMMANDS[:3] if case in CALIB_ONLY else CALIB_COMMANDS
    for i, template in enumerate(commands):
        _run_case(worker, seeds, tmp_path / str(i), template, broken)


@pytest.mark.parametrize("case", sorted(TARGET_CASES))
def test_target_numbers_out_of_range(
    worker: CliWorker, seeds: dict[str, Path], tmp_path: Path, case: str
) -> None:
    broken = {"T": TARGET_CASES[case](seeds["T"].read_bytes())}
    for i, template in enumerate(TARGET_COMMANDS):
        _run_case(worker, seeds, tmp_path / str(i), template, broken)


@pytest.mark.parametrize("template", OPTION_CASES, ids=lambda t: " ".join(a for a in t if "{" not in a))
def test_absurd_option_values(
    worker: CliWorker, seeds: dict[str, Path], tmp_path: Path, template: list[str]
) -> None:
    _run_case(worker, seeds, tmp_path / "case", template, {})


def test_the_corpus_covers_every_command() -> None:
    names = {t[0] for t in FLOAT_COMMANDS + QUANT_COMMANDS}
    assert names == {
        "inspect",
        "optimize",
        "quantize",
        "build",
        "compile",
        "run",
        "profile",
        "@session",
        "@quantize_static",
    }
    assert len(MODEL_CASES) >= 20 and len(TARGET_CASES) >= 30
