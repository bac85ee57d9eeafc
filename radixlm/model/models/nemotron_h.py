"""Nemotron-H (HF NemotronHForCausalLM): a hybrid decoder whose every layer is ONE block, chosen by
the config's pattern (hybrid_override_pattern, layer_types in transformers 5.x): M a Mamba-2 mixer
(model/layers/linear_attn/mamba2.py, a recurrent state per request), * attention (GQA without any
position encoding: Nemotron-H's attention has no RoPE), - an MLP (up, relu2, down), E a MoE block
(Nemotron-3: routed experts without a gate and a shared expert, nemotron_h_moe.py). Each block is
its own pre-norm and residual: x + mixer(norm(x)); the final norm is norm_f.

Only the attention layers keep KV (numbered among themselves for the KV pool, `num_kv_layers`);
the Mamba layers are numbered among themselves for the state pool (`state_specs`). Checkpoints name
the decoder `backbone.` (NVIDIA's, and what transformers writes); the multi-token-prediction head
(mtp.) is skipped here: it loads as a draft head (nemotron_h_mtp.py, speculative/mtp_checkpoint.py).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.attention import RadixAttention
from radixlm.model.layers.linear_attn.mamba2 import NEMOTRON_H_NAMES, Mamba2Dims, Mamba2Mixer
from radixlm.model.layers.moe.expert_dispatch import expert_dispatch, forward_idle
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.parallel_linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from radixlm.model.models.hybrid import HybridForCausalLM, build_layers, hybrid_layer_types
from radixlm.model.models.llama import get_head_dim
from radixlm.model.models.nemotron_h_moe import PROJS, NemotronHExperts, NemotronHMoE
from radixlm.model.traits import ModelTraits

LAYER_TYPES = ("linear_attention", "full_attention", "mlp", "moe")
# A routed expert's tensor: NVIDIA's, per expert (group 2), or transformers 5's / a GGUF's stacked.
_EXPERT = re.compile(r"^(.*\.mixer\.experts)\.(?:(\d+)\.)?(up_proj|down_proj)(?:\.weight)?$")

# HF's ACT2FN names of the MLP activations Nemotron-H checkpoints use.
_ACTIVATIONS = {
    "relu2": lambda x: F.relu(x).square(),
    "silu": F.silu,
    "gelu": F.gelu,
    "relu": F.relu,
}


def nemotron_h_mamba_dims(config: Any) -> Mamba2Dims:
    return Mamba2Dims.from_config(config, NEMOTRON_H_NAMES, "Nemotron-H")


class NemotronHAttention(nn.Module):
    """q/k/v/o without bias (HF builds them so whatever attention_bias says), no RoPE."""

    def __init__(self, config: Any, kv_layer_id: int):
        super().__init__()
        self.head_dim = head_dim = get_head_dim(config)
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.qkv_proj = QKVParallelLinear(config.hidden_size, head_dim, heads, kv_heads)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        self.o_proj = RowParallelLinear(
            heads * head_dim, config.hidden_size, what="num_attention_heads * head_dim"
        )
        self.attn = RadixAttention(
            self.num_heads, head_dim, head_dim**-0.5, self.num_kv_heads, kv_layer_id
        )

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return self.o_proj(self.attn(q.contiguous(), k.contiguous(), v.contiguous(), fb))


def mlp_activation(config: Any):
    act = getattr(config, "mlp_hidden_act", "relu2")
    if act not in _ACTIVATIONS:
        raise ValueError(f"mlp_hidden_act {act!r}: radixlm runs {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[act]


class NemotronHMLP(nn.Module):
    def __init__(self, config: Any, intermediate_size: int | None = None):
        """intermediate_size: the MoE block's shared expert's (else the MLP blocks')."""
        super().__init__()
        self.act_fn = mlp_activation(config)
        bias = bool(getattr(config, "mlp_bias", False))
        size = intermediate_size or config.intermediate_size
        self.up_proj = ColumnParallelLinear(config.hidden_size, size, bias=bias)
        self.down_proj = RowParallelLinear(size, config.hidden_size, bias=bias)

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.up_proj(hidden)))


