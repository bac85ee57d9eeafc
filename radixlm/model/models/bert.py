"""BERT / XLM-RoBERTa cross-encoders (`BertForSequenceClassification`,
`XLMRobertaForSequenceClassification`: the bge-reranker family, ms-marco cross-encoders): a
bidirectional encoder over the pair "[CLS] query [SEP] doc [SEP]" and a classifier head on the
first token's hidden state, served with --is-embedding on /v1/rerank (engine/rerank.py).

An encoder keeps no KV: every request is prefilled whole in one forward (the scheduler turns
chunked prefill off for it and its CLS pooling takes nothing from the prefix cache), and each
request's tokens attend to all of its own tokens (SDPA without a causal mask, request by request).
HF's names and maths throughout (modeling_bert.py, modeling_xlm_roberta.py), absolute position
embeddings only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.traits import ModelTraits, ServedModel

_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class _Embeddings(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        h = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, h)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, h)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, h)
        self.LayerNorm = nn.LayerNorm(h, eps=config.layer_norm_eps)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, types: torch.Tensor):
        x = self.word_embeddings(ids) + self.position_embeddings(positions)
        return self.LayerNorm(x + self.token_type_embeddings(types))


class _SelfAttention(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = h // self.num_heads
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)

    def forward(self, x: torch.Tensor, lens: list[int]) -> torch.Tensor:
        shape = (-1, self.num_heads, self.head_dim)
        q, k, v = (p(x).view(shape).transpose(0, 1) for p in (self.query, self.key, self.value))
        outs = [  # each request over its own tokens only, no causal mask: [heads, n, D]
            F.scaled_dot_product_attention(qi, ki, vi)
            for qi, ki, vi in zip(q.split(lens, 1), k.split(lens, 1), v.split(lens, 1))
        ]
        return torch.cat(outs, 1).transpose(0, 1).reshape(x.shape)


class _DenseNorm(nn.Module):
    """HF's BertSelfOutput / BertOutput: LayerNorm(dense(x) + residual)."""

    def __init__(self, d_in: int, config: Any):
        super().__init__()
        self.dense = nn.Linear(d_in, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class _Attention(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.self = _SelfAttention(config)
        self.output = _DenseNorm(config.hidden_size, config)


class _Intermediate(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)


class _Layer(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        if config.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act {config.hidden_act!r}: not one of {sorted(_ACTIVATIONS)}")
        self.act = _ACTIVATIONS[config.hidden_act]
        self.attention = _Attention(config)
        self.intermediate = _Intermediate(config)
        self.output = _DenseNorm(config.intermediate_size, config)

    def forward(self, x: torch.Tensor, lens: list[int]) -> torch.Tensor:
        a = self.attention.output(self.attention.self(x, lens), x)
        return self.output(self.act(self.intermediate.dense(a)), a)


class _Encoder(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.layer = nn.ModuleList(_Layer(config) for _ in range(config.num_hidden_layers))


class _EncoderModel(nn.Module):
    """HF's BertModel / XLMRobertaModel without the pooler: embeddings and the layers."""

    def __init__(self, config: Any):
        super().__init__()
        self.embeddings = _Embeddings(config)
        self.encoder = _Encoder(config)

    def forward(self, ids, positions, types, lens: list[int]) -> torch.Tensor:
        x = self.embeddings(ids, positions, types)
        for layer in self.encoder.layer:
            x = layer(x, lens)
        return x


class _CrossEncoder(ServedModel):
    """What both families share: the encoder under `prefix`, the forward, the weight loading."""

    prefix = ""  # the encoder's name in the checkpoint (bert / roberta)
    encoder_only = True  # the runner: no decoding, whole prompts, pooled CLS through classify()
    pairs_have_segments = False  # BERT: token type 1 from the first [SEP] on (a pair's second)
    position_offset = 0  # RoBERTa counts positions from padding_idx + 1

    def __init__(self, config: Any):
        super().__init__()
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            raise ValueError(
                f"position_embedding_type {config.position_embedding_type!r}: only absolute"
                " position embeddings are served"
            )
        self.config = config
        self.num_labels = int(config.num_labels)
        # The tokenizer's [SEP] / </s> id: the runner sets it from the tokenizer (a BERT config
        # does not carry it); it splits a pair into its two segments.
        self.sep_token_id: int | None = None

    def traits(self) -> ModelTraits:
        return ModelTraits(encoder_only=True, context_len=self.max_tokens)

    @property
    def max_tokens(self) -> int:
        """The longest input the position embeddings cover."""
        return self.config.max_position_embeddings - self.position_offset

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """-> the last layer's hidden states [num_tokens, hidden] (no final norm: BERT has none)."""
        prefix = forward_batch.extend_prefix_lens_cpu
        if not forward_batch.forward_mode.is_extend() or any(prefix or ()):
            raise RuntimeError("an encoder reads every request whole in one forward")
        lens = list(forward_batch.extend_seq_lens_cpu)
        return getattr(self, self.prefix)(
            input_ids, positions + self.position_offset, self._token_types(input_ids, lens), lens
        )

    def _token_types(self, ids: torch.Tensor, lens: list[int]) -> torch.Tensor:
        """HF tokenizers' token_type_ids of each pair: 0 up to the first [SEP], 1 after it."""
        if not self.pairs_have_segments or self.config.type_vocab_size < 2:
            return torch.zeros_like(ids)
        if self.sep_token_id is None:
            raise RuntimeError("the tokenizer's sep_token_id was not set")
        types = []
        for part in ids.split(lens):
            seps = (part == self.sep_token_id).int()
            types.append(((seps.cumsum(0) - seps) > 0).to(ids.dtype))  # after the first [SEP]
        return torch.cat(types)

    def classify(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        """[bs, hidden] first-token hidden states -> [bs, num_labels] logits."""
        raise NotImplementedError

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Every parameter from HF's names; raise on a missing or unknown one."""
        params = dict(self.named_parameters())
        seen, unknown = set(), []
        for name, tensor in weights:
            if name.endswith(".position_ids") or name.endswith(".token_type_ids"):
                continue  # HF's buffers
            if name not in params:
                # The base model's pooler: BERT keeps it (its head reads it); RoBERTa's is unused.
                if not name.startswith(f"{self.prefix}.pooler."):
                    unknown.append(name)
                continue
            if params[name].shape != tensor.shape:
                raise ValueError(
                    f"{name}: expected shape {tuple(params[name].shape)}, got {tuple(tensor.shape)}"
                )
            params[name].copy_(tensor)
            seen.add(name)
        if unknown:
            raise ValueError(f"unexpected weights in the checkpoint: {unknown[:5]}")
        missing = sorted(set(params) - seen)
        if missing:
            raise ValueError(f"weights missing from the checkpoint: {missing[:5]}")


class _Pooler(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)


class _BertWithPooler(_EncoderModel):
    def __init__(self, config: Any):
        super().__init__(config)
        self.pooler = _Pooler(config)


class BertForSequenceClassification(_CrossEncoder):
    """HF's: tanh(pooler.dense(h_cls)) -> classifier."""

    prefix = "bert"
    pairs_have_segments = True

    def __init__(self, config: Any):
        super().__init__(config)
        self.bert = _BertWithPooler(config)
        self.classifier = nn.Linear(config.hidden_size, self.num_labels)

    def classify(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.tanh(self.bert.pooler.dense(cls_hidden)))


class _ClassificationHead(nn.Module):
    def __init__(self, config: Any, num_labels: int):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, num_labels)


class XLMRobertaForSequenceClassification(_CrossEncoder):
    """HF's RobertaClassificationHead: out_proj(tanh(dense(h_cls))); no base-model pooler."""

    prefix = "roberta"

    def __init__(self, config: Any):
        super().__init__(config)
        self.position_offset = int(config.pad_token_id) + 1
        self.roberta = _EncoderModel(config)
        self.classifier = _ClassificationHead(config, self.num_labels)

    def classify(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier.out_proj(torch.tanh(self.classifier.dense(cls_hidden)))
