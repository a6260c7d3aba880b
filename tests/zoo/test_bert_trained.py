"""The trained BERT classifier zoo model: builds, exports with its mask input, runs in ORT, has learned its task."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

from zonnx import zoo
from zonnx.verify import check_loadable, ort_session
from zonnx.zoo import bert, bert_trained

NAME = "bert_encoder"


@pytest.fixture(scope="module")
def path():
    return zoo.get(NAME)


@pytest.fixture(scope="module")
def sess(path):
    return ort_session(path)


def test_exports_a_masked_bert_classifier_at_opset13(path):
    proto = onnx.load(str(path))
    check_loadable(proto, full_check=True)
    assert {(i.domain, i.version) for i in proto.opset_import} == {("", 13)}
    assert [(i.name, i.type.tensor_type.elem_type) for i in proto.graph.input] == [
        ("input_ids", onnx.TensorProto.INT64),
        ("attention_mask", onnx.TensorProto.INT64),
    ]
    assert [o.name for o in proto.graph.output] == ["logits", "embedding"]
    ops = Counter(n.op_type for n in proto.graph.node)
    # 4 layers x (Q, K, V, out, FFN1, FFN2 + 2 attention products) + pooler + classifier (Gemm or MatMul)
    assert ops["Softmax"] == 4 and ops["Erf"] == 4 and ops["Tanh"] == 1
    assert ops["MatMul"] + ops["Gemm"] == 34
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["zonnx.zoo"] == NAME and "AdamW steps" in meta["zonnx.trained"]
    assert zoo.provenance(NAME) == "trained here"


def test_sample_inputs_are_padded_sentences(sess):
    feeds = zoo.sample_inputs(NAME, 16, seed=0)
    lengths = [int(f["attention_mask"].sum()) for f in feeds]
    for f, n in zip(feeds, lengths, strict=True):
        assert f["input_ids"].shape == (1, bert_trained.SEQ_LEN) and f["input_ids"].dtype == np.int64
        assert (f["attention_mask"][0, :n] == 1).all() and (f["input_ids"][0, n:] == bert.PAD).all()
    # varying lengths, most of them padded (a long sentence is truncated to SEQ_LEN, as tokenizers do)
    assert min(lengths) >= 6 and max(lengths) <= bert_trained.SEQ_LEN and len(set(lengths)) >= 8
    assert sum(n < bert_trained.SEQ_LEN for n in lengths) >= 12
    logits, embedding = sess.run(None, feeds[0])
    assert logits.shape == (1, 32) and embedding.shape == (1, 128)


def test_padding_does_not_change_the_prediction(sess):
    """The attention mask works: the same sentence padded to 64 or cut at its length gives the same logits."""
    feed = zoo.sample_inputs(NAME, 1, seed=4)[0]
    n = int(feed["attention_mask"].sum())
    full = sess.run(None, feed)[0]
    cut = sess.run(None, {k: v[:, :n] for k, v in feed.items()})[0]
    np.testing.assert_allclose(full, cut, atol=1e-4)


def test_trained_topic_accuracy_is_far_above_chance(path, sess):
    """32 topics (chance 0.031): the held-out accuracy in ORT is what the metadata says, and above 0.7."""
    accuracy = bert_trained.topic_accuracy(sess, n=256, seed=0)
    assert accuracy > 0.7
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert float(meta["zonnx.test_accuracy"]) > 0.7
