"""Zamba2 (HF Zamba2ForCausalLM: Zyphra's Zamba2 1.2B / 2.7B / 7B): a stack of Mamba-2 layers
(model/layers/linear_attn/mamba2.py) in which the `hybrid` layers (config.layers_block_type) first
run a *shared* transformer block and add its projected output to their Mamba layer's input.

A Mamba layer: x + mixer(norm(x + t)), where t is 0, or at a hybrid layer
linear(block(x, e)): the block's input is concat(x, e), e the token embeddings (2 x hidden), then
RMSNorm(2 x hidden), attention (head_dim = 2 * hidden / heads, scaled by (head_dim / 2) ** -0.5,
RoPE over the whole head where use_mem_rope), RMSNorm, a gated MLP (gelu by default); the block adds
no residual of its own, and t does not enter the residual stream. There are num_mem_blocks blocks,
the hybrid layers taking them in rotation (invocation n runs block n % num_mem_blocks); each
invocation has its own LoRA adapters (HF's adapter lists, indexed by the invocation: always on the
MLP's gate_up, on q, k and v where use_shared_attention_adapter) and its own KV: the KV pool has
one layer per hybrid layer (numbered in order), the state pool one per layer.

The mixer is HF's Zamba2MambaMixer: the conv always has a bias (use_conv_bias is not read), in /
out projections biased by add_bias_linear, the gated norm's eps 1e-5 (not rms_norm_eps), dt
clamped below at time_step_min only.

Which weights the invocations share is transformers' weight tying, which (5.x) ties only where
tie_word_embeddings is set: then the blocks are shared (`model.shared_blocks.{b}`, b = n %
num_mem_blocks), and checkpoints store each once, under the first hybrid layer that runs it
(`model.layers.{L}.shared_transformer.*`; a file with every copy loads alike). Without it HF ties
nothing: every hybrid layer runs its own copy of the block (shared_blocks.{n}, from its own
`layers.{L}.shared_transformer.*`), as radixlm does too; the adapters it holds for the other
invocations of its slot are never run, and not loaded.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from radixlm.distributed.parallel_state import get_tp_group
from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.activation import GeluAndMul, SiluAndMul
from radixlm.model.layers.attention import RadixAttention
from radixlm.model.layers.linear import Linear
from radixlm.model.layers.linear_attn.mamba2 import Mamba2Dims, Mamba2Mixer
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.parallel_linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from radixlm.model.layers.rotary import RotaryEmbedding, get_rope
from radixlm.model.models.hybrid import HybridForCausalLM, hybrid_layer_types
from radixlm.model.pp_stage import PPMissingLayer

LAYER_TYPES = ("linear_attention", "hybrid")
# HF's ACT2FN names of the shared MLP's activation (Zyphra's configs: gelu).
_ACTIVATIONS = {
    "gelu": lambda: GeluAndMul("none"),
    "gelu_pytorch_tanh": lambda: GeluAndMul("tanh"),
    "silu": SiluAndMul,
}
# A shared block's tensor under a hybrid layer; an adapter's, of invocation i, inside it.
_SHARED = re.compile(r"^model\.layers\.(\d+)\.shared_transformer\.(.+)$")
_ADAPTER = re.compile(
    r"^(?:self_attn\.linear_([qkv])_adapter_list|feed_forward\.gate_up_proj_adapter_list)"
    r"\.(\d+)\.(.+)$"
)
# Fused in the checkpoint as in the model ([gate | up]): loaded whole, not per shard.
_WHOLE = (
    "feed_forward.gate_up_proj.weight",
    "feed_forward.gate_up_proj.bias",
    "gate_up_adapter.1.weight",
)


def check_config(config: Any) -> None:
    """Refuse, by name, what HF's Zamba2 would not run or radixlm does not."""
    if config.hidden_act not in _ACTIVATIONS:
        raise ValueError(
            f"Zamba2 hidden_act {config.hidden_act!r}: radixlm runs {', '.join(_ACTIVATIONS)}"
        )
    if config.num_mem_blocks < 1:
        raise ValueError(f"Zamba2 num_mem_blocks {config.num_mem_blocks}: at least 1")
    if config.use_shared_attention_adapter and (
        config.num_key_value_heads != config.num_attention_heads
    ):  # the k / v adapters write 2 x hidden columns: HF's sum fails with fewer KV heads
        raise ValueError(
            f"Zamba2 use_shared_attention_adapter with num_key_value_heads"
            f" {config.num_key_value_heads} != num_attention_heads {config.num_attention_heads}"
        )
    intermediate = int(config.mamba_expand * config.hidden_size)
    if intermediate % config.n_mamba_heads:
        raise ValueError(
            f"Zamba2 mamba_expand * hidden_size {intermediate} is not a multiple of n_mamba_heads"
            f" {config.n_mamba_heads}"
        )
    if config.n_mamba_heads % config.mamba_ngroups:
        raise ValueError(
            f"Zamba2 n_mamba_heads {config.n_mamba_heads} is not a multiple of mamba_ngroups"
            f" {config.mamba_ngroups}"
        )


