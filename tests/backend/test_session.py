"""zonnx.backend.session.InferenceSession on real quantized models: exactness, fidelity, cache and bad input."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.quantization import QuantFormat, QuantType

import zonnx
from tests.backend.partition_models import quantize
from zonnx import zoo
from zonnx.backend.cache import COMPILED, ENTRY, EXECUTABLE, EXECUTABLE_DATA
from zonnx.backend.session import InferenceSession, InvalidInputError
from zonnx.errors import OptionError, UnsupportedModelError
from zonnx.verify import exact_integer_form
from zonnx.zoo.digits import digits_data

NPU = ["ZonnxNPUExecutionProvider", "CPUExecutionProvider"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("session")
    x, _ = digits_data("calib")
    feeds = [{"input": x[i : i + 1]} for i in range(64)]
    src = zoo.get("digits_cnn")
    return {
        "float": src,
        "fix": quantize(src, d / "fix.onnx", feeds, "fix"),
        "qdq": quantize(src, d / "qdq.onnx", feeds, "qdq"),
        "qdq_u8": _quantize_u8(src, d / "qdq_u8.onnx", feeds),
    }


def _quantize_u8(src: Path, dst: Path, feeds: list) -> Path:
    """ORT-style per-channel QDQ with uint8 activations: bm1684x refuses the asymmetric ones."""
    zonnx.quantize_static(
        str(src), str(dst), _Reader(feeds), quant_format=QuantFormat.QDQ,
        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip
    return dst


class _Reader:
    def __init__(self, feeds: list) -> None:
        self.it = iter(feeds)

    def get_next(self) -> dict | None:
        return next(self.it, None)


def _session(path: Path | bytes, target: str, cache: Path, **opts: str) -> InferenceSession:
    return InferenceSession(
        path, providers=NPU, provider_options=[{"target": target, "cache_dir": str(cache), **opts}, {}]
    )


def _fake_quant(path: Path, x: np.ndarray) -> np.ndarray:
    """The fake-quant model in ORT with its fusions, in its exact integer form (``exact_integer_form``:
    uint8 weights where this host's u8 x s8 kernels saturate)."""
    model = exact_integer_form(onnx.load(path))
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input": x}
    )[0]


@pytest.mark.parametrize(
    ("form", "target"), [("fix", "dpu-b4096"), ("qdq", "bm1684x"), ("qdq_u8", "bm1684x")]
)
def test_ort_lowering_equals_reference_and_fake_quant(models, tmp_path: Path, form: str, target: str) -> None:
    x, y = digits_data("test")
    native = _session(models[form], target, tmp_path, executor="ort")
    ref = _session(models[form], target, tmp_path, executor="reference")
    assert native.executor == "ort" and ref.executor == "reference"
    a = native.run(None, {"input": x})[0]
    b = ref.run(None, {"input": x})[0]
    assert a.dtype == np.float32 and a.shape == (450, 10)
    assert np.array_equal(a, b)  # ORT-native NPU ops == numpy reference, bit for bit
    fq = _fake_quant(models[form], x)
    step = np.abs(np.diff(np.unique(fq))).min()  # one LSB of the output grid
    assert np.abs(a - fq).max() <= 3 * step + 1e-6
    float_top1 = zoo.digits.evaluate_top1(models["float"], x, y)
    assert abs(float(np.mean(a.argmax(1) == y)) - float_top1) <= 0.005
    assert native.partition is not None and native.partition.npu_nodes > 0
    assert native.get_providers() == NPU


