"""A small BERT sequence classifier trained here (under two minutes of CPU) on synthetic topical text.

Architecture: ``zonnx.zoo.bert``'s encoder (HF ``BertModel`` layout: word + position + token-type
embeddings, LayerNorm, post-LayerNorm layers of masked multi-head self-attention and a GELU FFN) at
``CONFIG``'s size (4 layers, hidden 128, 4 heads, FFN 512, vocabulary 2048), then BERT's pooler and a
classifier, as ``BertForSequenceClassification``::

    embedding = tanh(W_p h_[CLS] + b_p)          logits = W_c embedding + b_c      (TOPICS classes)

The attention mask becomes the additive bias ``(1 - mask) * -10000`` before every Softmax.

Task: the topic (1 of ``SyntheticText.TOPICS`` = 32) of a sentence of ``SyntheticText`` (topical bigram
language, log-normal lengths, median ~24 tokens, padded to ``SEQ_LEN``). With a 2048-word vocabulary the
topics' word sets overlap (each holds 256 words) and half of all words are topic-free Zipf draws, so the
topic follows only from several words together, through attention to [CLS]; chance is 1/32.

Training: ``TRAIN_STEPS`` AdamW steps (batch ``BATCH``, linear warm-up then linear decay), each batch cut
to its longest sentence; one torch thread, seeded, so deterministic per CPU (float32 kernels differ
between instruction sets, so the weights and the accuracy may differ slightly between hosts; the
metadata keeps the host and the held-out accuracy measured with ORT on the exported file).
"""

from __future__ import annotations

__all__ = [
    "CONFIG",
    "SEQ_LEN",
    "TRAIN_STEPS",
    "BertClassifier",
    "topic_batch",
    "train_bert_classifier",
    "topic_accuracy",
    "build_bert_classifier",
    "bert_classifier_inputs",
]

import logging
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from zonnx.hostcpu import cpu_name, host_isa
from zonnx.ir.io import save_model
from zonnx.verify import ort_session
from zonnx.zoo.bert import BertConfig, BertEncoder, SyntheticText
from zonnx.zoo.torch_models import export_legacy, torch_threads

logger = logging.getLogger(__name__)

SEED = 0
SEQ_LEN = 64
CONFIG = BertConfig(vocab=2048, hidden=128, layers=4, heads=4, ffn=512, max_positions=SEQ_LEN)
TRAIN_STEPS = 200
BATCH = 64
LR = 1e-3
WARMUP = 20
#: Seed offsets of the sentence streams: training batches, held-out samples (never overlapping).
_TRAIN_STREAM, _HELD_OUT_STREAM = 1_000, 900_000


class BertClassifier(nn.Module):
    """Encoder + pooler (Dense + tanh on [CLS]) + classifier; returns ``(logits, embedding)``."""

    def __init__(self, cfg: BertConfig = CONFIG) -> None:
        super().__init__()
        self.encoder = BertEncoder(cfg)
        self.pooler = nn.Linear(cfg.hidden, cfg.hidden)
        self.classifier = nn.Linear(cfg.hidden, SyntheticText.TOPICS)
        for m in (self.pooler, self.classifier):
            nn.init.normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder.hidden_states(input_ids, attention_mask)
        embedding = torch.tanh(self.pooler(h[:, 0]))
        return self.classifier(embedding), embedding


def _language() -> SyntheticText:
    return SyntheticText(SEED, CONFIG.vocab)


def topic_batch(n: int, seed: int, seq_len: int = SEQ_LEN) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``n`` held-out sentences as one feed ``{"input_ids", "attention_mask"}`` [n, seq_len] and their topics."""
    rng = np.random.default_rng(_HELD_OUT_STREAM + seed)
    ids, mask, topics = _language().batch(rng, n, seq_len)
    return {"input_ids": ids, "attention_mask": mask}, topics


def train_bert_classifier(seed: int = SEED, steps: int = TRAIN_STEPS) -> BertClassifier:
    """Train on fresh batches of the synthetic language (cross-entropy on the topic), deterministically."""
    torch.manual_seed(seed)
    model = BertClassifier()
    lang = _language()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / WARMUP, max(0.0, (steps - s) / (steps - WARMUP)))
    )
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for step in range(steps):
        rng = np.random.default_rng(_TRAIN_STREAM + seed * 100_000 + step)
        ids, mask, topics = lang.batch(rng, BATCH, SEQ_LEN)
        keep = int(mask.sum(axis=1).max())
        logits, _ = model(torch.from_numpy(ids[:, :keep]), torch.from_numpy(mask[:, :keep]))
        loss = loss_fn(logits, torch.from_numpy(topics))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            logger.info("bert_encoder: step %d, loss %.3f", step, loss.item())
    return model.eval()


def topic_accuracy(
    model: str | Path | onnx.ModelProto | ort.InferenceSession, n: int = 512, seed: int = 0
) -> float:
    """Topic accuracy of an exported classifier (ORT, first output = logits) on ``n`` held-out sentences."""
    sess = model if isinstance(model, ort.InferenceSession) else ort_session(model)
    feed, topics = topic_batch(n, seed)
    logits = np.concatenate(
        [sess.run(None, {k: v[i : i + 64] for k, v in feed.items()})[0] for i in range(0, n, 64)]
    )
    return float(np.mean(logits.argmax(axis=1) == topics))


def build_bert_classifier(path: Path) -> None:
    """Train and export: inputs ``input_ids``, ``attention_mask`` int64 [N, S]; outputs ``logits`` [N, 32]
    and ``embedding`` [N, 128] (the pooler output). The metadata keeps ``zonnx.test_accuracy`` (512
    held-out sentences, ORT on the exported file), the steps, the seed and the training host."""
    path = Path(path)
    start = time.perf_counter()
    with torch_threads(1):
        model = train_bert_classifier()
    seconds = time.perf_counter() - start
    feed = bert_classifier_inputs(1, seed=123)[0]
    proto = export_legacy(
        model,
        (torch.from_numpy(feed["input_ids"]), torch.from_numpy(feed["attention_mask"])),
        None,
        input_names=["input_ids", "attention_mask"],
        output_names=["logits", "embedding"],
        dynamic_axes={
            "input_ids": {0: "N", 1: "S"},
            "attention_mask": {0: "N", 1: "S"},
            "logits": {0: "N"},
            "embedding": {0: "N"},
        },
        metadata={
            "zonnx.zoo": "bert_encoder",
            "zonnx.seed": str(SEED),
            "zonnx.trained": f"{TRAIN_STEPS} AdamW steps x {BATCH} synthetic sentences (topic, 32 classes)",
            "zonnx.train_host": f"{cpu_name()}, {host_isa()}",
        },
    )
    accuracy = topic_accuracy(proto)
    proto.metadata_props.add(key="zonnx.test_accuracy", value=f"{accuracy:.4f}")
    save_model(proto, path)
    logger.info(
        "built %s in %.1f s (training %.1f s), topic accuracy %.4f",
        path,
        time.perf_counter() - start,
        seconds,
        accuracy,
    )


def bert_classifier_inputs(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n`` feeds ``{"input_ids", "attention_mask"}`` (int64 1 x SEQ_LEN) of held-out sentences of varying
    length, padded with PAD, mask 1 on real tokens."""
    feed, _ = topic_batch(n, seed)
    return [{k: v[i : i + 1] for k, v in feed.items()} for i in range(n)]
