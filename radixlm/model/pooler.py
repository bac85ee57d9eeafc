"""Pooling of an embedding model (--is-embedding): one vector per request from the final hidden
states (after the last norm, no lm_head), L2-normalized.

The kind comes from the model: sentence-transformers' modules.json -> its Pooling module's
config.json (pooling_mode_mean_tokens / _cls_token / _lasttoken), a GGUF's `{arch}.pooling_type`
(llama.cpp: 1 mean, 2 cls, 3 last), else last-token (SGLang's default for decoder embedding
models: gte-Qwen2, e5-mistral).

A request's prompt may run in several chunks (chunked prefill) and, for last-token pooling, after
a cached prefix: each forward returns a per-request *partial* (`Pooler.partial`), the scheduler
folds the partials (`fold`) and ends with `finish`. Mean and cls need every token's hidden state,
so those requests take nothing from the prefix cache (`needs_all_tokens`).

A cross-encoder (model/models/bert.py) pools its first token through its classifier (`head`): the
"embedding" is then the raw logits [num_labels], never normalized (engine/rerank.py reads them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import torch


class PoolingType(Enum):
    LAST = "last"
    MEAN = "mean"
    CLS = "cls"


# sentence-transformers' Pooling config keys, and llama.cpp's pooling_type numbers.
_ST_MODES = {
    "pooling_mode_lasttoken": PoolingType.LAST,
    "pooling_mode_mean_tokens": PoolingType.MEAN,
    "pooling_mode_cls_token": PoolingType.CLS,
}
_GGUF_TYPES = {1: PoolingType.MEAN, 2: PoolingType.CLS, 3: PoolingType.LAST}


def _sentence_transformers_pooling(model_dir: str) -> PoolingType | None:
    modules = os.path.join(model_dir, "modules.json")
    if not os.path.isfile(modules):
        return None
    with open(modules) as f:
        entries = json.load(f)
    for m in entries:
        if str(m.get("type", "")).endswith("models.Pooling"):
            with open(os.path.join(model_dir, m.get("path", ""), "config.json")) as f:
                cfg = json.load(f)
            modes = [kind for key, kind in _ST_MODES.items() if cfg.get(key)]
            if len(modes) != 1:  # e.g. max pooling, or several concatenated: not served
                raise ValueError(
                    f"{model_dir}: the sentence-transformers pooling {cfg} is not one of "
                    f"{', '.join(_ST_MODES)}"
                )
            return modes[0]
    return None


def _gguf_pooling(path: str) -> PoolingType | None:
    from radixlm.model.gguf.fields import field
    from radixlm.model.gguf.loader import gguf_architecture
    from radixlm.model.gguf.reader import open_gguf

    reader = open_gguf(path)
    value = field(reader, f"{gguf_architecture(reader)}.pooling_type")
    if value is None or int(value) == 0:  # 0: llama.cpp's "none"
        return None
    if int(value) not in _GGUF_TYPES:
        raise ValueError(f"{path}: GGUF pooling_type {value} is not mean (1), cls (2) or last (3)")
    return _GGUF_TYPES[int(value)]


def read_pooling_type(model_path: str) -> PoolingType:
    """The model's pooling (module docstring); last-token when the model names none."""
    if os.path.isdir(model_path):
        found = _sentence_transformers_pooling(model_path)
    else:
        found = _gguf_pooling(model_path) if model_path.endswith(".gguf") else None
    return found or PoolingType.LAST


@dataclass(frozen=True)
class Pooler:
    pooling_type: PoolingType
    # A classifier over the pooled rows ([bs, hidden] -> [bs, num_labels]); None: the embedding.
    head: Callable[[torch.Tensor], torch.Tensor] | None = None

    @classmethod
    def of(cls, model: torch.nn.Module, model_path: str) -> Pooler:
        """An encoder's classifier over its first token, else the model's pooling (above)."""
        if model.traits().encoder_only:
            return cls(PoolingType.CLS, head=model.classify)
        return cls(read_pooling_type(model_path))

    @property
    def needs_all_tokens(self) -> bool:
        """Whether a request needs the hidden state of every prompt token (no cached prefix)."""
        return self.pooling_type is not PoolingType.LAST

    def partial(self, hidden: torch.Tensor, extend_lens: list[int]) -> torch.Tensor:
        """[bs, hidden] float32: each request's part of this forward (rows in batch order)."""
        ends = torch.tensor(extend_lens, dtype=torch.int64).cumsum(0)
        if self.pooling_type is PoolingType.LAST:
            return hidden[(ends - 1).to(hidden.device)].float()
        if self.pooling_type is PoolingType.CLS:
            rows = hidden[(ends - torch.tensor(extend_lens)).to(hidden.device)]
            return (rows if self.head is None else self.head(rows)).float()
        return torch.stack([part.float().sum(0) for part in torch.split(hidden, extend_lens)])

    def fold(self, acc: torch.Tensor | None, part: torch.Tensor) -> torch.Tensor:
        """A request's partials so far, with the next chunk's."""
        if acc is None:
            return part
        if self.pooling_type is PoolingType.MEAN:
            return acc + part
        return (
            acc if self.pooling_type is PoolingType.CLS else part
        )  # cls: the first chunk's first token

    def finish(self, acc: torch.Tensor, num_tokens: int) -> list[float]:
        vec = acc / num_tokens if self.pooling_type is PoolingType.MEAN else acc
        if self.head is not None:  # a classifier's logits, as they are
            return vec.float().tolist()
        return torch.nn.functional.normalize(vec.double(), dim=-1).float().tolist()
