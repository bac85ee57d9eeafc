"""MtpHead: a model's own multi-token-prediction layer (DeepSeek-V3's and GLM-4.5's NextN layers,
SGLang's NEXTN) as a draft head, in the interface of EagleHead (eagle_head.py), so the EAGLE draft
source (eagle.py) drafts with it.

The forward (DeepSeek-V3 report, "MTP module"; SGLang's deepseek_nextn.py / glm4_moe_nextn.py): for
row t, the target's hidden state h_t (after its final norm: what SGLang's capture hands over, and
what EagleCapture keeps) and the embedding of the token at t + 1:

    x = eh_proj([enorm(embed(t + 1)), hnorm(h_t)])       (the embedding first)
    y = the family's decoder layer (its attention over the head's own KV, its MoE / MLP)
    out = shared_head.norm(y)  ->  shared_head.head (or the target's LM head): the token at t + 2

`out` is also the hidden state the next draft step reads (SGLang reuses the one head for
--speculative-num-steps levels, feeding it its own normed output; where a checkpoint has several
whole heads, DeepSeek-V3's / GLM's num_nextn_predict_layers > 1, step k runs head k instead, on
its own KV layer: llama.cpp's chained heads, eagle.py).

The decoder layer is the target family's own class (model/models/*), built for layer index
num_hidden_layers, with its weights in the file's own quantization; only its attention op is
swapped for HeadAttention / LatentHeadAttention, which attend through the caller's `Attend` (the
draft source's paged head KV and tree, or causal attention while fitting the head).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.speculative.eagle_head import Attend


@dataclass(frozen=True)
class MtpHeadConfig:
    """What the draft source reads of a head (EagleHeadConfig's names): one attention layer whose
    KV entries are num_kv_heads x head_dim (MLA: one latent of kv_lora_rank + qk_rope_head_dim)."""

    kind: str  # "nextn"
    architecture: str  # the target's
    layer_index: int  # the checkpoint's index of the MTP layer (num_hidden_layers + i)
    hidden_size: int
    vocab_size: int
    num_kv_heads: int
    head_dim: int
    num_layers: int = 1
    draft_vocab_size: int | None = None


class HeadAttention(nn.Module):
    """Stands in for a GQA layer's RadixAttention: q [rows, heads * d], k / v [rows, kv_heads * d]
    (roped by the layer) through the current Attend, which scales by d ** -0.5 as the layer does."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.attend: Attend | None = None
        self.kv_layer = 0  # chained heads: head i's KV is the draft pool's layer i

    @property
    def kv_shape(self) -> tuple[int, int]:
        return self.num_kv_heads, self.head_dim

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, forward_batch: Any):
        d = self.head_dim
        return self.attend(
            q.reshape(-1, self.num_heads, d).contiguous(),
            k.reshape(-1, self.num_kv_heads, d).contiguous(),
            v.reshape(-1, self.num_kv_heads, d).contiguous(),
            self.kv_layer,
        )


class LatentHeadAttention(nn.Module):
    """Stands in for an MLA layer's MLAAttention, absorbed as MLA's decode path does: one KV entry
    per row, [c_kv | k_pe] (kv_lora_rank + qk_rope_head_dim, what the target's latent pool holds
    too), queries q_nope @ W_UK | q_pe, values [c_kv | 0]; the output's latent part goes through
    W_UV. The queries are pre-scaled so that the Attend's plain entry_dim ** -0.5 gives MLA's
    softmax scale (YaRN's mscale included)."""

    def __init__(self, mla: nn.Module):
        super().__init__()
        self.mla = [mla]  # not a submodule: it holds no weights and keeps its own name
        self.attend: Attend | None = None
        self.kv_layer = 0
        self.entry_dim = mla.kv_lora_rank + mla.qk_rope_head_dim
        self.q_scale = mla.scaling * math.sqrt(self.entry_dim)

    @property
    def kv_shape(self) -> tuple[int, int]:
        return 1, self.entry_dim

    def forward(self, q: torch.Tensor, latent: torch.Tensor, forward_batch: Any) -> torch.Tensor:
        mla = self.mla[0]
        rank, heads = mla.kv_lora_rank, mla.num_heads
        w_uk, w_uv = mla.kv_b_per_head()  # [heads, nope, rank], [heads, v, rank]
        q_nope, q_pe = q.split([mla.qk_nope_head_dim, mla.qk_rope_head_dim], dim=-1)
        q_lat = torch.einsum("thn,hnr->thr", q_nope.float(), w_uk.float())
        qq = (torch.cat((q_lat, q_pe.float()), dim=-1) * self.q_scale).contiguous()
        k = latent.float().reshape(-1, 1, self.entry_dim).contiguous()
        v = torch.cat((k[..., :rank], torch.zeros_like(k[..., rank:])), dim=-1)
        o = self.attend(qq, k, v, self.kv_layer).view(-1, heads, self.entry_dim)[..., :rank]
        return torch.einsum("thr,hvr->thv", o, w_uv.float()).reshape(-1, heads * mla.v_head_dim)


