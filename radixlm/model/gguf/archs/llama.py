"""llama.cpp's `llama` and `smollm3` GGUFs: its converter's LlamaModel permutes the q / k rows for
GGML's RoPE (each head's rotary pairs interleaved), undone at load back to HF's rotate-half order.

llama.cpp writes Mistral and Mixtral as llama: a llama file with a sliding window is a Mistral, one
with experts a Mixtral (archs/moe.py reads its expert keys). llama.cpp fixes SmolLM3's NoPE layers
(every 4th) as transformers' default interval does: nothing to read.
"""

from __future__ import annotations

from radixlm.model.gguf.archs.moe import has_experts, moe_config_kwargs
from radixlm.model.gguf.fields import field
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel, Variant

MISTRAL = HFModel("MistralForCausalLM", "MistralConfig")
MIXTRAL = HFModel("MixtralForCausalLM", "MixtralConfig")


def has_window(reader, arch: str) -> bool:
    return bool(field(reader, f"{arch}.attention.sliding_window"))


def llama_config(reader, arch: str, kw: dict) -> dict:
    """kw (the keys every architecture shares) plus Mistral's window and Mixtral's experts."""
    if has_window(reader, arch):
        kw = dict(kw, sliding_window=field(reader, f"{arch}.attention.sliding_window"))
    if has_experts(reader, arch):
        kw = moe_config_kwargs(reader, arch, kw)
    return kw


LLAMA = GGUFArchitecture(
    HFModel("LlamaForCausalLM", "LlamaConfig"),
    config=llama_config,
    variants=(Variant(MIXTRAL, has_experts), Variant(MISTRAL, has_window)),
    unpermute_qk=True,
)
SMOLLM3 = GGUFArchitecture(HFModel("SmolLM3ForCausalLM", "SmolLM3Config"), unpermute_qk=True)
