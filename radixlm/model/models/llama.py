"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral); Qwen2/Qwen3 subclass it.

Module names follow HF, except q/k/v -> qkv_proj and gate/up -> gate_up_proj,
which `load_weights` fills from the HF tensors (stacked_params_mapping).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from radixlm.model.decoder_stack import DecoderStack
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.activation import SiluAndMul
from radixlm.model.layers.attention import RadixAttention
from radixlm.model.layers.fused_layers import build_fused_layers
from radixlm.model.layers.linear import MergedLinear
from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.parallel_linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
)
from radixlm.model.layers.quantized import QuantizedTensor
from radixlm.model.layers.rotary import RotaryEmbedding, get_rope
from radixlm.model.pp_stage import PPMissingLayer, pp_stage
from radixlm.model.tp_shard import TensorSlice
from radixlm.model.traits import (
    FinishesLoading,
    ModelTraits,
    ServedModel,
    SlicesForTP,
    TakesQuantized,
)


def get_head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def get_sliding_window(config: Any, layer_id: int) -> int | None:
    """The attention window of layer layer_id (None: full attention), as HF decides it: from
    config.layer_types where the config has them (Gemma, Qwen2 with use_sliding_window), else
    config.sliding_window for every layer (Mistral). A window the context never exceeds changes
    nothing, so it is None too (such a model keeps every backend)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and layer_types[layer_id] != "sliding_attention":
        return None
    if not window or window >= getattr(config, "max_position_embeddings", 0):
        return None
    return int(window)


class LlamaMLP(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        bias: bool = False,
        act_fn: nn.Module | None = None,
    ):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, bias=bias
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, bias=bias, what="intermediate_size"
        )
        self.act_fn = act_fn if act_fn is not None else SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: Any,
        layer_id: int,
        rotary_emb: RotaryEmbedding,
        qkv_bias: bool,
        qk_norm: bool,
        scaling: float | None = None,
        logit_cap: float = 0.0,
        norm_cls: type[RMSNorm] = RMSNorm,
        sinks: bool = False,
        o_bias: bool | None = None,
    ):
        """scaling (None: head_dim ** -0.5), logit_cap, norm_cls (of the q/k norms), sinks and
        o_bias (None: config.attention_bias) are the knobs other families turn (Gemma:
        query_pre_attn_scalar, attn_logit_softcapping, OffsetRMSNorm; gpt-oss: attention sinks,
        held by self.attn; GLM-4.5: q/k/v bias without an o_proj bias)."""
        super().__init__()
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        self.head_dim = get_head_dim(config)
        if o_bias is None:  # Llama's attention_bias: q/k/v and o alike
            o_bias = bool(getattr(config, "attention_bias", False))
            qkv_bias = qkv_bias or o_bias
        # This tensor-parallel rank's heads (all of them with tp_size 1).
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, self.head_dim, total_heads, total_kv_heads, bias=qkv_bias
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = (
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        self.o_proj = RowParallelLinear(
            total_heads * self.head_dim,
            config.hidden_size,
            bias=o_bias,
            what="num_attention_heads * head_dim",
        )
        self.rotary_emb = rotary_emb  # shared by all layers (one cos/sin cache)
        if qk_norm:  # Qwen3: RMSNorm over each head of q and k, before RoPE
            self.q_norm = norm_cls(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = norm_cls(self.head_dim, eps=config.rms_norm_eps)
        self.qk_norm = qk_norm
        self.attn = RadixAttention(
            self.num_heads,
            self.head_dim,
            scaling or self.head_dim**-0.5,
            self.num_kv_heads,
            layer_id,
            logit_cap=logit_cap,
            sliding_window_size=get_sliding_window(config, layer_id),
            sinks=sinks,
        )

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:  # each head a row: the norms' fused kernel, as the one-op stack runs it
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(-1, self.q_size)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(-1, self.kv_size)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, forward_batch))


class GatelessMLP(nn.Module):
    """down(act(up(x))): an MLP without a gate (Arcee's ReLU², Apertus' xIELU)."""

    def __init__(self, hidden_size: int, intermediate_size: int, act_fn: nn.Module, bias: bool):
        super().__init__()
        self.up_proj = ColumnParallelLinear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, bias=bias, what="intermediate_size"
        )
        self.act_fn = act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: Any,
        layer_id: int,
        rotary_emb: RotaryEmbedding,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        self_attn: nn.Module | None = None,
        mlp: nn.Module | None = None,
    ):
        """self_attn, mlp: a family's own blocks in Llama's pre-norm layer (default: Llama's)."""
        super().__init__()
        self.self_attn = self_attn or LlamaAttention(
            config, layer_id, rotary_emb, qkv_bias, qk_norm
        )
        self.mlp = mlp or LlamaMLP(
            config.hidden_size, config.intermediate_size, bool(getattr(config, "mlp_bias", False))
        )
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions, hidden, forward_batch, residual):
        # The residual stream rides along; each norm adds it in (fused add + norm).
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, forward_batch)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(DecoderStack):
    def __init__(
        self,
        config: Any,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        build_layer: Callable[[int, RotaryEmbedding], nn.Module] | None = None,
    ):
        """build_layer(layer id, the shared RoPE): a family's layer (default: Llama's)."""
        super().__init__()
        # A pipeline stage builds its layers only: the embedding on the first stage (and on the last
        # when the LM head is tied to it), the final norm on the last (decoder_stack.py).
        self.init_stack(config)
        self.embed_tokens = self.stage_embedding(config)
        self.rotary_emb = rotary_emb = get_rope(get_head_dim(config), config)
        self.layers = self.stage_layers(
            config.num_hidden_layers,
            lambda i: (
                build_layer(i, rotary_emb)
                if build_layer is not None
                else LlamaDecoderLayer(config, i, rotary_emb, qkv_bias, qk_norm)
            ),
        )
        self.norm = self.on_last(lambda: RMSNorm(config.hidden_size, eps=config.rms_norm_eps))

    def build_fused(self):
        """All layers in one native op where it applies (model/layers/fused_layers.py)."""
        return build_fused_layers(
            self, (LlamaDecoderLayer.forward, LlamaAttention.forward, LlamaMLP.forward)
        )


