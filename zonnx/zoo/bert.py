"""A MiniLM-like BERT sentence encoder (6 x 384, 12 heads), briefly trained on synthetic text, opset 13.

Layout as in HF ``BertModel``: word + position + token-type embeddings, LayerNorm; 6 post-LayerNorm
layers of self-attention (Q, K, V, output projections) and a GELU FFN (384 -> 1536 -> 384); the
attention mask turns into the additive bias ``(1 - mask) * -10000`` before Softmax; the output is the
masked mean over the last hidden states, ``sum_t h_t m_t / max(sum_t m_t, 1e-9)`` (sentence-transformers'
pooling).

Weights: not trained. A fixed-seed init (HF's: N(0, 0.02) weights, zero biases) whose LayerNorms carry
outlier channels like trained BERTs' (Kovaleva et al. 2021): the same ``OUTLIER_CHANNELS`` (4 of 384)
have beta +-``OUTLIER_BETA`` (3) in every LayerNorm. Through the post-LN residual stream they settle at
about +-12 while the other channels stay near 1, so every LayerNorm output, and the embedding, has 4
channels about 10x (and up to 60x the median of) the rest. Training was tried and dropped: 80 steps
(about 2 minutes on 2 idle cores) of masked-token or same-topic contrastive training on the synthetic
text below left the contrastive loss at chance and collapsed the sentence embeddings to one vector,
which is less realistic than a good init. The trained zoo model ``bert_encoder`` (``zonnx.zoo.bert_trained``)
is a smaller encoder of these classes trained on a supervised task (the topic) instead.
"""

from __future__ import annotations

__all__ = [
    "VOCAB",
    "SEQ_LEN",
    "PAD",
    "CLS",
    "SEP",
    "MASK",
    "BertConfig",
    "BertEncoder",
    "SyntheticText",
    "OUTLIER_CHANNELS",
    "OUTLIER_BETA",
    "outlier_channels",
    "topic_samples",
    "bert_module",
    "build_bert_encoder",
    "bert_inputs",
]

import dataclasses
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from zonnx.zoo.torch_models import export_legacy, torch_threads

logger = logging.getLogger(__name__)

VOCAB = 8192
SEQ_LEN = 128
PAD, CLS, SEP, MASK = 0, 1, 2, 3
_FIRST_WORD = 4
SEED = 0
#: LayerNorm outlier channels (count, |beta|).
OUTLIER_CHANNELS = 4
OUTLIER_BETA = 3.0
#: HF BERT's additive attention bias for padded keys.
MASK_BIAS = -10000.0


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Sizes of the encoder (MiniLM-L6-H384's, with a smaller vocabulary)."""

    vocab: int = VOCAB
    hidden: int = 384
    layers: int = 6
    heads: int = 12
    ffn: int = 1536
    max_positions: int = 512
    type_vocab: int = 2
    eps: float = 1e-12


class BertSelfAttention(nn.Module):
    """Q, K, V projections, scaled dot product plus the additive mask bias, Softmax, context, output proj."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.hidden // cfg.heads
        self.query = nn.Linear(cfg.hidden, cfg.hidden)
        self.key = nn.Linear(cfg.hidden, cfg.hidden)
        self.value = nn.Linear(cfg.hidden, cfg.hidden)
        self.output = nn.Linear(cfg.hidden, cfg.hidden)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        n, s, _ = x.shape
        return x.view(n, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + bias
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v).permute(0, 2, 1, 3)
        return self.output(ctx.reshape(x.shape))


class BertLayer(nn.Module):
    """Post-LayerNorm layer: LN(x + Attn(x)), then LN(h + W2 GELU(W1 h))."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = BertSelfAttention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.intermediate = nn.Linear(cfg.hidden, cfg.ffn)
        self.act = nn.GELU()
        self.output = nn.Linear(cfg.ffn, cfg.hidden)
        self.output_norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h = self.attention_norm(x + self.attention(x, bias))
        return self.output_norm(h + self.output(self.act(self.intermediate(h))))


class BertEncoder(nn.Module):
    """Embeddings + encoder layers; ``forward`` returns the masked-mean sentence embedding [N, hidden]."""

    def __init__(self, cfg: BertConfig = BertConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.word = nn.Embedding(cfg.vocab, cfg.hidden, padding_idx=PAD)
        self.position = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.token_type = nn.Embedding(cfg.type_vocab, cfg.hidden)
        self.embed_norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.layers))
        self.register_buffer("position_ids", torch.arange(cfg.max_positions).unsqueeze(0), persistent=False)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        """HF BERT's init: N(0, 0.02) weights, zero biases, LayerNorm gamma 1 beta 0, zero padding row."""
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
            elif m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Last hidden states [N, S, hidden]."""
        s = input_ids.shape[1]
        types = torch.zeros_like(input_ids)
        x = self.word(input_ids) + self.position(self.position_ids[:, :s]) + self.token_type(types)
        x = self.embed_norm(x)
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * MASK_BIAS
        for layer in self.layers:
            x = layer(x, bias)
        return x

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.hidden_states(input_ids, attention_mask)
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


# ---------------------------------------------------------------- synthetic language


class SyntheticText:
    """A seeded topical bigram language over a Zipf vocabulary.

    Each of ``TOPICS`` topics owns 256 words (its own Zipf order). A next word follows the current
    word's 8 likely successors with probability 0.5 (weights 1/rank), else is a fresh draw: a topic word
    with probability 0.5, a word of the global Zipf unigram otherwise. A sentence has one topic, so its
    bag of words tells the topic. Sentences are ``[CLS] words [SEP]`` with log-normal lengths (median
    ~24 tokens, like real sentences), padded with PAD; the attention mask is 1 on real tokens.
    """

    SUCCESSORS = 8
    TOPICS = 32
    TOPIC_WORDS = 256

    def __init__(self, seed: int = SEED, vocab: int = VOCAB) -> None:
        rng = np.random.default_rng(seed)
        words = vocab - _FIRST_WORD
        ranks = np.arange(1, words + 1, dtype=np.float64)
        self.unigram = ranks**-1.1 / np.sum(ranks**-1.1)
        self.succ = rng.choice(words, size=(words, self.SUCCESSORS), p=self.unigram) + _FIRST_WORD
        w = 1.0 / np.arange(1, self.SUCCESSORS + 1)
        self.succ_p = np.cumsum(w / w.sum())
        self.topic_words = (
            np.stack([rng.choice(words, self.TOPIC_WORDS, replace=False) for _ in range(self.TOPICS)])
            + _FIRST_WORD
        )
        tr = np.arange(1, self.TOPIC_WORDS + 1, dtype=np.float64) ** -1.0
        self.topic_p = tr / tr.sum()

    def _fresh(self, rng: np.random.Generator, topics: np.ndarray) -> np.ndarray:
        n = len(topics)
        common = rng.choice(len(self.unigram), size=n, p=self.unigram) + _FIRST_WORD
        local = self.topic_words[topics, rng.choice(self.TOPIC_WORDS, size=n, p=self.topic_p)]
        return np.where(rng.random(n) < 0.5, local, common)

    def _words(self, rng: np.random.Generator, topics: np.ndarray, length: int) -> np.ndarray:
        n = len(topics)
        out = np.empty((n, length), dtype=np.int64)
        out[:, 0] = self._fresh(rng, topics)
        for t in range(1, length):
            follow = rng.random(n) < 0.5
            pick = np.minimum(np.searchsorted(self.succ_p, rng.random(n)), self.SUCCESSORS - 1)
            out[:, t] = np.where(
                follow, self.succ[out[:, t - 1] - _FIRST_WORD, pick], self._fresh(rng, topics)
            )
        return out

    def batch(
        self,
        rng: np.random.Generator,
        n: int,
        seq_len: int,
        *,
        topics: np.ndarray | None = None,
        min_len: int = 6,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` padded sentences: ``(input_ids, attention_mask, topics)``; ids and mask int64 [n, seq_len]."""
        topics = rng.integers(0, self.TOPICS, n) if topics is None else np.asarray(topics)
        lengths = np.clip(np.round(rng.lognormal(np.log(24), 0.6, n)), min_len, seq_len).astype(int)
        words = self._words(rng, topics, seq_len - 2)
        ids = np.full((n, seq_len), PAD, dtype=np.int64)
        mask = np.zeros((n, seq_len), dtype=np.int64)
        for i, length in enumerate(lengths):
            ids[i, 0], ids[i, 1 : length - 1], ids[i, length - 1] = CLS, words[i, : length - 2], SEP
            mask[i, :length] = 1
        return ids, mask, topics


