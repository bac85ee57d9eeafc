"""llama.cpp's `ernie4_5-moe` (conversion/ernie.py Ernie4_5MoeModel), read as HF's
Ernie4_5_MoeForCausalLM: the dense ernie4_5's keys (archs/llama_variants.py: q / k rows as HF
has them, models/ernie4_5.py reorders them) plus expert_count (moe_num_experts),
expert_used_count (moe_k), interleave_moe_layer_step (moe_layer_interval),
leading_dense_block_count (moe_layer_start_index), expert_feed_forward_length
(moe_intermediate_size) and expert_shared_count (moe_num_shared_experts). moe_layer_end_index is
not written (llama.cpp runs every later layer on the step as a MoE): the last layer, as in
Baidu's configs. The converter writes the shared experts' width as intermediate_size /
num_key_value_heads (Baidu's shapes); a file whose value is not moe_intermediate_size times the
shared count is refused by name. The experts stacked (ffn_{gate,up,down}_exps), the router
ffn_gate_inp (F32), the shared experts ffn_*_shexp, e_score_correction_bias as exp_probs_b.bias.
"""

from __future__ import annotations

from radixlm.model.gguf.archs.llama_variants import ernie4_5_config
from radixlm.model.gguf.fields import field, required
from radixlm.model.gguf.spec import TENSOR_NAMES, GGUFArchitecture, HFModel


def ernie4_5_moe_config(reader, arch: str, kw: dict) -> dict:
    out = ernie4_5_config(reader, arch, kw)
    moe_ff = int(required(reader, arch, "expert_feed_forward_length"))
    shared = int(field(reader, f"{arch}.expert_shared_count", 0))
    width = field(reader, f"{arch}.expert_shared_feed_forward_length")
    if shared and width is not None and int(width) != moe_ff * shared:
        raise ValueError(
            f"{arch} GGUF: {arch}.expert_shared_feed_forward_length {width} is not"
            f" expert_feed_forward_length {moe_ff} x expert_shared_count {shared}"
        )
    out.update(
        moe_num_experts=int(required(reader, arch, "expert_count")),
        moe_k=int(required(reader, arch, "expert_used_count")),
        moe_intermediate_size=moe_ff,
        moe_num_shared_experts=shared,
        moe_layer_interval=int(required(reader, arch, "interleave_moe_layer_step")),
        moe_layer_start_index=int(field(reader, f"{arch}.leading_dense_block_count", 0)),
        moe_layer_end_index=int(kw["num_hidden_layers"]) - 1,
    )
    return out


ERNIE4_5_MOE = GGUFArchitecture(
    HFModel("Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig"),
    config=ernie4_5_moe_config,
    tensor_names=dict(
        TENSOR_NAMES,
        ffn_gate_shexp="model.layers.{}.mlp.shared_experts.gate_proj",
        ffn_up_shexp="model.layers.{}.mlp.shared_experts.up_proj",
        ffn_down_shexp="model.layers.{}.mlp.shared_experts.down_proj",
        exp_probs_b="model.layers.{}.mlp.moe_statics.e_score_correction",
    ),
)
