"""What a draft head ranks its next tokens over (DraftVocab.logits, then token_ids maps a column to
the target's token id).

The target's LM head over its whole vocabulary is a large part of a small model's step
(SmolLM2-135M: 49,152 x 576, a fifth of its weights), and a head drafting five levels would pay it
five times. So:
- EAGLE with a token map (SGLang's --speculative-token-map, FR-Spec): the LM head's rows of those
  tokens only, as one float matrix;
- EAGLE-3 with its own vocabulary: its lm_head, d2t mapping draft ids to target ids;
- otherwise the target's own LM head (its kernels, its whole vocabulary).
A draft can then only propose mapped tokens; verification keeps the output exact either way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from radixlm.speculative.eagle_head import ServingLinear


class DraftVocab:
    def __init__(
        self, logits: Callable[[torch.Tensor], torch.Tensor], token_ids: torch.Tensor | None
    ):
        self.logits = logits  # [rows, hidden] -> [rows, columns] float
        self.token_ids = token_ids  # [columns] target ids; None: column j is token j

    def to_target(self, cols: torch.Tensor) -> torch.Tensor:
        return cols if self.token_ids is None else self.token_ids[cols]


def lm_head_rows(target: nn.Module, ids: torch.Tensor, hidden_size: int) -> torch.Tensor:
    """The target LM head's rows for `ids` as a float [len(ids), hidden] matrix: the tied
    embedding's rows, or the head applied to the identity (any layout, quantized ones included), a
    block at a time.
    """
    if getattr(target, "tie_word_embeddings", False):
        return target.model.embed_tokens(ids).float()
    out = torch.empty(ids.numel(), hidden_size)
    eye = torch.eye(hidden_size)
    for a in range(0, hidden_size, 64):
        out[:, a : a + 64] = target.compute_logits(eye[a : a + 64])[:, ids].T.float()
    return out


def target_vocab(
    target: nn.Module,
    token_map: torch.Tensor | None,
    hidden_size: int,
    quantize: str | None = None,
) -> DraftVocab:
    """The target's LM head, whole (its own kernels) or restricted to token_map's ids (a matrix of
    those rows, quantized to `quantize` or float)."""
    if token_map is None:
        return DraftVocab(lambda h: target.compute_logits(h).float(), None)
    return DraftVocab(
        ServingLinear([], quantize, lm_head_rows(target, token_map, hidden_size)), token_map
    )


def own_vocab(
    lm_head: nn.Linear, token_ids: torch.Tensor, quantize: str | None = None
) -> DraftVocab:
    return DraftVocab(ServingLinear([lm_head], quantize), token_ids)
