"""NSAIndexer: DeepSeek-V3.2's lightning indexer (DeepSeek Sparse Attention; SGLang's "nsa"
indexer, vLLM's sparse_attn_indexer), as transformers' DeepseekV32Indexer computes it.

Per token it makes one small key, k = LayerNorm(wk(x)) (index_head_dim, one head), and per query
index_n_heads small queries from the MLA's q LoRA output (wq_b(q_resid)) with a weight each
(weights_proj(x) / sqrt(index_n_heads)). RoPE turns the first qk_rope_head_dim dims of both, in
rotate-half pairs (unlike MLA's interleaved ones). A query's score of a cached token t is
sum_h w_h * relu(q_h . k_t / sqrt(index_head_dim)); it attends only its top index_topk visible
tokens by that score (all of them when fewer are visible). No Hadamard rotation: transformers
skips DeepSeek's (an orthogonal map leaves q . k unchanged), as it skips the FP8 scoring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.layers.linear import Linear


@dataclass
class IndexerOutput:
    q: torch.Tensor  # [T, index_n_heads, index_head_dim]
    k: torch.Tensor  # [T, index_head_dim], what the KV pool keeps per slot
    weights: torch.Tensor  # [T, index_n_heads] float32, the heads' weights (scaled)


class NSAIndexer(nn.Module):
    def __init__(self, config: Any, rotary_emb: nn.Module):
        super().__init__()
        self.n_heads, self.head_dim = config.index_n_heads, config.index_head_dim
        self.rope = config.qk_rope_head_dim
        self.wq_b = Linear(config.q_lora_rank, self.n_heads * self.head_dim)
        self.wk = Linear(config.hidden_size, self.head_dim)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)  # DeepSeek's value, as HF's
        self.weights_proj = Linear(config.hidden_size, self.n_heads)
        self.rotary_emb = rotary_emb

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, q_resid: torch.Tensor
    ) -> IndexerOutput:
        t, r = hidden.shape[0], self.rope
        q = self.wq_b(q_resid).view(t, self.n_heads, self.head_dim)
        k = self.k_norm(self.wk(hidden))
        # Copies: the rotary op may turn its inputs in place.
        q_rot, k_rot = self.rotary_emb(
            positions, q[..., :r].reshape(t, self.n_heads * r), k[:, :r].contiguous()
        )
        q = torch.cat((q_rot.view(t, self.n_heads, r), q[..., r:]), dim=-1)
        k = torch.cat((k_rot, k[:, r:]), dim=-1)
        weights = self.weights_proj(hidden).float() * self.n_heads**-0.5
        return IndexerOutput(q, k, weights)


# Scores per block of queries at most this many float32 elements ([rows, heads, tokens]): a long
# prefill's whole score tensor would be prompt² x heads.
SCORE_BLOCK_ELEMS = 1 << 24


def select_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    visible: torch.Tensor,
    topk: int,
) -> torch.Tensor:
    """The tokens each query attends (HF's rule: top `topk` of the visible ones by the indexer's
    score, torch.topk's order among ties; all visible ones when fewer).

    q [S, heads, D], weights [S, heads], keys [L, D] (shared) or [S, L, D] (per query), visible
    [S, L] bool -> keep [S, L] bool."""
    s, heads = q.shape[:2]
    length = visible.shape[-1]
    keep = torch.zeros_like(visible)
    step = max(1, SCORE_BLOCK_ELEMS // max(1, heads * length))
    for a in range(0, s, step):
        b = min(s, a + step)
        k = keys if keys.dim() == 2 else keys[a:b]
        scores = torch.matmul(q[a:b].float(), k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
        scores = F.relu(scores)  # [rows, heads, L]
        index = torch.matmul(weights[a:b].unsqueeze(-2), scores).squeeze(-2)  # [rows, L]
        # Hidden tokens score HF's additive mask (the dtype's minimum): below every visible one.
        index = index.masked_fill(~visible[a:b], torch.finfo(index.dtype).min)
        picked = index.topk(min(topk, length), dim=-1).indices
        keep[a:b].scatter_(-1, picked, True)
    return keep & visible
