"""Qwen3 (dense): the Llama graph with per-head RMSNorm on q and k before RoPE.

head_dim comes from config.head_dim (128 on Qwen3, not hidden / heads)."""

from radixlm.model.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