def zamba2_mamba_dims(config: Any) -> Mamba2Dims:
    intermediate = int(config.mamba_expand * config.hidden_size)
    return Mamba2Dims(
        hidden_size=config.hidden_size,
        num_heads=config.n_mamba_heads,
        head_dim=intermediate // config.n_mamba_heads,
        n_groups=config.mamba_ngroups,
        state_size=config.mamba_d_state,
        conv_kernel=config.mamba_d_conv,
        conv_bias=True,  # HF builds the conv with a bias whatever use_conv_bias says
        proj_bias=bool(config.add_bias_linear),
        eps=1e-5,  # Zamba2RMSNormGated's, fixed
        dt_limit=(float(config.time_step_min), float("inf")),
    )


class Zamba2Adapter(nn.Sequential):
    """HF's adapter nn.Sequential(Linear(in, rank), Linear(rank, out)), without bias: the first
    replicated, the second split as the projection it adds to (`up`)."""

    def __init__(self, in_features: int, rank: int, up: nn.Module):
        super().__init__(Linear(in_features, rank), up)


class Zamba2SharedAttention(nn.Module):
    """q / k / v / o of a shared block; the KV (RadixAttention) and the adapters are the
    invocation's own."""

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding | None):
        super().__init__()
        self.head_dim = head_dim = config.attention_head_dim
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.qkv_proj = QKVParallelLinear(2 * config.hidden_size, head_dim, heads, kv_heads)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        self.o_proj = RowParallelLinear(
            heads * head_dim, config.hidden_size, what="num_attention_heads * head_dim"
        )
        self.scaling = (head_dim / 2) ** -0.5  # the doubled input's: sqrt(head_dim / 2)
        self.rotary_emb = rotary_emb

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        fb: ForwardBatch,
        attn: RadixAttention,
        adapters: nn.ModuleList | None,
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if adapters is not None:
            q, k, v = q + adapters[0](x), k + adapters[1](x), v + adapters[2](x)
        if self.rotary_emb is not None:
            q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(attn(q.contiguous(), k.contiguous(), v.contiguous(), fb))


class Zamba2SharedMLP(nn.Module):
    """down(act(gate) * up) over gate_up(x) + the invocation's adapter(x)."""

    def __init__(self, config: Any):
        super().__init__()
        bias, size = bool(config.add_bias_linear), config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [size] * 2, bias=bias)
        self.down_proj = RowParallelLinear(
            size, config.hidden_size, bias=bias, what="intermediate_size"
        )
        self.act_fn = _ACTIVATIONS[config.hidden_act]()

    def forward(self, x: torch.Tensor, adapter: nn.Module) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x) + adapter(x)))


