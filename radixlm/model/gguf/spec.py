"""What the GGUF loader needs of one llama.cpp architecture (`general.architecture`): a
GGUFArchitecture, which each module of archs/ builds and registry.py registers by name."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from radixlm.model.tp_shard import Slicer, TensorSlice

# read(t, name, slice): the loader's reader of one tensor (quantized or float32 as asked)
TensorReader = Callable[[Any, str, TensorSlice | None], Any]
# config(reader, arch, kw): kw (the keys every architecture shares, read already) completed for the
# HF config class; a new dict (kw itself is not changed)
ConfigMap = Callable[[Any, str, dict], dict]
# weights(reader, config, read, slicer, keep): (HF name, tensor) for every tensor the model loads;
# slicer (tensor parallelism): HF name -> this rank's part; keep (a pipeline stage): names read
WeightIterator = Callable[
    [Any, Any, TensorReader, Slicer | None, Callable[[str], bool] | None],
    Iterator[tuple[str, Any]],
]

# llama.cpp's MoE tensor names -> HF names ({} = layer index): 3-D experts, shared expert, router
EXPERT_TENSOR_NAMES = {
    "ffn_gate_inp": "model.layers.{}.mlp.gate",
    "ffn_gate_exps": "model.layers.{}.mlp.experts.gate_proj",
    "ffn_up_exps": "model.layers.{}.mlp.experts.up_proj",
    "ffn_down_exps": "model.layers.{}.mlp.experts.down_proj",
    "ffn_gate_shexp": "model.layers.{}.mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "model.layers.{}.mlp.shared_expert.up_proj",
    "ffn_down_shexp": "model.layers.{}.mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "model.layers.{}.mlp.shared_expert_gate",
}
# llama.cpp tensor names -> HF names ({} = layer index): llama's layout, which most keep
TENSOR_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "attn_norm": "model.layers.{}.input_layernorm",
    "ffn_norm": "model.layers.{}.post_attention_layernorm",
    "attn_q": "model.layers.{}.self_attn.q_proj",
    "attn_k": "model.layers.{}.self_attn.k_proj",
    "attn_v": "model.layers.{}.self_attn.v_proj",
    "attn_output": "model.layers.{}.self_attn.o_proj",
    "attn_q_norm": "model.layers.{}.self_attn.q_norm",
    "attn_k_norm": "model.layers.{}.self_attn.k_norm",
    "ffn_gate": "model.layers.{}.mlp.gate_proj",
    "ffn_up": "model.layers.{}.mlp.up_proj",
    "ffn_down": "model.layers.{}.mlp.down_proj",
    **EXPERT_TENSOR_NAMES,
}


@dataclass(frozen=True)
class HFModel:
    """The HF names a GGUF is read as."""

    architecture: str  # config.architectures[0]: MODEL_REGISTRY's name
    config_class: str  # the transformers config class


@dataclass(frozen=True)
class Variant:
    """Another HF model that files of the architecture are where their metadata says so (llama.cpp
    writes Mistral and Mixtral as llama, DeepSeek-V3 as deepseek2)."""

    model: HFModel
    applies: Callable[[Any, str], bool]  # (reader, arch)


def common_keys_only(reader, arch: str, kw: dict) -> dict:
    """The config of an architecture whose metadata has only the keys every one shares."""
    return kw


@dataclass(frozen=True)
class GGUFArchitecture:
    """One llama.cpp architecture: the HF model it is read as, its config mapping, and how its
    tensors become HF's. Without `weights`, the loader renames the tensors by `tensor_names` and
    applies the flags; with it, the family's iterator yields every tensor itself."""

    model: HFModel
    config: ConfigMap = common_keys_only
    variants: tuple[Variant, ...] = ()  # the first that applies replaces `model`
    tensor_names: Mapping[str, str] = field(default_factory=lambda: TENSOR_NAMES)
    # q / k rows permuted for GGML's RoPE by the converter (LlamaModel's): undone at load
    unpermute_qk: bool = False
    norm_offset: bool = False  # norm weights stored as 1 + w (Gemma's): the 1 taken off
    weights: WeightIterator | None = None
    # a rope_freqs tensor is llama 3's rope scaling baked into per-frequency factors
    llama3_rope_freqs: bool = True

    def hf_model(self, reader, arch: str) -> HFModel:
        """The HF model this file is read as."""
        return next((v.model for v in self.variants if v.applies(reader, arch)), self.model)
