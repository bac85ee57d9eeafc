"""Qwen2 / Qwen2.5: the Llama graph with a bias on q/k/v (not on o_proj)."""

from radixlm.model.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
