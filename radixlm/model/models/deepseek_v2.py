"""DeepSeek-V2 / V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM): multi-head latent attention
and DeepSeek's MoE, module names as in the HF checkpoints (transformers 5.x is the reference).

Attention (MLA): q from q_proj, or through a LoRA (q_a_proj -> q_a_layernorm -> q_b_proj) when
q_lora_rank is set; kv_a_proj_with_mqa gives the latent (kv_lora_rank, then kv_a_layernorm) and
one decoupled RoPE key shared by all heads (qk_rope_head_dim). RoPE rotates the q_pe / k_pe
parts only, with DeepSeek's interleaved pairs (V2 always, V3 unless rope_interleave is false)
and YaRN's mscale folded into the softmax scale (mscale_all_dim). The latent and k_pe are what
the KV pool stores (cache/mla_pool.py); layers/attention/mla_attention.py does the rest.

MoE (deepseek_moe.py): dense MLPs for the first first_k_dense_replace layers, then routed experts
(softmax greedy / group_limited_greedy for V2, sigmoid + e_score_correction_bias with grouped
top-k for V3) plus shared experts. V3's multi-token-prediction layers (past num_hidden_layers)
are skipped at load, as SGLang does without speculative decoding.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from radixlm.distributed.parallel_state import get_tp_group
from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.attention.mla_attention import MLAAttention
from radixlm.model.layers.linear import Linear
from radixlm.model.layers.moe.expert_dispatch import LocalExperts, expert_dispatch, forward_idle
from radixlm.model.layers.moe.experts import ExpertWeights
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.parallel_linear import VocabParallelEmbedding
from radixlm.model.layers.rotary import get_rope, rope_parameters
from radixlm.model.models.deepseek_moe import (
    ALL_EXPERTS,
    DeepseekExperts,
    DeepseekMoE,
    is_moe_layer,
)
from radixlm.model.models.llama import LlamaForCausalLM, LlamaMLP
from radixlm.model.models.moe import MoeDecoderLayer
from radixlm.model.traits import ModelTraits


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def mla_softmax_scale(config: Any) -> float:
    """qk_head_dim ** -0.5, times mscale(factor, mscale_all_dim) squared under YaRN (DeepSeek's
    long-context models: the attention factor their cos/sin do not carry)."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    params = rope_parameters(config)
    if params["rope_type"] != "default" and params.get("mscale_all_dim"):
        scale *= yarn_mscale(params["factor"], params["mscale_all_dim"]) ** 2
    return scale