class Zamba2SharedBlock(nn.Module):
    """The weights the hybrid layers running this block share (HF's
    Zamba2AttentionDecoderLayer, under its names)."""

    def __init__(self, config: Any, rotary_emb: RotaryEmbedding | None):
        super().__init__()
        self.input_layernorm = RMSNorm(2 * config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = Zamba2SharedAttention(config, rotary_emb)
        self.pre_ff_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.feed_forward = Zamba2SharedMLP(config)


class Zamba2MambaLayer(nn.Module):
    """x + mixer(norm(x + t)) (t: a hybrid layer's transformer output, else nothing)."""

    def __init__(self, config: Any, layer_id: int):
        super().__init__()
        self.mamba = Mamba2Mixer(zamba2_mamba_dims(config), layer_id)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def state_layer(self) -> Mamba2Mixer:
        return self.mamba

    def forward(self, positions, hidden, fb: ForwardBatch, residual, injected=None):
        x = hidden if injected is None else hidden + injected
        return hidden + self.mamba(self.input_layernorm(x), fb), None


class Zamba2HybridLayer(nn.Module):
    """A hybrid layer: its invocation of a shared block (with its own KV layer and adapters), the
    projection `linear`, then its Mamba layer (`mamba_decoder`)."""

    def __init__(self, config: Any, layer_id: int, invocation: int, block: Zamba2SharedBlock):
        super().__init__()
        self.mamba_decoder = Zamba2MambaLayer(config, layer_id)
        self.linear = Linear(config.hidden_size, config.hidden_size)  # replicated, as in vLLM
        # Not a submodule: the block's parameters are model.shared_blocks.{b}'s alone.
        self._block = (block,)
        a = block.self_attn
        # This invocation's own KV: KV layer `invocation` (the hybrid layers numbered in order).
        self.attn = RadixAttention(a.num_heads, a.head_dim, a.scaling, a.num_kv_heads, invocation)
        rank, h2 = config.adapter_rank, 2 * config.hidden_size
        self.qkv_adapters = None
        if config.use_shared_attention_adapter:  # q, k, v: 2 x hidden columns each
            self.qkv_adapters = nn.ModuleList(
                Zamba2Adapter(h2, rank, ColumnParallelLinear(rank, h2)) for _ in range(3)
            )
        size = config.intermediate_size
        self.gate_up_adapter = Zamba2Adapter(
            config.hidden_size, rank, MergedColumnParallelLinear(rank, [size] * 2)
        )

    def state_layer(self) -> Mamba2Mixer:
        return self.mamba_decoder.mamba

    def forward(self, positions, hidden, fb: ForwardBatch, residual, embeddings):
        block = self._block[0]
        x = block.input_layernorm(torch.cat([hidden, embeddings], dim=-1))
        t = block.self_attn(positions, x, fb, self.attn, self.qkv_adapters)
        t = block.feed_forward(block.pre_ff_layernorm(t), self.gate_up_adapter)
        return self.mamba_decoder(positions, hidden, fb, None, self.linear(t))


class Zamba2Model(DecoderStack):
    residual_stream = False  # a hybrid layer reads the whole stream (its block's input)

    def __init__(self, config: Any):
        super().__init__()
        pp = self.init_stack(config, fused=False)
        check_config(config)
        if get_tp_group().world_size > 1:  # Mamba2Mixer's in_proj parts would split unevenly
            raise ValueError("Zamba2 runs with tp_size 1: its Mamba-2 mixers are not split")
        self.layer_types = hybrid_layer_types(config, LAYER_TYPES)
        self.hybrid_layers = [i for i, t in enumerate(self.layer_types) if t == "hybrid"]
        self.num_kv_layers = len(self.hybrid_layers)
        # Invocation n (the n-th hybrid layer) runs block n % num_mem_blocks where HF ties them
        # (tie_word_embeddings), else its own copy: block n (module docstring).
        tied = bool(config.tie_word_embeddings)
        self.slots = config.num_mem_blocks
        blocks = self.slots if tied else len(self.hybrid_layers)
        used = {n % blocks for n, i in enumerate(self.hybrid_layers) if i in pp.layers}
        # Every stage running a hybrid layer embeds the tokens itself (the blocks' input).
        self.needs_embeddings = bool(used)
        self.embed_tokens = (
            VocabParallelEmbedding(config.vocab_size, config.hidden_size)
            if pp.is_first or (tied and pp.is_last) or used
            else PPMissingLayer()
        )
        rotary = get_rope(config.attention_head_dim, config) if config.use_mem_rope else None
        self.rotary_emb = rotary
        self.shared_blocks = nn.ModuleList(
            Zamba2SharedBlock(config, rotary) if b in used else PPMissingLayer()
            for b in range(blocks)
        )
        invocation = {i: n for n, i in enumerate(self.hybrid_layers)}

        def build(i: int) -> nn.Module:
            if i not in invocation:
                return Zamba2MambaLayer(config, i)
            n = invocation[i]
            return Zamba2HybridLayer(config, i, n, self.shared_blocks[n % blocks])

        self.layers = self.stage_layers(config.num_hidden_layers, build)
        self.final_layernorm = self.on_last(
            lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        )
        self._embeddings: torch.Tensor | None = None

    def embed(self, input_ids, input_embeds):
        self._embeddings = super().embed(input_ids, input_embeds)
        return self._embeddings

    def prepare(self, input_ids, positions, fb):
        if not self.pp.is_first and self.needs_embeddings:
            self._embeddings = self.embed_tokens(input_ids)
        return super().prepare(input_ids, positions, fb)

    def run_layer(self, i, positions, hidden, fb, residual):
        layer = self.layers[i]
        if isinstance(layer, Zamba2HybridLayer):
            return layer(positions, hidden, fb, residual, self._embeddings)
        return layer(positions, hidden, fb, residual)

    def final_norm(self, hidden, residual):
        return self.final_layernorm(hidden)

    def checkpoint_name(self, layer: int, rest: str) -> str | None:
        """Our name of `model.layers.{layer}.shared_transformer.{rest}`: "" for a tensor HF holds
        but never runs (an untied copy's adapter of another invocation), None for none of HF's."""
        if layer not in self.hybrid_layers:
            return None
        n, blocks = self.hybrid_layers.index(layer), len(self.shared_blocks)
        m = _ADAPTER.match(rest)
        if m is None:
            return f"model.shared_blocks.{n % blocks}.{rest}"
        which, i, tail = m.group(1), int(m.group(2)), m.group(3)
        if i >= len(self.hybrid_layers) or i % self.slots != n % self.slots:
            return None  # a slot HF leaves empty (nn.Identity)
        if blocks != self.slots and i != n:
            return ""  # untied: invocation i runs its own copy's adapter
        adapter = "gate_up_adapter" if which is None else f"qkv_adapters.{'qkv'.index(which)}"
        return f"model.layers.{self.hybrid_layers[i]}.{adapter}.{tail}"


class Zamba2ForCausalLM(HybridForCausalLM):
    stacked_params_mapping = [
        ("qkv_proj", "q_proj", 0),
        ("qkv_proj", "k_proj", 1),
        ("qkv_proj", "v_proj", 2),
    ]

    def build_hybrid_model(self, config: Any) -> nn.Module:
        return Zamba2Model(config)

    def _map_name(self, name: str) -> tuple[str, int | None]:
        m = _SHARED.match(name)
        if m is not None:
            name = self.model.checkpoint_name(int(m.group(1)), m.group(2)) or name
        return super()._map_name(name)

    def load_weights(self, weights) -> None:
        super().load_weights((n, t) for n, t in weights if not self._never_run(n))

    def _never_run(self, name: str) -> bool:
        m = _SHARED.match(name)
        return m is not None and self.model.checkpoint_name(int(m.group(1)), m.group(2)) == ""

    def _num_shards(self, param_name: str) -> int:
        if param_name.endswith(_WHOLE):
            return 1
        return super()._num_shards(param_name)
