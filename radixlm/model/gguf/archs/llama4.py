"""llama.cpp's Llama 4 GGUF (arch llama4: its converter's Llama4Model) read back as HF
Llama4ForCausalLM's text config.

The converter swaps HF's two MLP sizes (feed_forward_length is the dense layers'
intermediate_size_mlp, expert_feed_forward_length the experts' and the shared expert's
intermediate_size), writes interleave_moe_layer_step, and keeps q / k in HF's interleaved RoPE
order (no permutation: the model's loader turns them to rotate-half as for safetensors). What HF
keeps in the config llama.cpp fixes in code (src/models/llama4.cpp), so it is set here the same
way: chunked attention over 8,192 positions with every fourth layer global and without RoPE,
attention temperature tuning on those (floor 8,192, scale 0.1), L2 q/k norms unless the model has
128 experts (Maverick); a sliding_window of 0 means none of it (all layers global, all rotate).
The tensors take the llama names (ffn_*_exps as ExpertWeights, *_shexp as the shared expert).
"""

from __future__ import annotations

from radixlm.model.gguf.fields import field
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel

# llama.cpp's fixed values for Scout and Maverick (src/models/llama4.cpp).
CHUNK = 8192
NO_ROPE_INTERVAL = 4
TEMPERATURE_FLOOR = 8192
TEMPERATURE_SCALE = 0.1
MAVERICK_EXPERTS = 128  # the one without q/k norms


def llama4_config(reader, arch: str, kw: dict) -> dict:
    """kw (the dense keys already read) with Llama 4's own, under HF's names."""
    out = dict(kw)
    experts = int(field(reader, f"{arch}.expert_count", 0))
    if not experts:
        raise ValueError("llama4 GGUF without experts (expert_count 0): llama.cpp refuses it too")
    out["intermediate_size_mlp"] = out.pop("intermediate_size")
    out["intermediate_size"] = int(field(reader, f"{arch}.expert_feed_forward_length"))
    out["num_local_experts"] = experts
    out["num_experts_per_tok"] = int(field(reader, f"{arch}.expert_used_count", 1))
    out["interleave_moe_layer_step"] = int(field(reader, f"{arch}.interleave_moe_layer_step"))
    n = int(out["num_hidden_layers"])
    chunked = field(reader, f"{arch}.attention.sliding_window") != 0
    out["attention_chunk_size"] = CHUNK if chunked else None
    interval = NO_ROPE_INTERVAL if chunked else n + 1
    out["no_rope_layers"] = [int((i + 1) % interval != 0) for i in range(n)]
    out["attn_temperature_tuning"] = chunked
    out["floor_scale"] = TEMPERATURE_FLOOR
    out["attn_scale"] = TEMPERATURE_SCALE
    out["use_qk_norm"] = experts != MAVERICK_EXPERTS
    return out


LLAMA4 = GGUFArchitecture(HFModel("Llama4ForCausalLM", "Llama4TextConfig"), config=llama4_config)
