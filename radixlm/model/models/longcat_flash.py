"""LongCat-Flash (LongcatFlashForCausalLM, Meituan), module names as in the HF checkpoints
(transformers 5.x's longcat_flash is the reference; SGLang's models/longcat_flash.py serves it).

Each of the `num_layers` decoder layers holds two sub-layers, each an MLA attention
(DeepSeek-V3's, q always through its LoRA, with LongCat's LoRA scales: q times
sqrt(hidden / q_lora_rank), the normalized latent times sqrt(hidden / kv_lora_rank)) and a dense
MLP, plus one "shortcut-connected" MoE that reads the first sub-layer's post-attention norm and
whose output joins the stream at the end of the layer:

    h = h + attn0(in_norm0(h));  x = post_norm0(h);  moe = MoE(x);  h = h + mlps0(x)
    h = h + attn1(in_norm1(h));  h = h + mlps1(post_norm1(h)) + moe

The KV pool holds 2 * num_layers MLA layers (the config's num_hidden_layers): sub-layer j of layer
i is pool layer 2i + j, as HF's cache numbers them.

The MoE's router (HF's LongcatFlashTopkRouter): a float32 softmax over the n_routed_experts real
experts and zero_expert_num zero-computation experts, top-k on the scores + e_score_correction_bias,
weights the unbiased scores (not renormalized) times routed_scaling_factor. The zero experts return
their input times the weight and cost no matmul (layers/moe/zero_experts.py); the real ones run as
DeepSeek's (deepseek_moe.DeepseekExperts, the fused-MoE path). The MTP module (`model.mtp.*`) is
skipped at load, as HF does. llama.cpp's converter has no LongCat-Flash: HF safetensors only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from radixlm.distributed.parallel_state import get_tp_group
from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.moe.expert_dispatch import LocalExperts, expert_dispatch, forward_idle
from radixlm.model.layers.moe.topk import BiasedTopKRouting
from radixlm.model.layers.moe.zero_experts import zero_experts_compute
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.rotary import get_rope
from radixlm.model.models.deepseek_moe import DeepseekExperts, DeepseekGate
from radixlm.model.models.deepseek_v2 import DeepseekV2Attention, DeepseekV2ForCausalLM
from radixlm.model.models.llama import LlamaMLP

ARCH = "LongcatFlashForCausalLM"


def check_config(config: Any) -> None:
    """A clear error naming the field a LongCat-Flash config lacks or gets wrong."""
    for field in (
        "num_layers",
        "n_routed_experts",
        "moe_topk",
        "q_lora_rank",
        "expert_ffn_hidden_size",
    ):
        value = getattr(config, field, None)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{ARCH}: {field} must be a positive int, got {value!r}")
    zero = getattr(config, "zero_expert_num", None) or 0
    if not isinstance(zero, int) or zero < 0:
        raise ValueError(f"{ARCH}: zero_expert_num must be an int >= 0, got {zero!r}")
    if config.moe_topk > config.n_routed_experts + zero:
        raise ValueError(
            f"{ARCH}: moe_topk ({config.moe_topk}) must be at most n_routed_experts +"
            f" zero_expert_num ({config.n_routed_experts + zero})"
        )
    kind = getattr(config, "zero_expert_type", None) or "identity"  # Meituan's own configs name it
    if kind != "identity":
        raise ValueError(f"{ARCH}: zero_expert_type {kind!r}: radixlm runs 'identity' (HF's only)")
    for field in ("mla_scale_q_lora", "mla_scale_kv_lora"):
        # Meituan's configs carry these switches, HF always scales: a false one is ambiguous
        if getattr(config, field, True) is False:
            raise ValueError(f"{ARCH}: {field} false: HF's LongCat-Flash always scales")
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{ARCH}: hidden_act {act!r}: radixlm runs 'silu'")
    rope = config.qk_rope_head_dim
    if getattr(config, "head_dim", rope) != rope:
        raise ValueError(
            f"{ARCH}: head_dim ({config.head_dim}) must equal qk_rope_head_dim ({rope}): HF's"
            " RoPE table has head_dim dims and turns the qk_rope_head_dim ones"
        )
    qk = config.qk_nope_head_dim + rope
    if (getattr(config, "qk_head_dim", None) or qk) != qk:
        raise ValueError(
            f"{ARCH}: qk_head_dim ({config.qk_head_dim}) must equal qk_nope_head_dim +"
            f" qk_rope_head_dim ({qk})"
        )


class LongcatFlashMLA(DeepseekV2Attention):
    """DeepSeek-V3's MLA (interleaved RoPE, q LoRA) with LongCat's LoRA scales."""

    def __init__(self, config: Any, layer_id: int, rotary_emb: nn.Module):
        super().__init__(config, layer_id, rotary_emb, interleaved_rope=True)
        self.q_scale = (config.hidden_size / config.q_lora_rank) ** 0.5
        self.kv_scale = (config.hidden_size / config.kv_lora_rank) ** 0.5

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        t = hidden.shape[0]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden))) * self.q_scale
        q_nope, q_pe = q.view(t, self.num_heads, self.nope + self.rope).split(
            [self.nope, self.rope], dim=-1
        )
        kv_a = self.kv_a_proj_with_mqa(hidden)
        # the scaled latent is what HF caches and expands through kv_b_proj
        latent = self.kv_a_layernorm(kv_a[:, : self.kv_lora_rank].contiguous()) * self.kv_scale
        q_pe = self._deinterleave(q_pe).reshape(t, self.num_heads * self.rope)
        k_pe = self._deinterleave(kv_a[:, self.kv_lora_rank :])
        q_pe, k_pe = self.rotary_emb(positions, q_pe, k_pe)
        q = torch.cat((q_nope, q_pe.view(t, self.num_heads, self.rope)), dim=-1)
        o = self.attn(q, torch.cat((latent, k_pe), dim=-1), forward_batch)
        return self.o_proj(o)


class LongcatFlashRouter(nn.Module):
    """HF's LongcatFlashTopkRouter: classifier (float32) over real + zero experts, softmax scores,
    top-k on scores + e_score_correction_bias, weights times routed_scaling_factor."""

    def __init__(self, config: Any):
        super().__init__()
        n = config.n_routed_experts + (config.zero_expert_num or 0)
        self.classifier = DeepseekGate(n, config.hidden_size, has_bias=False)
        if getattr(config, "router_bias", False):
            # loaded, never added: HF's router multiplies by classifier.weight alone
            self.classifier.bias = nn.Parameter(torch.zeros(n), requires_grad=False)
        self.e_score_correction_bias = nn.Parameter(
            torch.zeros(n, dtype=torch.float32), requires_grad=False
        )
        self.routing = BiasedTopKRouting(
            config.moe_topk,
            "softmax",
            renormalize=False,
            scale=float(config.routed_scaling_factor),
        )

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [T, H] -> (weights float32 [T, k], expert ids [T, k]; ids >= n_routed_experts
        are zero experts)."""
        return self.routing.select(self.classifier(hidden), self.e_score_correction_bias)


