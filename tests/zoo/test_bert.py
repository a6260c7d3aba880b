"""The BERT encoder zoo model: builds, loads in ORT, matches torch, and padding never changes an embedding."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

from zonnx import zoo
from zonnx.verify import check_loadable, ort_session
from zonnx.zoo import bert

NAME = "bert_encoder-random"


@pytest.fixture(scope="module")
def path():
    return zoo.get(NAME)


@pytest.fixture(scope="module")
def sess(path):
    return ort_session(path)


def test_builds_an_opset13_bert_with_mask_bias_and_masked_mean(path):
    proto = onnx.load(str(path))
    check_loadable(proto, full_check=True)
    assert {(i.domain, i.version) for i in proto.opset_import} == {("", 13)}
    assert [(i.name, i.type.tensor_type.elem_type) for i in proto.graph.input] == [
        ("input_ids", onnx.TensorProto.INT64),
        ("attention_mask", onnx.TensorProto.INT64),
    ]
    ops = Counter(n.op_type for n in proto.graph.node)
    # 6 layers x (Q, K, V, out, FFN1, FFN2 + 2 attention products); 13 LayerNorms, decomposed at opset 13
    assert ops["MatMul"] == 48 and ops["Softmax"] == 6 and ops["Erf"] == 6 and ops["Sqrt"] == 13
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["zonnx.trained"] == "no"
    assert meta["zonnx.outlier_channels"] == ",".join(map(str, bert.outlier_channels()))
    consts = [
        onnx.numpy_helper.to_array(n.attribute[0].t) for n in proto.graph.node if n.op_type == "Constant"
    ]
    assert any(c.size == 1 and c.dtype.kind == "f" and float(c) == bert.MASK_BIAS for c in consts)


def test_sample_inputs_are_padded_sentences_of_varying_length():
    feeds = zoo.sample_inputs(NAME, 12, seed=0)
    lengths = []
    for f in feeds:
        ids, mask = f["input_ids"][0], f["attention_mask"][0]
        assert ids.shape == (bert.SEQ_LEN,) and ids.dtype == mask.dtype == np.int64
        n = int(mask.sum())
        lengths.append(n)
        assert (mask[:n] == 1).all() and (mask[n:] == 0).all()  # a prefix of real tokens, then padding
        assert ids[0] == bert.CLS and ids[n - 1] == bert.SEP and (ids[n:] == bert.PAD).all()
        assert (ids[1 : n - 1] >= 4).all()
    assert min(lengths) >= 6 and max(lengths) < bert.SEQ_LEN and len(set(lengths)) >= 8


def test_padding_does_not_change_the_embedding(sess):
    feed = zoo.sample_inputs(NAME, 1, seed=3)[0]
    n = int(feed["attention_mask"].sum())
    assert n < 100
    padded = sess.run(None, feed)[0]
    trimmed = sess.run(None, {k: v[:, :n] for k, v in feed.items()})[0]
    garbage = dict(feed, input_ids=feed["input_ids"].copy())
    garbage["input_ids"][0, n:] = np.random.default_rng(0).integers(4, bert.VOCAB, bert.SEQ_LEN - n)
    noisy = sess.run(None, garbage)[0]
    assert padded.shape == (1, 384) and np.isfinite(padded).all()
    np.testing.assert_allclose(trimmed, padded, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(noisy, padded, rtol=1e-4, atol=1e-4)
    unmasked = dict(garbage, attention_mask=np.ones_like(feed["attention_mask"]))
    assert np.abs(sess.run(None, unmasked)[0] - padded).max() > 1e-2  # the mask really is what hides them


def test_onnx_matches_torch_and_has_the_outlier_channels(sess):
    import torch

    batch, _ = bert.topic_samples(4, seed=2)
    got = sess.run(None, batch)[0]
    with torch.no_grad():
        want = bert.bert_module()(
            *(torch.from_numpy(batch[k]) for k in ("input_ids", "attention_mask"))
        ).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    peak = np.abs(got).max(axis=0)
    top = sorted(np.argsort(peak)[-bert.OUTLIER_CHANNELS :].tolist())
    assert top == bert.outlier_channels() and peak[top].min() > 10 * np.median(peak)
