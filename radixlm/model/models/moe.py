"""The decoder stack of the mixture-of-experts families (moe_families.py): the Llama graph with a
SparseMoeBlock (layers/moe/moe_block.py) in place of the MLP, in every layer or where the config
says (Qwen's `mlp_only_layers`, `decoder_sparse_step`: the other layers keep a dense MLP).

Checkpoint names accepted for the experts (all normalized to `model.layers.L.mlp.experts...`):
  per expert        mlp.experts.E.{gate,up,down}_proj.weight   (what transformers' save_pretrained writes)
                    block_sparse_moe.experts.E.{w1,w3,w2}.weight (Mixtral's original layout)
  stacked (3-D)     mlp.experts.{gate_up_proj,down_proj}        (transformers 5.x's in-memory layout)
                    mlp.experts.{gate,up,down}_proj.weight       (a GGUF's ffn_{gate,up,down}_exps)
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.layers.moe.expert_dispatch import LocalExperts, expert_dispatch, forward_idle
from radixlm.model.layers.moe.moe_block import MoeSpec, SparseMoeBlock
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.rotary import RotaryEmbedding, get_rope
from radixlm.model.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    get_head_dim,
)
from radixlm.model.tp_shard import TensorSlice
from radixlm.model.traits import ModelTraits

_EXPERT_RE = re.compile(
    r"^model\.layers\.(\d+)\.mlp\.experts\.(?:(\d+)\.)?(gate_up|gate|up|down)_proj(?:\.weight)?$"
)
_MIXTRAL_NAMES = (
    (".block_sparse_moe.", ".mlp."),
    (".w1.", ".gate_proj."),
    (".w3.", ".up_proj."),
    (".w2.", ".down_proj."),
)


class MoeDecoderLayer(LlamaDecoderLayer):
    """LlamaDecoderLayer's forward over the family's attention and MLP (sparse or dense)."""

    def __init__(self, config: Any, attn: nn.Module, mlp: nn.Module):
        nn.Module.__init__(self)
        self.self_attn = attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class MoeModel(DecoderStack):
    """The Llama graph (pre-norms, fused add + norm) over the family's layers."""

    def __init__(self, config: Any, family: MoeForCausalLM):
        super().__init__()
        # the one-op fused decoder has no MoE block
        self.init_stack(config, fused=False)
        self.dispatch = family.expert_dispatch
        self.embed_tokens = self.stage_embedding(config)
        self.rotary_emb = rotary_emb = get_rope(get_head_dim(config), config)
        self.layers = self.stage_layers(
            config.num_hidden_layers, lambda i: family.build_layer(config, i, rotary_emb)
        )
        self.norm = self.on_last(lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps))

    def forward_idle(self) -> None:
        forward_idle(
            self.dispatch,
            [getattr(layer, "mlp", None) for layer in self.layers],
            self.stream_dtype(),
        )