class MtpHead(nn.Module):
    """layers: the family's decoder layer per chained head (one, or num_nextn_predict_layers where
    the family chains them: draft step k runs head k, as llama.cpp's chained MTP heads), each
    carrying the NextN modules under the checkpoint's names (enorm, hnorm, eh_proj,
    shared_head.norm, and shared_head.head / embed_tokens when the file has its own), so it loads as
    `model.layers.{layer_index + i}` of the target's class (mtp_checkpoint.py).
    """

    def __init__(self, cfg: MtpHeadConfig, layers: list[nn.Module], attentions: list[nn.Module]):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(layers)
        # HeadAttention / LatentHeadAttention inside each layer's attention, head i's on KV layer i
        self.attention = list(attentions)
        for i, a in enumerate(self.attention):
            a.kv_layer = i

    @property
    def layer(self) -> nn.Module:
        """The first head: the one a single-head model has, and what fitting trains."""
        return self.layers[0]

    @property
    def num_chained(self) -> int:
        return len(self.layers)

    @property
    def own_vocab(self) -> bool:
        return hasattr(self.layer.shared_head, "head")

    @property
    def own_embedding(self) -> nn.Module | None:
        return getattr(self.layer, "embed_tokens", None)

    def draft_token_ids(self) -> torch.Tensor | None:
        return None  # its own head (when it has one) ranks the target's whole vocabulary

    @property
    def lm_head(self) -> nn.Module:
        return self.layer.shared_head.head

    def for_serving(self, quantize: str | None) -> MtpHead:
        """Its weights stay as loaded (the file's quantization, or the target's --quantization)."""
        return self

    def fit_parameters(self) -> list[nn.Parameter]:
        """What fitting trains (eagle_train.py): the projection and the norms around the family's
        layer; the layer keeps its loaded weights (its kernels have no backward)."""
        ly = self.layer
        return [ly.eh_proj.weight, ly.enorm.weight, ly.hnorm.weight, ly.shared_head.norm.weight]

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        attend: Attend,
        from_target: bool,
        head: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """EagleHead.forward's contract: -> (logit_hidden, next_hidden), both shared_head.norm's
        output (the next step reads the head's own normed state, as SGLang's NEXTN does); head:
        which chained head runs."""
        ly = self.layers[head]
        self.attention[head].attend = attend
        training = torch.is_grad_enabled() and ly.eh_proj.weight.requires_grad
        if training:  # torch ops only: the fused norms and matmuls have no backward
            x = F.linear(
                torch.cat((ly.enorm._norm(embeds), ly.hnorm._norm(hidden)), dim=-1),
                ly.eh_proj.weight,
            )
            with torch.no_grad():
                out, residual = ly(positions, x.detach().clone(), None, None)
                delta = out + residual - x.detach()
            y = ly.shared_head.norm._norm(x + delta)
            return y, y
        x = ly.eh_proj(torch.cat((ly.enorm(embeds), ly.hnorm(hidden)), dim=-1))
        out, residual = ly(positions, x, None, None)
        y = ly.shared_head.norm(out + residual)
        return y, y