class LlamaForCausalLM(ServedModel):
    # Knobs the Qwen subclasses turn.
    qkv_bias = False
    qk_norm = False
    # (fused param, HF name, shard index)
    stacked_params_mapping = [
        ("qkv_proj", "q_proj", 0),
        ("qkv_proj", "k_proj", 1),
        ("qkv_proj", "v_proj", 2),
        ("gate_up_proj", "gate_proj", 0),
        ("gate_up_proj", "up_proj", 1),
    ]

    def __init__(self, config: Any):
        super().__init__()
        self.config = config
        self.model = self.build_model(config)
        self.pp = pp_stage(config.num_hidden_layers)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = (
                ParallelLMHead(config.hidden_size, config.vocab_size)
                if self.pp.is_last
                else PPMissingLayer()
            )

    def traits(self) -> ModelTraits:
        return ModelTraits(
            loads_quantized_weights=True, tie_word_embeddings=self.tie_word_embeddings
        )

    def build_model(self, config: Any) -> nn.Module:
        """The decoder stack (families with another layer structure override it)."""
        return LlamaModel(config, qkv_bias=self.qkv_bias, qk_norm=self.qk_norm)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """-> hidden states [num_tokens, hidden] after the final norm."""
        return self.model(input_ids, positions, forward_batch)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        head = self.model.embed_tokens.as_lm_head if self.tie_word_embeddings else self.lm_head
        return head(hidden_states).float()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Fill every parameter from (HF name, tensor) pairs; raise on missing or unknown names
        (parameters start uninitialized, so a silent miss would mean garbage output)."""
        params = dict(self.named_parameters())
        loaded: dict[str, set] = {}
        unknown = []
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or (
                self.tie_word_embeddings and name == "lm_head.weight"
            ):
                continue
            target, shard = self._map_name(name)
            if target not in params:
                unknown.append(name)
                continue
            param = params[target]
            if shard is None:
                if param.shape != tensor.shape:
                    raise ValueError(
                        f"{name}: expected shape {tuple(param.shape)}, got {tuple(tensor.shape)}"
                    )
                if isinstance(tensor, QuantizedTensor):
                    owner = self.get_submodule(target.rsplit(".", 1)[0])
                    if isinstance(owner, TakesQuantized) and target.endswith(".weight"):
                        owner.set_quantized([tensor])
                    else:  # not a matrix the kernels multiply by
                        param.data = tensor.dequantize().to(device=param.device, dtype=param.dtype)
                    loaded.setdefault(target, set()).add(0)
                    continue
                # Adopt the loaded tensor instead of copying it into the (never touched)
                # empty param: halves the memory written at load, where page faults dominate.
                param.data = tensor.to(device=param.device, dtype=param.dtype).contiguous()
            else:
                try:
                    self.get_submodule(target.rsplit(".", 1)[0]).load_shard(param, tensor, shard)
                except ValueError as e:  # name the checkpoint's tensor, not the fused shard
                    raise ValueError(f"{name}: {e}") from None
            loaded.setdefault(target, set()).add(shard or 0)
        for module in self.modules():
            if isinstance(module, FinishesLoading):
                module.finish_loading()
        missing = [n for n in params if len(loaded.get(n, ())) < self._num_shards(n)]
        if unknown or missing:
            raise ValueError(
                f"weights do not match {type(self).__name__}: missing {missing[:8]}, unknown"
                f" {unknown[:8]}"
            )

    def takes_quantized(self, name: str) -> bool:
        """Whether load_weights puts the HF tensor `name` in a matrix the kernels multiply by (a
        quantized tensor for anything else would be dequantized again)."""
        owner, kind, _ = self._owner_of(name)
        return kind == "weight" and isinstance(owner, TakesQuantized)

    def param_name(self, name: str) -> str:
        """The parameter checkpoint tensor `name` fills (its fused parameter's, for q/k/v)."""
        return self._map_name(name)[0]

    def module_of(self, name: str) -> nn.Module | None:
        """The module that takes HF tensor `name` (the fused layer of q/k/v, gate/up), or None."""
        return self._owner_of(name)[0]

    def expert_stack(self, name: str) -> tuple[str, int, int] | None:
        """Where an expert's checkpoint tensor `name` goes in its projection's stack of experts
        (MoE families); None: not an expert's."""
        return None

    def tp_slice(self, name: str) -> TensorSlice | None:
        """The part of checkpoint tensor `name` this tensor-parallel rank holds (None: all of
        it)."""
        owner, kind, shard = self._owner_of(name)
        return owner.tp_slice(kind, shard) if isinstance(owner, SlicesForTP) else None

    def _owner_of(self, name: str) -> tuple[nn.Module | None, str, int | None]:
        """(the module that takes HF tensor `name`, its parameter name, shard); no module for a tied
        lm_head or an unknown name (load_weights names those)."""
        if self.tie_word_embeddings and name == "lm_head.weight":
            return None, "", None
        target, shard = self._map_name(name)
        module, _, kind = target.rpartition(".")
        try:
            return self.get_submodule(module), kind, shard
        except AttributeError:
            return None, kind, shard

    def _map_name(self, name: str) -> tuple[str, int | None]:
        """HF name -> (our param name, shard index in a fused param or None)."""
        for fused, hf_part, shard in self.stacked_params_mapping:
            if f".{hf_part}." in name:
                return name.replace(f".{hf_part}.", f".{fused}."), shard
        return name, None

    def _num_shards(self, param_name: str) -> int:
        module = self.get_submodule(param_name.rsplit(".", 1)[0])
        return len(module.output_sizes) if isinstance(module, MergedLinear) else 1


class MistralForCausalLM(LlamaForCausalLM):
    """The Llama graph; config.sliding_window (every layer) reaches the attention
    (get_sliding_window)."""