class MoeForCausalLM(LlamaForCausalLM):
    """A family sets its routing (moe_spec), its attention and its shared expert."""

    attention_cls: type[LlamaAttention] = LlamaAttention
    expert_dispatch: LocalExperts

    def build_model(self, config: Any) -> nn.Module:
        self.expert_dispatch = (
            expert_dispatch()
        )  # one for every MoE layer (DP attention: per-forward counts)
        return MoeModel(config, self)

    def forward_idle(self) -> None:
        """DP attention: this rank has no batch while another has (expert_dispatch.forward_idle)."""
        self.model.forward_idle()

    def traits(self) -> ModelTraits:
        return dataclasses.replace(super().traits(), supports_forward_idle=True)

    # -- what a family says -------------------------------------------------------------------
    def moe_spec(self, config: Any) -> MoeSpec:
        raise NotImplementedError

    def shared_expert(self, config: Any) -> nn.Module | None:
        return None

    def is_sparse(self, config: Any, layer_id: int) -> bool:
        """HF's rule (Qwen2/3-MoE): not in mlp_only_layers and (layer + 1) % decoder_sparse_step ==
        0."""
        step = getattr(config, "decoder_sparse_step", 1) or 1
        return (
            layer_id not in (getattr(config, "mlp_only_layers", None) or [])
            and (layer_id + 1) % step == 0
        )

    def build_layer(self, config: Any, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
        attn = self.attention_cls(config, layer_id, rotary_emb, self.qkv_bias, self.qk_norm)
        if self.is_sparse(config, layer_id):
            mlp: nn.Module = SparseMoeBlock(
                config.hidden_size,
                self.moe_spec(config),
                layer_id,
                shared_expert=self.shared_expert(config),
                dispatch=self.expert_dispatch,
            )
        else:
            mlp = LlamaMLP(config.hidden_size, config.intermediate_size)
        return MoeDecoderLayer(config, attn, mlp)

    # -- loading ------------------------------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        def rest():
            for name, tensor in weights:
                hit = self._expert_target(name)
                if hit is None:
                    yield name, tensor
                else:
                    block, proj, expert = hit
                    block.load_expert(proj, expert, tensor)

        super().load_weights(rest())
        missing = [m for b in self._blocks() for m in b.missing()]
        if missing:
            raise ValueError(f"weights do not match {type(self).__name__}: missing {missing[:8]}")

    def _blocks(self) -> list[SparseMoeBlock]:
        return [m for m in self.modules() if isinstance(m, SparseMoeBlock)]

    def _expert_target(self, name: str) -> tuple[SparseMoeBlock, str, int | None] | None:
        """(block, projection, global expert id or None for stacked) of an expert tensor, else None.
        A name under a layer this pipeline stage lacks is not an expert's here (load_weights skips
        those before, stage_owns)."""
        m = _EXPERT_RE.match(self._normalized(name))
        if m is None:
            return None
        layer = self.model.layers[int(m.group(1))]
        block = getattr(layer, "mlp", None)
        if not isinstance(block, SparseMoeBlock):
            return None  # a dense layer: load_weights names the tensor as unknown
        return block, m.group(3), None if m.group(2) is None else int(m.group(2))

    @staticmethod
    def _normalized(name: str) -> str:
        if ".block_sparse_moe." in name:
            for old, new in _MIXTRAL_NAMES:
                name = name.replace(old, new)
        return name

    def _map_name(self, name: str) -> tuple[str, int | None]:
        return super()._map_name(self._normalized(name))

    def _num_shards(self, param_name: str) -> int:
        if param_name.endswith((".w13_weight", ".w2_weight")):
            return 0  # the experts: checked per expert (SparseMoeBlock.missing)
        return super()._num_shards(param_name)

    def takes_quantized(self, name: str) -> bool:
        # Experts arrive float and are quantized per expert after loading
        # (SparseMoeBlock.quantize_weights).
        return False if self._expert_target(name) else super().takes_quantized(name)

    def expert_stack(self, name: str) -> tuple[str, int, int] | None:
        """For one expert's matrix (HF name `...experts.<e>.<proj>.weight`): the name all experts'
        stacked tensor takes here, e and the number of experts; None for any other tensor. A loader
        that keeps experts quantized in a format of its own stacks them (quant/fp8_checkpoint.py):
        load_expert dequantizes one expert's matrix, never a stack."""
        hit = self._expert_target(name)
        if hit is None or hit[2] is None:
            return None
        block, proj, expert = hit
        return (
            f"model.layers.{block.layer_id}.mlp.experts.{proj}_proj",
            expert,
            block.spec.num_experts,
        )

    def tp_slice(self, name: str) -> TensorSlice | None:
        hit = self._expert_target(name)
        if hit is None:
            return super().tp_slice(name)
        block, _, expert = hit
        start, n = block.local_range()
        if expert is not None or n == block.spec.num_experts:
            return None  # one expert's matrix (skipped unless this rank holds it), or all of them
        return TensorSlice.of(0, start, n)  # this rank's experts of a stacked tensor
