"""Llama 4's text model (Llama4ForCausalLM, Scout / Maverick's language model; transformers'
modeling_llama4 is the reference).

The Llama graph (pre-norm, fused residual) with:
- attention: three of four layers (config.no_rope_layers 1) rotate q/k, L2-normalize them after the
  rotation (use_qk_norm: no weight) and attend only within their chunk of attention_chunk_size
  positions (RadixAttention.attention_chunk_size: the native kernel's chunked attention); the others
  are NoPE global layers whose queries are scaled by log1p(floor((p + 1) / floor_scale)) *
  attn_scale + 1 (attn_temperature_tuning). HF rotates interleaved pairs (a complex product); the
  q / k rows of each head are permuted at load to the rotate_half layout (pairs (2i, 2i + 1) become
  (i, i + D/2)), which changes no score: q and k move alike, and the L2 norm ignores order;
- the layers of config.moe_layers a mixture of experts: a sigmoid over the top-1 router logit
  scales the token's input to its expert (top-1 only: Llama4TextMoe), and a shared expert runs on
  every token, ungated; the other layers a dense MLP of intermediate_size_mlp.

Weights: HF safetensors (feed_forward.* read as mlp.*; the experts' stacked gate_up_proj [E, hidden,
2 * inter] with gate then up, down_proj [E, inter, hidden]), of the text model or of the released
multimodal checkpoints (Llama4ForConditionalGeneration: the language model under `language_model.`,
its vision tower and projector skipped; text in, text out). Not yet: images, GGUF, tp / pp above 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.attention.radix_attention import RadixAttention
from radixlm.model.layers.moe.moe_block import MoeSpec, SparseMoeBlock
from radixlm.model.layers.rotary import RotaryEmbedding
from radixlm.model.models.llama import LlamaAttention, LlamaMLP, get_head_dim
from radixlm.model.models.moe import MoeDecoderLayer, MoeForCausalLM


def l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Llama4TextL2Norm over the last dim, in float32."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class Llama4Attention(LlamaAttention):
    def __init__(self, config: Any, layer_id: int, rotary_emb, qkv_bias: bool, qk_norm: bool):
        super().__init__(config, layer_id, rotary_emb, qkv_bias, qk_norm=False)
        self.use_rope = bool(config.no_rope_layers[layer_id])
        self.use_qk_norm = bool(getattr(config, "use_qk_norm", False)) and self.use_rope
        self.eps = config.rms_norm_eps
        self.temperature_tuning = bool(config.attn_temperature_tuning) and not self.use_rope
        self.floor_scale, self.attn_scale = float(config.floor_scale), float(config.attn_scale)
        chunk = getattr(config, "attention_chunk_size", None) if self.use_rope else None
        self.attn = RadixAttention(
            self.num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            self.num_kv_heads,
            layer_id,
            attention_chunk_size=chunk,
        )

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.use_rope:
            q, k = self.rotary_emb(positions, q, k)
            if self.use_qk_norm:
                q = l2_norm(q.reshape(-1, self.num_heads, self.head_dim), self.eps)
                k = l2_norm(k.reshape(-1, self.num_kv_heads, self.head_dim), self.eps)
                q, k = q.reshape(-1, self.q_size), k.reshape(-1, self.kv_size)
        elif self.temperature_tuning:
            pos = positions.to(torch.float32)
            scale = torch.log1p(torch.floor((pos + 1.0) / self.floor_scale)) * self.attn_scale + 1.0
            q = (q * scale[:, None]).to(q.dtype)
        return self.o_proj(self.attn(q, k, v, forward_batch))


class Llama4MoeBlock(SparseMoeBlock):
    """Llama4TextMoe: the top-1 expert's input scaled by the sigmoid of its router logit (not its
    output), plus the shared expert on every token, ungated."""

    def __init__(self, config: Any, layer_id: int, spec: MoeSpec, dispatch):
        super().__init__(config.hidden_size, spec, layer_id, dispatch=dispatch)
        self.llama4_shared_expert = LlamaMLP(config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w13 is None:
            self._views()
        top, ids = torch.topk(self.gate(x), 1, dim=-1)  # HF's topk over the logits
        score = torch.sigmoid(top.float()).to(x.dtype)
        self.expert_load.scatter_add_(0, ids.reshape(-1), torch.ones_like(ids.reshape(-1)))
        routed = self._routed(x * score, torch.ones_like(score, dtype=torch.float32), ids)
        return routed + self.llama4_shared_expert(x)


class Llama4ForCausalLM(MoeForCausalLM):
    attention_cls = Llama4Attention
    # A Llama4ForConditionalGeneration checkpoint's parts this text model does not run.
    SKIPPED_PREFIXES = ("vision_model.", "multi_modal_projector.")

    def __init__(self, config: Any):
        super().__init__(config.get_text_config())

    def build_model(self, config: Any) -> nn.Module:
        if config.num_experts_per_tok != 1:
            raise ValueError(
                f"Llama 4 routes each token to one expert; num_experts_per_tok"
                f" {config.num_experts_per_tok} is not supported"
            )
        return super().build_model(config)

    def moe_spec(self, config: Any) -> MoeSpec:
        return MoeSpec(config.num_local_experts, 1, config.intermediate_size, renormalize=False)

    def is_sparse(self, config: Any, layer_id: int) -> bool:
        return layer_id in (config.moe_layers or [])

    def build_layer(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
        attn = Llama4Attention(config, layer_id, rotary_emb, False, False)
        if self.is_sparse(config, layer_id):
            mlp: nn.Module = Llama4MoeBlock(
                config, layer_id, self.moe_spec(config), self.expert_dispatch
            )
        else:
            mlp = LlamaMLP(config.hidden_size, config.intermediate_size_mlp)
        return MoeDecoderLayer(config, attn, mlp)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._hf_names(weights))

    def _hf_names(self, weights):
        """HF Llama 4's names and layouts as the MoE families' loader takes them."""
        cfg = self.config
        head_dim = get_head_dim(cfg)
        heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}
        for name, t in weights:
            if name.startswith(self.SKIPPED_PREFIXES):
                continue
            name = name.removeprefix("language_model.")  # a ConditionalGeneration checkpoint
            name = name.replace(".feed_forward.", ".mlp.")
            name = name.replace(".mlp.router.", ".mlp.gate.")
            name = name.replace(".mlp.shared_expert.", ".mlp.llama4_shared_expert.")
            proj = name.rsplit(".", 2)[-2] if name.endswith(".weight") else None
            if ".self_attn." in name and proj in heads:
                t = _to_rotate_half(t, heads[proj], head_dim)
            elif name.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")):
                t = t.transpose(1, 2).contiguous()  # x @ W -> rows W [E, out, in]
            yield name, t


def _to_rotate_half(w, n_heads: int, head_dim: int):
    """q / k projection rows of each head from interleaved pairs (2i, 2i + 1) to (i, i + D/2); a
    GGUF's quantized rows move whole (their blocks run along the input)."""
    from radixlm.model.layers.quantized import QuantizedTensor

    order = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])
    rows = w.data if isinstance(w, QuantizedTensor) else w
    out = rows.view(n_heads, head_dim, -1)[:, order].reshape(rows.shape).contiguous()
    return QuantizedTensor(out, w.fmt, w.cols) if isinstance(w, QuantizedTensor) else out