# ---------------------------------------------------------------- weights and export


def outlier_channels(seed: int = SEED, hidden: int = 384) -> list[int]:
    """The LayerNorm outlier channels of the encoder built with ``seed``."""
    rng = np.random.default_rng(seed)
    return sorted(int(d) for d in rng.choice(hidden, OUTLIER_CHANNELS, replace=False))


def bert_module(seed: int = SEED) -> BertEncoder:
    """The encoder with its deterministic weights (fixed-seed init plus LayerNorm outlier channels)."""
    torch.manual_seed(seed)
    model = BertEncoder()
    dims = outlier_channels(seed, model.cfg.hidden)
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0][: len(dims)])
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.bias[dims] = OUTLIER_BETA * signs
    return model.eval()


def topic_samples(n: int, seed: int = 0, seq_len: int = SEQ_LEN) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``n`` sentences as one batch feed and their topics (the stream ``bert_inputs`` draws from)."""
    rng = np.random.default_rng(10_000 + seed)
    ids, mask, topics = SyntheticText(SEED).batch(rng, n, seq_len)
    return {"input_ids": ids, "attention_mask": mask}, topics


def build_bert_encoder(path: Path) -> None:
    """Export the encoder to ``path``: inputs ``input_ids``, ``attention_mask`` int64 [N, S], output
    ``embedding`` float [N, 384]; the metadata keeps the seed and the outlier channels."""
    start = time.perf_counter()
    model = bert_module(SEED)
    feed = bert_inputs(1, seed=123)[0]
    with torch_threads():
        export_legacy(
            model,
            (torch.from_numpy(feed["input_ids"]), torch.from_numpy(feed["attention_mask"])),
            Path(path),
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            dynamic_axes={
                "input_ids": {0: "N", 1: "S"},
                "attention_mask": {0: "N", 1: "S"},
                "embedding": {0: "N"},
            },
            metadata={
                "zonnx.zoo": "bert_encoder-random",
                "zonnx.seed": str(SEED),
                "zonnx.trained": "no",
                "zonnx.outlier_channels": ",".join(map(str, outlier_channels(SEED))),
            },
        )
    logger.info("built %s in %.1f s", path, time.perf_counter() - start)


def bert_inputs(n: int, seed: int = 0, seq_len: int = SEQ_LEN) -> list[dict[str, np.ndarray]]:
    """``n`` feeds ``{"input_ids", "attention_mask"}`` (int64 1 x seq_len): seeded synthetic sentences of
    varying length (log-normal, median ~24 tokens), padded with PAD, mask 1 on real tokens."""
    batch, _ = topic_samples(n, seed, seq_len)
    return [{k: v[i : i + 1] for k, v in batch.items()} for i in range(n)]