class LongcatFlashMoE(nn.Module):
    """The shortcut MoE: real experts through the fused path, zero experts as the identity."""

    def __init__(self, config: Any, dispatch: LocalExperts):
        super().__init__()
        self.router = LongcatFlashRouter(config)
        self.experts = DeepseekExperts(
            config.n_routed_experts, config.hidden_size, config.expert_ffn_hidden_size
        )
        self.dispatch, self.top_k = dispatch, config.moe_topk
        # the start-up summary's active parameters: at most top_k real experts a token
        self.routing = self.router.routing

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weights, ids = self.router(hidden)
        weights, ids, identity = zero_experts_compute(
            hidden, weights, ids, self.experts.num_experts
        )
        # identity: this rank's own tokens, added after the experts' exchange (once, never summed
        # over expert-parallel ranks)
        return self.dispatch.run(hidden, weights, ids, self.experts) + identity

    def idle(self, dtype: torch.dtype) -> None:
        """DP attention, this rank without tokens: join the others' gather (forward_idle)."""
        self.dispatch.run_empty(self.experts.hidden_size, self.top_k, dtype, self.experts)


class LongcatFlashDecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, rotary_emb: nn.Module, dispatch: LocalExperts):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = nn.ModuleList(
            LongcatFlashMLA(config, 2 * layer_id + j, rotary_emb) for j in (0, 1)
        )
        self.mlps = nn.ModuleList(LlamaMLP(hidden, config.ffn_hidden_size) for _ in (0, 1))
        self.input_layernorm = nn.ModuleList(RMSNorm(hidden, eps=eps) for _ in (0, 1))
        self.post_attention_layernorm = nn.ModuleList(RMSNorm(hidden, eps=eps) for _ in (0, 1))
        self.mlp = LongcatFlashMoE(config, dispatch)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        forward_batch: ForwardBatch,
        residual: None,
    ) -> tuple[torch.Tensor, None]:
        h = hidden + self.self_attn[0](positions, self.input_layernorm[0](hidden), forward_batch)
        x = self.post_attention_layernorm[0](h)
        shortcut = self.mlp(x)
        h = h + self.mlps[0](x)
        h = h + self.self_attn[1](positions, self.input_layernorm[1](h), forward_batch)
        return h + self.mlps[1](self.post_attention_layernorm[1](h)) + shortcut, None