class DeepseekV2Attention(nn.Module):
    def __init__(self, config: Any, layer_id: int, rotary_emb: nn.Module, interleaved_rope: bool):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.nope, self.rope = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.kv_lora_rank, self.v_head_dim = config.kv_lora_rank, config.v_head_dim
        hidden, qk_head = config.hidden_size, self.nope + self.rope
        bias = bool(getattr(config, "attention_bias", False))
        self.q_lora_rank = getattr(config, "q_lora_rank", None)
        if self.q_lora_rank:
            self.q_a_proj = Linear(hidden, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(
                self.q_lora_rank
            )  # eps 1e-6 as DeepSeek's code (not rms_norm_eps)
            self.q_b_proj = Linear(self.q_lora_rank, self.num_heads * qk_head)
        else:
            self.q_proj = Linear(hidden, self.num_heads * qk_head)
        self.kv_a_proj_with_mqa = Linear(hidden, self.kv_lora_rank + self.rope, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank)
        self.kv_b_proj = Linear(self.kv_lora_rank, self.num_heads * (self.nope + self.v_head_dim))
        self.o_proj = Linear(self.num_heads * self.v_head_dim, hidden, bias=bias)
        self.rotary_emb, self.interleaved_rope = rotary_emb, interleaved_rope
        self.attn = self.build_attn(config, layer_id)

    def build_attn(self, config: Any, layer_id: int) -> MLAAttention:
        return MLAAttention(
            self.num_heads,
            self.nope,
            self.rope,
            self.v_head_dim,
            self.kv_lora_rank,
            mla_softmax_scale(config),
            layer_id,
            self._kv_b_weight,
        )

    def _kv_b_weight(self) -> torch.Tensor:
        if self.kv_b_proj.qweight is not None:  # a quantized kv_b_proj: its float copy, made once
            if getattr(self, "_kv_b_float", None) is None:
                self._kv_b_float = self.kv_b_proj.qweight.dequantize()
            return self._kv_b_float
        return self.kv_b_proj.weight

    def _deinterleave(self, x: torch.Tensor) -> torch.Tensor:
        """DeepSeek rotates pairs (x0, x1), (x2, x3), ...: as the halves rotate_half pairs, q and k
        alike (their dot products, all attention reads, are unchanged)."""
        if not self.interleaved_rope:
            return x.contiguous()
        shape = x.shape
        x = x.reshape(*shape[:-1], self.rope // 2, 2)
        return torch.cat((x[..., 0], x[..., 1]), dim=-1)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        t = hidden.shape[0]
        q = (
            self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
            if self.q_lora_rank
            else self.q_proj(hidden)
        )
        q = q.view(t, self.num_heads, self.nope + self.rope)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        kv_a = self.kv_a_proj_with_mqa(hidden)
        latent = self.kv_a_layernorm(kv_a[:, : self.kv_lora_rank].contiguous())
        q_pe = self._deinterleave(q_pe).reshape(t, self.num_heads * self.rope)
        k_pe = self._deinterleave(kv_a[:, self.kv_lora_rank :])
        q_pe, k_pe = self.rotary_emb(positions, q_pe, k_pe)
        q = torch.cat((q_nope, q_pe.view(t, self.num_heads, self.rope)), dim=-1)
        o = self.attn(q, torch.cat((latent, k_pe), dim=-1), forward_batch)
        return self.o_proj(o)


class DeepseekV2DecoderLayer(MoeDecoderLayer):
    """The Llama layer's forward (pre-norm, fused residual) over MLA attention and DeepSeek's
    MLP."""

    def __init__(
        self,
        config: Any,
        layer_id: int,
        rotary_emb: nn.Module,
        v3: bool,
        dispatch: LocalExperts,
        attn_cls: type[DeepseekV2Attention] = DeepseekV2Attention,
    ):
        interleaved = bool(getattr(config, "rope_interleave", True)) if v3 else True
        attn = attn_cls(config, layer_id, rotary_emb, interleaved)
        if is_moe_layer(config, layer_id):
            shared = (
                LlamaMLP(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts)
                if getattr(config, "n_shared_experts", None)
                else None
            )
            mlp = DeepseekMoE(config, v3, shared, dispatch)
        else:
            mlp = LlamaMLP(config.hidden_size, config.intermediate_size)
        super().__init__(config, attn, mlp)


class DeepseekV2Model(DecoderStack):
    attn_cls = DeepseekV2Attention  # V3.2: its sparse attention (deepseek_v32.py)

    def __init__(self, config: Any, v3: bool):
        super().__init__()
        self.init_stack(config, fused=False)
        if get_tp_group().world_size > 1:
            raise ValueError(
                "DeepSeek-V2/V3 run with tp_size 1 for now (or over several ranks with"
                " --enable-dp-attention --dp-size N --tp-size N, and --ep-size N to split the"
                " experts; or in pipeline stages, --pp-size N)"
            )
        self.dispatch = expert_dispatch()  # one for every MoE layer (DP attention: per forward)
        self.embed_tokens = self.on_first(
            lambda: VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        )
        self.rotary_emb = get_rope(config.qk_rope_head_dim, config)
        self.layers = self.stage_layers(
            config.num_hidden_layers,
            lambda i: DeepseekV2DecoderLayer(
                config, i, self.rotary_emb, v3, self.dispatch, self.attn_cls
            ),
        )
        self.norm = self.on_last(lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps))

    def forward_idle(self) -> None:
        forward_idle(self.dispatch, [layer.mlp for layer in self.layers], self.stream_dtype())


_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_STACKED_EXPERTS = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_EXPERT_PROJ = re.compile(r"^(.*\.mlp\.experts)\.(gate_proj|up_proj|down_proj)\.weight$")
_SPLIT_KV_B = re.compile(r"^(.*\.self_attn)\.(k_b_proj|v_b_proj)\.weight$")


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    v3 = False
    # Only the MLPs' gate/up are fused (MLA's projections keep their checkpoint names).
    stacked_params_mapping = [("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)]

    def build_model(self, config: Any) -> nn.Module:
        return DeepseekV2Model(config, self.v3)

    def forward_idle(self) -> None:
        """DP attention: this rank has no batch while another has (expert_dispatch.forward_idle)."""
        self.model.forward_idle()

    def traits(self) -> ModelTraits:
        return dataclasses.replace(super().traits(), supports_forward_idle=True)

    def _map_name(self, name: str) -> tuple[str, int | None]:
        m = _EXPERT.match(name)
        if m:
            e = int(m.group(2))
            kind = m.group(3)
            return (
                (f"{m.group(1)}.w2", e)
                if kind == "down_proj"
                else (f"{m.group(1)}.w13", 2 * e + (kind == "up_proj"))
            )
        m = _STACKED_EXPERTS.match(name)
        if m:
            return f"{m.group(1)}.{'w13' if m.group(2) == 'gate_up_proj' else 'w2'}", ALL_EXPERTS
        return super()._map_name(name)

    def _num_shards(self, param_name: str) -> int:
        if isinstance(self.get_submodule(param_name.rpartition(".")[0]), DeepseekExperts):
            return 0  # counted by load_weights itself
        return super()._num_shards(param_name)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The Llama loader (its checks, quantized tensors) for everything but the routed experts,
        whose tensors go into their stacked parameters here. Also read: GGUF's 3-D expert tensors
        and kv_b_proj split per head (gguf/archs/deepseek.py). V3's multi-token-prediction layers
        (past num_hidden_layers) are skipped."""
        n = self.config.num_hidden_layers
        filled: dict[str, set] = {}
        split_kv_b: dict[str, dict[str, torch.Tensor]] = {}  # GGUF's attn_k_b / attn_v_b, per layer
        whole_kv_b: set[str] = set()

        def load_expert(name: str, tensor: torch.Tensor) -> None:
            target, shard = self._map_name(name)
            owner, _, kind = target.rpartition(".")
            module = self.get_submodule(owner)
            filled.setdefault(target, set()).update(
                module.load_shard(getattr(module, kind), _dequantized(tensor), shard)
            )

        def others() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                m = _LAYER.match(name)
                if m and int(m.group(1)) >= n:
                    continue
                name = name.replace(
                    ".mlp.gate.e_score_correction.bias", ".mlp.gate.e_score_correction_bias"
                )
                m = _SPLIT_KV_B.match(name)
                if m:
                    split_kv_b.setdefault(m.group(1), {})[m.group(2)] = _dequantized(tensor)
                    continue
                if name.endswith(".self_attn.kv_b_proj.weight"):
                    whole_kv_b.add(name[: -len(".kv_b_proj.weight")])
                m = _EXPERT_PROJ.match(name)
                if m and isinstance(
                    tensor, ExpertWeights
                ):  # GGUF's 3-D blocks (gguf/archs/moe.py); kept float here
                    tensor = tensor.dequantize()
                if (
                    m and tensor.dim() == 3
                ):  # GGUF: one projection of every expert, [experts, rows, cols]
                    for e, w in enumerate(_dequantized(tensor)):
                        load_expert(f"{m.group(1)}.{e}.{m.group(2)}.weight", w)
                elif _EXPERT.match(name) or _STACKED_EXPERTS.match(name):
                    load_expert(name, tensor)
                else:
                    yield name, tensor
            for (
                attn,
                parts,
            ) in split_kv_b.items():  # kv_b_proj from its per-head split, unless given whole
                if attn not in whole_kv_b:
                    yield (
                        f"{attn}.kv_b_proj.weight",
                        _join_kv_b(parts["k_b_proj"], parts["v_b_proj"]),
                    )

        super().load_weights(others())
        missing = [
            t
            for t, _ in self.named_parameters()
            if t.endswith((".experts.w13", ".experts.w2"))
            and len(filled.get(t, ()))
            < self.get_submodule(t.rpartition(".")[0]).num_shards(t.rpartition(".")[2])
        ]
        if missing:
            raise ValueError(
                f"weights do not match {type(self).__name__}: missing experts of {missing[:8]}"
            )


def _dequantized(t) -> torch.Tensor:
    return t.dequantize() if hasattr(t, "dequantize") else t


def _join_kv_b(k_b: torch.Tensor, v_b: torch.Tensor) -> torch.Tensor:
    """kv_b_proj.weight [heads * (qk_nope + v_head_dim), kv_lora_rank] from llama.cpp's split:
    k_b [heads, kv_lora_rank, qk_nope] (transposed per head) and v_b [heads, v_head_dim,
    kv_lora_rank].
    """
    rank = v_b.shape[2]
    return torch.cat((k_b.transpose(1, 2), v_b), dim=1).reshape(-1, rank).contiguous()


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    v3 = True