def test_partial_partition_reports_cpu_nodes(models, tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="zonnx.backend.session"):
        sess = _session(models["qdq_u8"], "bm1684x", tmp_path)
    part = sess.partition
    assert part.num_subgraphs == 2 and 0 < part.mac_share < 1
    assert part.rules["/res/res.3/Conv"] == "zero_point"
    line = next(r.message for r in caplog.records if "nodes on the NPU" in r.message)
    zero_point = sum(rule == "zero_point" for rule in part.rules.values())
    assert zero_point == 6  # the u8 model's asymmetric tensors (ORT's layout folds Relu into quantizers)
    assert (
        f"{part.npu_nodes} of {part.total_nodes} nodes on the NPU" in line
        and f"zero_point {zero_point}" in line
    )


def test_compiled_model_runs_without_compiling(models, tmp_path: Path) -> None:
    first = _session(models["fix"], "dpu-b4096", tmp_path)
    path = tmp_path / "compiled.onnx"
    onnx.save(first.compiled_model, path)
    again = InferenceSession(str(path), providers=NPU)
    x, _ = digits_data("test")
    assert np.array_equal(first.run(None, {"input": x})[0], again.run(None, {"input": x})[0])
    with pytest.raises(OptionError, match="compiled for 'dpu-b4096'"):
        InferenceSession(str(path), providers=NPU, provider_options=[{"target": "bm1684x"}, {}])
    with pytest.raises(OptionError, match="ZonnxNPUExecutionProvider"):
        InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_cache_warm_session_reuses_the_entry(tmp_path: Path) -> None:
    """The second session comes from the cache and computes the same outputs. How much faster it is is a
    benchmark's question (``python -m bench.runner npu_speed``: warm vs cold), not a timed unit test's."""
    feeds = zoo.sample_inputs("resnet18-random", 2)
    model = quantize(zoo.get("resnet18-random"), tmp_path / "r18.onnx", feeds, "fix")
    cold = _session(model, "dpu-b4096", tmp_path / "cache")
    warm = _session(model, "dpu-b4096", tmp_path / "cache")
    assert not cold.from_cache and warm.from_cache
    x = feeds[0]["input"]
    assert np.array_equal(cold.run(None, {"input": x})[0], warm.run(None, {"input": x})[0])


def _flip_byte(path: Path) -> None:
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))


def _entry(cache: Path) -> Path:
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    return folder


def test_corrupted_and_stale_cache_entries_recompile(models, tmp_path: Path, caplog) -> None:
    x, _ = digits_data("test")
    good = _session(models["fix"], "dpu-b4096", tmp_path).run(None, {"input": x})[0]
    folder = _entry(tmp_path)
    _flip_byte(folder / EXECUTABLE)  # the executable alone: lowered again from the compiled model
    with caplog.at_level(logging.WARNING):
        sess = _session(models["fix"], "dpu-b4096", tmp_path)
    assert sess.from_cache and "executable.onnx is corrupted" in caplog.text
    assert np.array_equal(sess.run(None, {"input": x})[0], good)
    _flip_byte(folder / EXECUTABLE_DATA)  # its weights, which ORT maps from the file: checked too
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        sess = _session(models["fix"], "dpu-b4096", tmp_path)
    assert sess.from_cache and "executable.data is corrupted" in caplog.text
    assert np.array_equal(sess.run(None, {"input": x})[0], good)
    _flip_byte(folder / EXECUTABLE)
    _flip_byte(folder / COMPILED)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        sess = _session(models["fix"], "dpu-b4096", tmp_path)
    assert not sess.from_cache and "compiled.onnx does not match its sha256" in caplog.text
    assert np.array_equal(sess.run(None, {"input": x})[0], good)
    # stale: the entry records another source model
    entry = json.loads((folder / ENTRY).read_text())
    entry["source_sha256"] = "0" * 64
    (folder / ENTRY).write_text(json.dumps(entry))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        sess = _session(models["fix"], "dpu-b4096", tmp_path)
    assert not sess.from_cache and "stale" in caplog.text
    # a garbage file whose hash is recorded as valid: the program hash inside catches it
    (folder / COMPILED).write_bytes(b"not a model")
    entry = json.loads((folder / ENTRY).read_text())
    entry["files"] = {COMPILED: hashlib.sha256(b"not a model").hexdigest()}
    (folder / ENTRY).write_text(json.dumps(entry))
    sess = _session(models["fix"], "dpu-b4096", tmp_path)
    assert np.array_equal(sess.run(None, {"input": x})[0], good)
    assert _session(models["fix"], "dpu-b4096", tmp_path).from_cache  # rewritten