class LongcatFlashModel(DecoderStack):
    # The layers add their own residuals: the MoE's output joins the stream a sub-layer later.
    residual_stream = False

    def __init__(self, config: Any):
        super().__init__()
        # The stack loops over num_layers layers (num_hidden_layers counts the attention
        # sub-layers: the KV pool's).
        layers = SimpleNamespace(
            num_hidden_layers=config.num_layers, hidden_size=config.hidden_size
        )
        pp = self.init_stack(layers, fused=False)
        if pp.size > 1 or get_tp_group().world_size > 1:
            raise ValueError(
                f"{ARCH} runs with tp_size 1 and pp_size 1 for now (its KV layers are two per"
                " decoder layer)"
            )
        self.dispatch = expert_dispatch()  # one for every MoE layer (DP attention: per forward)
        self.embed_tokens = self.stage_embedding(config)
        self.rotary_emb = get_rope(config.qk_rope_head_dim, config)
        self.layers = self.stage_layers(
            config.num_layers,
            lambda i: LongcatFlashDecoderLayer(config, i, self.rotary_emb, self.dispatch),
        )
        self.norm = self.on_last(lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps))

    def forward_idle(self) -> None:
        forward_idle(self.dispatch, [layer.mlp for layer in self.layers], self.stream_dtype())


_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_EXPERT_ID = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.(\d+)\.")


class LongcatFlashForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek-V2's loader (experts per expert or stacked into DeepseekExperts, MLA's names)."""

    def build_model(self, config: Any) -> nn.Module:
        check_config(config)
        return LongcatFlashModel(config)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Skipped: the MTP module and layers past num_layers, and the zero experts' gate / up
        (HF's gate_up_proj spans every router slot, so save_pretrained writes rows that no
        computation reads)."""
        cfg = self.config
        real, total = cfg.n_routed_experts, cfg.n_routed_experts + (cfg.zero_expert_num or 0)

        def ours() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                m = _LAYER.match(name)
                if name.startswith("model.mtp.") or (m and int(m.group(1)) >= cfg.num_layers):
                    continue
                m = _EXPERT_ID.match(name)
                if m and real <= int(m.group(1)) < total and ".down_proj." not in name:
                    continue
                if name.endswith(".mlp.experts.gate_up_proj") and tensor.shape[0] == total:
                    tensor = tensor[:real]
                yield name, tensor

        super().load_weights(ours())
