"""``zonnx convert`` as a user runs it: model.py:Class, TorchScript, torch.export, ONNX with a cut, folded
preprocessing, a torch-quantized model then ``zonnx inspect``, and every bad input as one line, no file."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from tests.helpers import assert_one_line_error, run_cli
from zonnx import zoo

MODELS = textwrap.dedent(
    """
    import torch
    import torch.ao.quantization as tq
    from torch import nn


    class Net(nn.Module):
        def __init__(self, num_classes=5):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
            self.head = nn.Linear(8, num_classes)

        def forward(self, image):
            return self.head(self.body(image).mean(dim=(2, 3)))


    class NeedsArgs(nn.Module):
        def __init__(self, num_classes, width=4):
            super().__init__()
            self.lin = nn.Linear(width, num_classes)

        def forward(self, x):
            return self.lin(x)


    class Head(nn.Module):
        def forward(self, x):
            return torch.erfinv(torch.tanh(x))


    class Unexportable(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.head = nn.Linear(4, 4), Head()

        def forward(self, x):
            return self.head(self.lin(x))


    class Noisy(nn.Module):
        def forward(self, x):
            return x + torch.rand_like(x)


    class QNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
            self.conv, self.relu = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            x = self.relu(self.conv(self.quant(x)))
            return self.dequant(self.fc(x.mean(dim=(2, 3))))


    def quantized():
        torch.backends.quantized.engine = "fbgemm"
        torch.manual_seed(0)
        model = tq.fuse_modules(QNet().eval(), [["conv", "relu"]])
        model.qconfig = tq.get_default_qconfig("fbgemm")
        prepared = tq.prepare(model)
        with torch.no_grad():
            for _ in range(8):
                prepared(torch.randn(4, 3, 16, 16))
        return tq.convert(prepared)
    """
)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with models.py, a TorchScript .pt, a torch.export .pt2 and broken files."""
    d = tmp_path_factory.mktemp("convert_cli")
    (d / "models.py").write_text(MODELS)
    import importlib.util

    spec = importlib.util.spec_from_file_location("cli_models", d / "models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    net = mod.Net().eval()
    torch.jit.script(net).save(str(d / "net.pt"))
    batch = torch.export.Dim("batch", min=1, max=32)
    program = torch.export.export(net, (torch.randn(2, 3, 16, 16),), dynamic_shapes={"image": {0: batch}})
    torch.export.save(program, d / "net.pt2")
    torch.save(net.state_dict(), d / "weights.pt")
    (d / "broken.onnx").write_bytes(zoo.get("ppocr_cls").read_bytes()[:50_000])
    (d / "broken.tflite").write_bytes(b"\x1c\x00\x00\x00NOPE" + bytes(64))
    (d / "not_a_saved_model").mkdir()
    (d / "not_a_saved_model" / "variables.txt").write_text("x")
    return d


def io_of(path: Path) -> tuple[list, list, dict]:
    model = onnx.load(path)
    assert model.ir_version <= 13
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    shapes = [[d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in model.graph.input]
    return [i.name for i in model.graph.input], shapes, {p.key: p.value for p in model.metadata_props}


def test_python_class_with_dynamic_batch(work: Path) -> None:
    out = work / "net.onnx"
    proc = run_cli("convert", "models.py:Net", "-o", str(out), "--input-shape", "image:1,3,16,16",
                   "--dynamic", "image:0=batch", cwd=str(work), check=True)  # fmt: skip
    assert "numeric check" in proc.stdout and "ops before / after" in proc.stdout
    row = next(line for line in proc.stdout.splitlines() if line.strip("│ ").startswith("output"))
    assert float(row.split("│")[2]) > 0.9999
    names, shapes, meta = io_of(out)
    assert names == ["image"] and shapes == [["batch", 3, 16, 16]]
    assert meta["zonnx.source"] == "models.py:Net" and meta["zonnx.framework"] == "torch"
    assert json.loads(meta["zonnx.convert_options"])["dynamic_axes"] == {"image": {"0": "batch"}}


@pytest.mark.parametrize(
    ("name", "extra"), [("net.pt", ["--input-shape", "image:1,3,16,16"]), ("net.pt2", [])]
)
def test_torchscript_and_export_files(work: Path, name: str, extra: list[str]) -> None:
    out = work / f"{name}.onnx"
    run_cli("convert", str(work / name), "-o", str(out), *extra, check=True)
    names, shapes, meta = io_of(out)
    assert names == ["image"] and meta["zonnx.framework"] == "torch"
    assert shapes[0][0] == (1 if name == "net.pt" else "batch")


def test_onnx_cut_with_fixed_shape(work: Path) -> None:
    out = work / "cls_cut.onnx"
    proc = run_cli("convert", str(zoo.get("ppocr_cls")), "-o", str(out), "--input-shape", "x:1,3,48,192",
                   "--outputs", "relu_0.tmp_0", check=True)  # fmt: skip
    assert "relu_0.tmp_0" in proc.stdout
    model = onnx.load(out)
    assert [o.name for o in model.graph.output] == ["relu_0.tmp_0"] and len(model.graph.node) < 10


def test_folded_preprocessing_takes_raw_bgr_images(work: Path) -> None:
    out = work / "net_raw.onnx"
    proc = run_cli("convert", "models.py:Net", "-o", str(out), "--input-shape", "image:1,3,16,16",
                   "--mean", "123.675,116.28,103.53", "--scale", "0.0171,0.0175,0.0174", "--pixel-format", "bgr",
                   "--layout", "nhwc", "--input-dtype", "uint8", cwd=str(work), check=True)  # fmt: skip
    assert "folded preprocessing" in proc.stdout
    names, shapes, meta = io_of(out)
    assert names == ["image"] and shapes == [[1, 16, 16, 3]]
    assert json.loads(meta["zonnx.convert_options"])["preprocess"]["pixel_format"] == "bgr"
    raw = np.random.default_rng(0).integers(0, 256, (1, 16, 16, 3)).astype(np.uint8)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert sess.run(None, {"image": raw})[0].shape == (1, 5)


def test_quantized_torch_model_then_inspect(work: Path) -> None:
    out = work / "q.onnx"
    proc = run_cli("convert", "models.py:quantized", "-o", str(out), "--input-shape", "x:1,3,16,16",
                   cwd=str(work), check=True)  # fmt: skip
    row = next(line for line in proc.stdout.splitlines() if line.strip("│ ").startswith("output"))
    assert int(row.split("│")[4]) <= 1  # max LSB column
    shown = run_cli("inspect", str(out), check=True).stdout
    assert "QDQ" in shown and "int8" in shown and "uint8" in shown and "per-channel" in shown


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (
            ["models.py:NeedsArgs", "--input-shape", "x:1,4"],
            ["models.py:NeedsArgs", "num_classes", "--init-args"],
        ),
        (["models.py:Unexportable", "--input-shape", "x:2,4"], ["aten::erfinv", "/head/erfinv", "models.py"]),
        (["models.py:Net", "--input-shape", "image:1,3,16"], ["image:1,3,16", "--input-shape"]),
        (["models.py:Net", "--input-shape", "img:1,3,16,16"], ["img", "Did you mean 'image'"]),
        (["models.py:Noisy", "--input-shape", "x:1,8"], ["output 'output' does not match", "cosine"]),
        (["models.py:Nett", "--input-shape", "x:1,8"], ["Did you mean 'Net'"]),
        (["weights.pt", "--input-shape", "image:1,3,16,16"], ["weights.pt", "pickled weights"]),
        (["broken.onnx"], ["broken.onnx", "not a valid ONNX model"]),
        (["broken.tflite"], ["broken.tflite", "TFLite"]),
        (["not_a_saved_model"], ["not_a_saved_model", "not a TensorFlow SavedModel", "saved_model.pb"]),
        (["models.py:Net", "--init-args", "{num_classes: 3}"], ["--init-args", "not valid JSON"]),
    ],
)
def test_bad_inputs_give_one_line_and_no_file(work: Path, args: list[str], fragments: list[str]) -> None:
    out = work / "bad.onnx"
    assert_one_line_error(run_cli("convert", *args, "-o", str(out), cwd=str(work)), *fragments)
    assert not out.exists()


def test_onnx_input_shape_mismatch_names_the_input(work: Path) -> None:
    out = work / "bad.onnx"
    proc = run_cli("convert", str(zoo.get("ppocr_cls")), "-o", str(out), "--input-shape", "x:1,4,48,192")
    assert_one_line_error(proc, "x:1,4,48,192", "input 'x'")
    assert not out.exists()


# ---------------------------------------------------------------- TensorFlow inputs (pip install zonnx[tf])


@pytest.fixture(scope="module")
def tf_files() -> dict[str, Path]:
    pytest.importorskip("tensorflow", reason="TensorFlow frontends need pip install zonnx[tf]")
    from tests.converters import tf_models

    return {
        "keras": tf_models.keras_file("functional"),
        "saved_model": tf_models.saved_model("functional"),
        "tflite": tf_models.tflite_file("functional", True),
    }


@pytest.mark.parametrize("kind", ["keras", "saved_model", "tflite"])
def test_tensorflow_inputs_dispatch(work: Path, tf_files: dict[str, Path], kind: str) -> None:
    out = work / f"tf_{kind}.onnx"
    extra = ["--layout", "nhwc", "--input-dtype", "uint8", "--scale", "0.0078125"] if kind == "keras" else []
    proc = run_cli("convert", str(tf_files[kind]), "-o", str(out), *extra, check=True)
    assert f": {kind} (" in proc.stdout and "numeric check" in proc.stdout
    names, shapes, meta = io_of(out)
    assert (
        meta["zonnx.framework"]
        == {"keras": "keras", "saved_model": "tensorflow-savedmodel", "tflite": "tflite"}[kind]
    )
    if kind == "keras":  # an NHWC model: the raw uint8 image goes in without a Transpose
        assert shapes[0][1:] == [16, 16, 3] and "folded preprocessing" in proc.stdout
    if kind == "tflite":
        row = next(
            line for line in proc.stdout.splitlines() if "│" in line and line.split("│")[4].strip().isdigit()
        )
        assert int(row.split("│")[4]) <= 1


def test_missing_tensorflow_says_what_to_install(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With TensorFlow unimportable (a stub package that raises ImportError), .tflite input names the extra."""
    stub = tmp_path / "stub" / "tensorflow"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        "raise ImportError(\"No module named 'tensorflow'\", name='tensorflow')\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(stub.parent))
    tflite = work / "tiny.tflite"
    tflite.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(64))
    proc = run_cli("convert", str(tflite), "-o", str(work / "bad.onnx"))
    assert_one_line_error(proc, "pip install zonnx[tf]")
    assert not (work / "bad.onnx").exists()


def test_option_parsers() -> None:
    from zonnx.errors import OptionError
    from zonnx.tools.convert_cmd import parse_dynamic, parse_shape_options

    assert parse_shape_options(["ids:1,32:int64", "x:1,3,8,8"]) == (
        {"ids": (1, 32), "x": (1, 3, 8, 8)},
        {"ids": "int64"},
    )
    assert parse_dynamic(["ids:0=batch,1=seq", "x:0=N"]) == {"ids": {0: "batch", 1: "seq"}, "x": {0: "N"}}
    with pytest.raises(OptionError, match="'ids:1,32:int65'.*not a dtype"):
        parse_shape_options(["ids:1,32:int65"])
    with pytest.raises(OptionError, match="NAME:AXIS=DIM_NAME"):
        parse_dynamic(["x:batch"])


def test_int64_inputs_from_a_python_file(work: Path) -> None:
    """``--input-shape ids:2,9:int64`` through the Python API: token ids reach an Embedding + LSTM."""
    from zonnx.convert import ConvertOptions, convert

    (work / "tagger.py").write_text(textwrap.dedent(
        """
        from torch import nn

        class Tagger(nn.Module):
            def __init__(self, vocab=40):
                super().__init__()
                self.emb, self.lstm = nn.Embedding(vocab, 8), nn.LSTM(8, 8, batch_first=True)

            def forward(self, ids):
                return self.lstm(self.emb(ids))[0]
        """
    ))  # fmt: skip
    opts = ConvertOptions(input_shapes={"ids": (2, 9)}, input_dtypes={"ids": "int64"}, dynamic={"ids": {1: "seq"}},
                          init_args={"vocab": 30})  # fmt: skip
    converted = convert(str(work / "tagger.py"), opts)
    model = converted.result.model
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert converted.result.checks[0].cosine > 0.9999 and converted.ops_after["LSTM"] == 1
    assert json.loads({p.key: p.value for p in model.metadata_props}["zonnx.convert_options"])[
        "init_args"
    ] == {"vocab": 30}
