"""Zoo models build into the cache, load in ORT, keep their accuracy; rendered inputs are read correctly."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from zonnx import zoo
from zonnx.errors import OptionError, ZonnxError
from zonnx.ir.io import MAX_IR_VERSION
from zonnx.verify import check_loadable, ort_session
from zonnx.zoo import digits, text_images

BUILT = ["digits_cnn", "resnet18-random", "mobilenetv2-random", "transformer-random"]
CNNS = ["digits_cnn", "resnet18-random", "mobilenetv2-random"]
#: Trained for minutes at first use: checked without building in test_mobilenet_digits.py, measured by bench/.
LONG_BUILDS = {"mobilenetv2_digits"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    """A fresh $ZONNX_CACHE for the module: every built model is built once, here ("outer": the
    $ZONNX_CACHE the rest of the suite shares, None when unset)."""
    root = tmp_path_factory.mktemp("zonnx-cache")
    outer = os.environ.get("ZONNX_CACHE")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZONNX_CACHE", str(root))
        yield {"root": root, "seconds": {}, "outer": outer}


@pytest.fixture(scope="module")
def built(cache) -> dict[str, Path]:
    paths = {}
    for name in BUILT:
        start = time.perf_counter()
        paths[name] = zoo.get(name)
        cache["seconds"][name] = time.perf_counter() - start
    return paths


def _proto(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path))


@pytest.mark.parametrize("name", BUILT)
def test_built_model_is_valid_opset13_and_in_the_cache(built, cache, name):
    path = built[name]
    assert path.parent.parent == cache["root"] and path.name == f"{name}.onnx"
    proto = _proto(path)
    assert proto.ir_version <= MAX_IR_VERSION
    assert {(i.domain, i.version) for i in proto.opset_import} == {("", 13)}
    check_loadable(proto, full_check=True)  # onnx.checker (full) and an ORT 1.31 session
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"


@pytest.mark.parametrize("name", CNNS)
def test_cnn_keeps_batchnorm_and_has_a_dynamic_batch(built, name):
    proto = _proto(built[name])
    ops = Counter(n.op_type for n in proto.graph.node)
    assert ops["BatchNormalization"] == ops["Conv"] > 0  # every Conv is followed by a BN left to fold
    assert ops["Gemm"] == 1 and ops["Add"] >= 1
    feeds = zoo.sample_inputs(name, 3, seed=1)
    sess = ort_session(built[name])
    single = np.concatenate([sess.run(None, f)[0] for f in feeds])
    batched = sess.run(None, {"input": np.concatenate([f["input"] for f in feeds])})[0]
    assert single.shape == (3, 10 if name == "digits_cnn" else 1000)
    assert np.isfinite(single).all() and single.std() > 1e-2
    np.testing.assert_allclose(batched, single, rtol=1e-4, atol=1e-4)


def test_cnn_batchnorm_statistics_are_not_trivial(built):
    proto = _proto(built["resnet18-random"])
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    for node in (n for n in proto.graph.node if n.op_type == "BatchNormalization"):
        mean, var = inits[node.input[3]], inits[node.input[4]]
        assert np.abs(mean).max() > 1e-2 and np.abs(var - 1).max() > 1e-2, node.name


def test_transformer_has_decomposed_layernorm_erf_gelu_and_dynamic_axes(built):
    proto = _proto(built["transformer-random"])
    ops = Counter(n.op_type for n in proto.graph.node)
    assert ops["LayerNormalization"] == 0 and ops["ReduceMean"] >= 8 and ops["Sqrt"] == 4
    assert ops["Erf"] == 2 and ops["Softmax"] == 2 and ops["MatMul"] >= 12
    dims = [d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["N", "S"]
    sess = ort_session(built["transformer-random"])
    for seq_len in (7, 32):
        ids = np.stack([f["input_ids"][0] for f in zoo.sample_inputs("transformer-random", 2)])[:, :seq_len]
        out = sess.run(None, {"input_ids": ids})[0]
        assert out.shape == (2, 10) and np.isfinite(out).all()
    import torch

    from zonnx.zoo.torch_models import transformer_module

    with torch.no_grad():
        expected = transformer_module()(torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_resnet_export_matches_torch_module(built):
    import torch

    from zonnx.zoo.torch_models import resnet18_module

    x = zoo.sample_inputs("resnet18-random", 1, seed=3)[0]["input"]
    with torch.no_grad():
        expected = resnet18_module()(torch.from_numpy(x)).numpy()
    got = ort_session(built["resnet18-random"]).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)


def test_cache_is_reused_and_a_removed_file_is_rebuilt(built):
    path = built["transformer-random"]
    mtime = path.stat().st_mtime_ns
    time.sleep(0.01)
    assert zoo.get("transformer-random") == path
    assert path.stat().st_mtime_ns == mtime  # not rebuilt
    path.unlink()
    assert zoo.get("transformer-random") == path and path.is_file()
    assert path.stat().st_mtime_ns != mtime
    check_loadable(path, full_check=False)


def test_build_goes_to_zonnx_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ZONNX_CACHE", str(tmp_path))
    path = zoo.get("transformer-random")
    assert path.is_relative_to(tmp_path) and path.is_file()
    assert zoo.cache_dir().is_relative_to(tmp_path)


def test_unknown_zoo_name_suggests_the_closest():
    with pytest.raises(OptionError, match="Did you mean 'resnet18-random'"):
        zoo.get("resnet81")


def test_digits_accuracy_in_metadata_and_remeasured(built):
    proto = _proto(built["digits_cnn"])
    meta = {p.key: p.value for p in proto.metadata_props}
    assert float(meta["zonnx.test_accuracy"]) >= 0.97
    assert meta["zonnx.train_samples"] == "1347" and meta["zonnx.test_samples"] == "450"
    assert meta["zonnx.seed"] == "0"
    x, y = digits.digits_data("test")
    measured = digits.evaluate_top1(built["digits_cnn"], x, y)
    assert measured >= 0.97
    assert measured == pytest.approx(float(meta["zonnx.test_accuracy"]), abs=1e-4)


def test_digits_splits_are_fixed_and_disjoint():
    x_tr, y_tr = digits.digits_data("train")
    x_te, y_te = digits.digits_data("test")
    x_ca, _ = digits.digits_data("calib")
    assert x_tr.shape == (1347, 1, 8, 8) and x_te.shape == (450, 1, 8, 8) and x_ca.shape == (256, 1, 8, 8)
    assert x_tr.dtype == np.float32 and x_tr.min() >= 0 and x_tr.max() == 1.0
    np.testing.assert_array_equal(x_ca, x_tr[:256])
    assert set(np.bincount(y_te)) <= {43, 44, 45, 46}  # stratified: ~45 of each digit
    np.testing.assert_array_equal(digits.digits_data("test")[0], x_te)
    with pytest.raises(OptionError, match="'val'"):
        digits.digits_data("val")


def test_digits_inputs_are_real_test_images():
    x_te, _ = digits.digits_data("test")
    feeds = digits.digits_inputs(5, seed=2)
    assert len(feeds) == 5 and all(f["input"].shape == (1, 1, 8, 8) for f in feeds)
    for f in feeds:
        assert (np.abs(x_te - f["input"]).reshape(450, -1).max(axis=1) == 0).any()
    assert len(digits.digits_inputs(460)) == 460


@pytest.mark.parametrize("name", [n for n in zoo.names() if n not in LONG_BUILDS])
def test_sample_inputs_match_the_model_inputs(built, cache, name, monkeypatch):
    """Models this module does not build are read from the suite's shared cache (training the BERT
    encoder and the detector again into the fresh one took two minutes for a look at their inputs)."""
    if name not in built:
        if cache["outer"] is None:
            monkeypatch.delenv("ZONNX_CACHE")
        else:
            monkeypatch.setenv("ZONNX_CACHE", cache["outer"])
    path = built.get(name) or zoo.get(name)
    proto = onnx.load(str(path), load_external_data=False)
    feeds = zoo.sample_inputs(name, 2, seed=0)
    assert len(feeds) == 2
    for feed in feeds:
        assert set(feed) == {i.name for i in proto.graph.input}
        for vi in proto.graph.input:
            arr = feed[vi.name]
            assert arr.dtype == onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
            dims = vi.type.tensor_type.shape.dim
            assert arr.ndim == len(dims)
            for size, d in zip(arr.shape, dims, strict=True):
                assert not d.HasField("dim_value") or d.dim_value in (size, -1)


# ---------------------------------------------------------------- PP-OCR inputs


def test_ppocr_rec_reads_rendered_lines():
    samples = text_images.rec_samples(40, seed=0)
    sess = ort_session(zoo.get("ppocr_rec"), optimize=True)
    probs = [sess.run(None, feed)[0] for _, feed in samples]
    assert probs[0].shape[2] == len(text_images.rec_characters()) == 6625
    preds = [text_images.ctc_greedy_decode(p)[0] for p in probs]
    accuracy = text_images.char_accuracy(preds, [t for t, _ in samples])
    assert accuracy >= 0.97, list(zip(preds, [t for t, _ in samples], strict=True))
    widths = {feed["x"].shape[3] for _, feed in samples}
    assert min(widths) == 320 and len(widths) > 5
    assert all(feed["x"].shape[:3] == (1, 3, 48) for _, feed in samples)


def test_ppocr_det_finds_every_rendered_line_and_nothing_else():
    sess = ort_session(zoo.get("ppocr_det"), optimize=True)
    for boxes, feed in text_images.det_samples(4, seed=0):
        assert feed["x"].shape == (1, 3, 160, 320) and boxes
        prob = sess.run(None, feed)[0][0, 0]
        inside = np.zeros(prob.shape, dtype=bool)
        for x0, y0, x1, y1 in boxes:
            assert prob[y0:y1, x0:x1].max() > 0.9
            inside[y0:y1, x0:x1] = True
        assert (prob[~inside] > 0.3).mean() < 0.01


def test_ppocr_cls_tells_upright_from_upside_down():
    sess = ort_session(zoo.get("ppocr_cls"), optimize=True)
    samples = text_images.cls_samples(12, seed=0)
    labels = [label for label, _ in samples]
    preds = [int(sess.run(None, feed)[0].argmax()) for _, feed in samples]
    assert sum(labels) == 4 and np.mean(np.array(preds) == np.array(labels)) >= 0.9
    assert all(feed["x"].shape == (1, 3, 48, 192) for _, feed in samples)


def test_ctc_decode_merges_repeats_and_drops_blanks():
    chars = ("blank", "a", "b", " ")
    steps = [0, 1, 1, 0, 1, 2, 2, 3, 0]
    probs = np.eye(4, dtype=np.float32)[steps][None]
    assert text_images.ctc_greedy_decode(probs, chars) == ["aab "]
    assert text_images.char_accuracy(["ab", " abc "], ["ab", "abd"]) == pytest.approx(1 - 1 / 5)


def test_missing_fonts_raise_a_clear_error(tmp_path):
    with pytest.raises(ZonnxError, match="fonts-dejavu-core"):
        text_images.find_fonts([tmp_path])
    assert text_images.font_paths()[0].name == "DejaVuSans.ttf"


@pytest.mark.parametrize("old", sorted(zoo.RENAMED))
def test_old_names_are_refused_with_the_new_name(old):
    with pytest.raises(OptionError, match=f"is now '{zoo.RENAMED[old]}'.*not trained"):
        zoo.get(old)


def test_provenance_is_in_every_random_weight_name():
    for name in zoo.names():
        assert (zoo.provenance(name) == "random") == name.endswith("-random"), name
    assert zoo.provenance("ppocr_rec") == "pretrained" and zoo.provenance("digits_cnn") == "trained here"