def test_user_cache_key_and_voe_spellings(models, tmp_path: Path) -> None:
    sess = InferenceSession(
        models["fix"], providers=NPU, provider_options=[{"cacheDir": str(tmp_path), "cacheKey": "digits"}, {}]
    )
    assert (tmp_path / "digits" / COMPILED).is_file()
    opts = sess.get_provider_options()["ZonnxNPUExecutionProvider"]
    assert opts["cache_key"] == "digits" and opts["target"] == "dpu-b4096"
    config = tmp_path / "vaip_config.json"
    config.write_text(json.dumps({"target": "bm1684x", "passes": []}))
    sess = InferenceSession(models["qdq"], providers=NPU, provider_options=[{"config_file": str(config)}, {}])
    assert sess.partition.target == "bm1684x"
    with pytest.raises(OptionError, match="Did you mean 'cache_dir'"):
        InferenceSession(models["fix"], providers=NPU, provider_options=[{"cache_dri": "x"}, {}])


def test_unwritable_cache_dir_runs_without_cache(models, tmp_path: Path, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with caplog.at_level(logging.WARNING):
        sess = _session(models["fix"], "dpu-b4096", blocker / "cache")
    assert "not writable" in caplog.text and "without caching" in caplog.text
    x, _ = digits_data("test")
    assert sess.run(None, {"input": x[:4]})[0].shape == (4, 10)


def test_float_model_error_or_cpu_fallback(models, tmp_path: Path, caplog) -> None:
    with pytest.raises(UnsupportedModelError, match="Quantize first: zonnx quantize"):
        _session(models["float"], "dpu-b4096", tmp_path)
    with caplog.at_level(logging.WARNING):
        sess = _session(models["float"], "dpu-b4096", tmp_path, fallback="cpu")
    assert "every node runs on the CPU" in caplog.text
    assert sess.get_providers() == ["CPUExecutionProvider"] and sess.partition is None
    x, _ = digits_data("test")
    want = ort.InferenceSession(str(models["float"])).run(None, {"input": x})[0]
    assert np.array_equal(sess.run(None, {"input": x})[0], want)


def test_unknown_target_lists_known(models, tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"unknown target 'dpu-b409'.*Known targets: bm1684x, dpu-b4096"):
        _session(models["fix"], "dpu-b409", tmp_path)


@pytest.mark.parametrize("executor", ["ort", "reference"])
def test_wrong_inputs_name_the_input(models, tmp_path: Path, executor: str) -> None:
    sess = _session(models["fix"], "dpu-b4096", tmp_path, executor=executor)
    x, _ = digits_data("test")
    with pytest.raises(InvalidInputError, match=r"input 'input': got invalid dimensions \[2, 1, 8, 9\]"):
        sess.run(None, {"input": np.zeros((2, 1, 8, 9), np.float32)})
    with pytest.raises(InvalidInputError, match=r"input 'input': unexpected data type.*tensor\(float\)"):
        sess.run(None, {"input": x.astype(np.float64)})
    with pytest.raises(InvalidInputError, match="invalid input name 'inputs'"):
        sess.run(None, {"inputs": x})
    assert [i.name for i in sess.get_inputs()] == ["input"] and sess.get_outputs()[0].name == "logits"
    ov = sess.run_with_ort_values(None, {"input": ort.OrtValue.ortvalue_from_numpy(x[:3])})
    assert np.array_equal(ov[0].numpy(), sess.run(None, {"input": x[:3]})[0])
    assert sess.get_modelmeta() is not None