class NemotronHBlock(nn.Module):
    def __init__(self, config: Any, block_type: str, index: int, dispatch=None):
        """index: the block's number among the blocks of its type (its KV or state layer);
        dispatch: the model's expert dispatch (MoE blocks)."""
        super().__init__()
        self.block_type = block_type
        self.norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        if block_type == "linear_attention":
            self.mixer = Mamba2Mixer(nemotron_h_mamba_dims(config), index)
        elif block_type == "full_attention":
            self.mixer = NemotronHAttention(config, index)
        elif block_type == "moe":
            shared = NemotronHMLP(config, config.moe_shared_expert_intermediate_size)
            self.mixer = NemotronHMoE(config, shared, mlp_activation(config), dispatch)
        else:
            self.mixer = NemotronHMLP(config)

    def state_layer(self) -> Mamba2Mixer | None:
        return self.mixer if self.block_type == "linear_attention" else None

    def forward(self, positions, hidden, fb: ForwardBatch, residual):
        # The residual stream rides along (fused add + norm): x + mixer(norm(x)) per block.
        if residual is None:
            residual, hidden = hidden, self.norm(hidden)
        else:
            hidden, residual = self.norm(hidden, residual)
        return self.mixer(hidden, fb), residual


class NemotronHModel(DecoderStack):
    def __init__(self, config: Any):
        super().__init__()
        self.init_stack(config, fused=False)
        self.layer_types = hybrid_layer_types(config, LAYER_TYPES)
        if "moe" in self.layer_types:
            self.dispatch = expert_dispatch()  # one for every MoE block (DP attention: per forward)
        self.embeddings = self.stage_embedding(config)
        self.layers, self.num_kv_layers = build_layers(
            self.layer_types,
            lambda i, t, n: NemotronHBlock(config, t, n, self.dispatch),
            self.pp.layers,
        )
        self.norm_f = self.on_last(
            lambda: RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        )

    @property
    def embed_tokens(self) -> nn.Module:
        """The name draft heads read the target's embedding by (speculative/eagle.py)."""
        return self.embeddings

    def embed(self, input_ids, input_embeds):
        return self.embeddings(input_ids) if input_embeds is None else input_embeds

    def final_norm(self, hidden, residual):
        return self.norm_f(hidden, residual)[0]


class NemotronHForCausalLM(HybridForCausalLM):
    stacked_params_mapping = [
        ("qkv_proj", "q_proj", 0),
        ("qkv_proj", "k_proj", 1),
        ("qkv_proj", "v_proj", 2),
    ]
    SKIPPED_PREFIXES = ("mtp.",)

    def build_hybrid_model(self, config: Any) -> nn.Module:
        return NemotronHModel(config)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        head = self.model.embeddings.as_lm_head if self.tie_word_embeddings else self.lm_head
        return head(hidden_states).float()

    def traits(self) -> ModelTraits:
        return dataclasses.replace(super().traits(), supports_forward_idle=True)

    def forward_idle(self) -> None:
        """DP attention: this rank has no batch while another has (expert_dispatch.forward_idle)."""
        if self.model.dispatch is not None:
            mixers = [getattr(layer, "mixer", None) for layer in self.model.layers]
            forward_idle(self.model.dispatch, mixers, self.model.stream_dtype())

    def _map_name(self, name: str) -> tuple[str, int | None]:
        if name.startswith("backbone."):  # NVIDIA's checkpoints, and transformers' save_pretrained
            name = "model." + name.removeprefix("backbone.")
        return super()._map_name(name)

    def _num_shards(self, param_name: str) -> int:
        if isinstance(self.get_submodule(param_name.rpartition(".")[0]), NemotronHExperts):
            return 0  # counted by the experts themselves (load_weights)
        return super()._num_shards(param_name)

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """The hybrid loader for everything but the routed experts, which fill their stacked
        parameters here (one expert's matrix, or all of them stacked)."""

        def others():
            for name, tensor in weights:
                m = _EXPERT.match(self._map_name(name)[0])
                module = self._owner_of(m.group(1) + ".x")[0] if m else None
                if not isinstance(module, NemotronHExperts) or m.group(3) not in PROJS:
                    yield name, tensor  # mtp.*, another stage's layer: the hybrid loader's
                    continue
                module.load(m.group(3), None if m.group(2) is None else int(m.group(2)), tensor)

        super().load_weights(others())
        missing = [
            f"{n}: {x}"
            for n, m in self.named_modules()
            if isinstance(m, NemotronHExperts)
            for x in m.missing()[:1]
        ]
        if missing:
            raise ValueError(f"weights do not match {type(self).__name__}: missing {missing[:8]}")
