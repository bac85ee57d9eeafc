"""The pure state-space models: Mamba2ForCausalLM (Mamba-2 mixers:
model/layers/linear_attn/mamba2.py), MambaForCausalLM and FalconMambaForCausalLM (Mamba-1 mixers:
linear_attn/mamba1.py). Every layer
is one block, x + mixer(norm(x)) (HF's MambaBlock / Mamba2Block: an RMSNorm named `norm`); the
decoder is `backbone.` in the checkpoints (embeddings, layers, norm_f).

No layer attends: the KV pool holds no layer (num_kv_layers 0), its token slots only index the radix
tree, whose nodes keep the mixers' state snapshots (the hybrid state pool, as Nemotron-H's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.linear_attn.mamba1 import Mamba1Dims, Mamba1Mixer
from radixlm.model.layers.linear_attn.mamba2 import MAMBA2_NAMES, Mamba2Dims, Mamba2Mixer
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.models.hybrid import HybridForCausalLM


def mamba2_dims(config: Any) -> Mamba2Dims:
    """HF Mamba2Config's names; what radixlm cannot run refused by field."""
    inner = int(config.expand * config.hidden_size)
    if inner != config.num_heads * config.head_dim:
        raise ValueError(
            f"Mamba-2 expand * hidden_size ({inner}) must equal num_heads * head_dim"
            f" ({config.num_heads * config.head_dim})"
        )
    return Mamba2Dims.from_config(config, MAMBA2_NAMES, "Mamba-2")


def mamba1_dims(config: Any, family: str, bcdt_rms: bool = False) -> Mamba1Dims:
    """HF MambaConfig's names (FalconMambaConfig's: bcdt_rms, with mixer_rms_eps)."""
    if config.hidden_act != "silu":  # the conv's activation
        raise ValueError(f"{family} hidden_act {config.hidden_act!r}: radixlm runs silu")
    return Mamba1Dims(
        hidden_size=config.hidden_size,
        intermediate=int(config.intermediate_size),
        state_size=config.state_size,
        conv_kernel=config.conv_kernel,
        dt_rank=int(config.time_step_rank),
        conv_bias=bool(config.use_conv_bias),
        proj_bias=bool(config.use_bias),
        bcdt_rms_eps=float(config.mixer_rms_eps) if bcdt_rms else None,
    )


class SSMBlock(nn.Module):
    """x + mixer(norm(x)); the residual stream rides along (fused add + norm)."""

    def __init__(self, config: Any, mixer: nn.Module):
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.mixer = mixer

    def state_layer(self) -> nn.Module:
        return self.mixer

    def forward(self, positions, hidden, fb: ForwardBatch, residual):
        if residual is None:
            residual, hidden = hidden, self.norm(hidden)
        else:
            hidden, residual = self.norm(hidden, residual)
        return self.mixer(hidden, fb), residual


class SSMModel(DecoderStack):
    """embeddings, one SSMBlock per layer (mixer(config, layer id): its state layer), norm_f."""

    def __init__(self, config: Any, mixer: Callable[[Any, int], nn.Module]):
        super().__init__()
        self.init_stack(config, fused=False)
        self.embeddings = self.stage_embedding(config)
        self.layers = self.stage_layers(
            config.num_hidden_layers, lambda i: SSMBlock(config, mixer(config, i))
        )
        self.num_kv_layers = 0
        self.norm_f = self.on_last(
            lambda: RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        )

    def embed(self, input_ids, input_embeds):
        return self.embeddings(input_ids) if input_embeds is None else input_embeds

    def final_norm(self, hidden, residual):
        return self.norm_f(hidden, residual)[0]


class SSMForCausalLM(HybridForCausalLM):
    """The loading of HybridForCausalLM, `backbone.` read as `model.`."""

    def mixer(self, config: Any, layer_id: int) -> nn.Module:
        raise NotImplementedError

    def build_hybrid_model(self, config: Any) -> nn.Module:
        return SSMModel(config, self.mixer)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        head = self.model.embeddings.as_lm_head if self.tie_word_embeddings else self.lm_head
        return head(hidden_states).float()

    def _map_name(self, name: str) -> tuple[str, int | None]:
        if name.startswith("backbone."):
            name = "model." + name.removeprefix("backbone.")
        return super()._map_name(name)


class Mamba2ForCausalLM(SSMForCausalLM):
    def mixer(self, config: Any, layer_id: int) -> nn.Module:
        return Mamba2Mixer(mamba2_dims(config), layer_id)


class MambaForCausalLM(SSMForCausalLM):
    def mixer(self, config: Any, layer_id: int) -> nn.Module:
        return Mamba1Mixer(mamba1_dims(config, "Mamba"), layer_id)


class FalconMambaForCausalLM(SSMForCausalLM):
    """Mamba-1 with dt's input, B and C RMS-normed (no weight) before the scan."""

    def mixer(self, config: Any, layer_id: int) -> nn.Module:
        return Mamba1Mixer(mamba1_dims(config, "FalconMamba", bcdt_rms=True), layer_id)
