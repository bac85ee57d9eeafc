"""llama.cpp's `deepseek2` GGUF architecture (DeepSeek-V2, V2-Lite, V2.5, V3, R1): its metadata
as a transformers DeepseekV2Config / DeepseekV3Config and back (write_deepseek2_metadata: tests and
benchmarks write such files), and its tensor names.

What the converter (convert_hf_to_gguf.py, DeepseekV2Model) writes and how it is read back:
- sigmoid gating (`expert_gating_func` 2) with `exp_probs_b` is V3's router, softmax (1) V2's;
  `expert_group_count` / `expert_group_used_count` are n_group / topk_group,
  `expert_weights_scale` / `expert_weights_norm` routed_scaling_factor / norm_topk_prob;
- `attention.key_length_mla` / `value_length_mla` (newer files, whose key_length is the MQA-ized
  kv_lora_rank + rope and head_count_kv 1) or key_length / value_length give the head dims;
- YaRN's `rope.scaling.yarn_log_multiplier` is 0.1 * mscale_all_dim (DeepSeek's mscale equals it);
- the experts are 3-D (`ffn_gate_exps` [experts, rows, cols]), kv_b_proj is `attn_kv_b` and/or its
  per-head split `attn_k_b` ([heads, kv_lora_rank, qk_nope], transposed) and `attn_v_b`
  ([heads, v_head_dim, kv_lora_rank]); DeepseekV2ForCausalLM.load_weights takes these names;
- the multi-token-prediction layers, where a file keeps them (`nextn_predict_layers`; the converter
  writes them so for deepseek32 and glm4moe, its deepseek2 class drops them today), are counted in
  block_count and stored last with their `blk.N.nextn.*` tensors: num_hidden_layers is the
  difference (the target skips them, speculative/mtp_checkpoint.py loads them).
RoPE is llama.cpp's NORM (adjacent pairs), which is DeepSeek's interleaved layout: no permutation.

`deepseek32` (DeepSeek-V3.2, the converter's DeepseekV32Model) is the same layout plus each layer's
sparse-attention indexer (`indexer.attn_q_b`, `indexer.attn_k`, `indexer.k_norm`, `indexer.proj`)
and its `attention.indexer.head_count` / `key_length` / `top_k`; its router is always V3's.
"""

from __future__ import annotations

from typing import Any

from radixlm.model.gguf.fields import field, required
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel, Variant

DEEPSEEK2_TENSOR_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "attn_norm": "model.layers.{}.input_layernorm",
    "ffn_norm": "model.layers.{}.post_attention_layernorm",
    "attn_q": "model.layers.{}.self_attn.q_proj",
    "attn_q_a": "model.layers.{}.self_attn.q_a_proj",
    "attn_q_a_norm": "model.layers.{}.self_attn.q_a_layernorm",
    "attn_q_b": "model.layers.{}.self_attn.q_b_proj",
    "attn_kv_a_mqa": "model.layers.{}.self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "model.layers.{}.self_attn.kv_a_layernorm",
    "attn_kv_b": "model.layers.{}.self_attn.kv_b_proj",
    "attn_k_b": "model.layers.{}.self_attn.k_b_proj",
    "attn_v_b": "model.layers.{}.self_attn.v_b_proj",
    "attn_output": "model.layers.{}.self_attn.o_proj",
    "ffn_gate_inp": "model.layers.{}.mlp.gate",
    "exp_probs_b": (
        "model.layers.{}.mlp.gate.e_score_correction"
    ),  # .bias -> e_score_correction_bias
    "ffn_gate": "model.layers.{}.mlp.gate_proj",
    "ffn_up": "model.layers.{}.mlp.up_proj",
    "ffn_down": "model.layers.{}.mlp.down_proj",
    "ffn_gate_exps": "model.layers.{}.mlp.experts.gate_proj",
    "ffn_up_exps": "model.layers.{}.mlp.experts.up_proj",
    "ffn_down_exps": "model.layers.{}.mlp.experts.down_proj",
    "ffn_gate_shexp": "model.layers.{}.mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "model.layers.{}.mlp.shared_experts.up_proj",
    "ffn_down_shexp": "model.layers.{}.mlp.shared_experts.down_proj",
    # the multi-token-prediction layers' own tensors (speculative/mtp_checkpoint.py reads them)
    "nextn.eh_proj": "model.layers.{}.eh_proj",
    "nextn.enorm": "model.layers.{}.enorm",
    "nextn.hnorm": "model.layers.{}.hnorm",
    "nextn.shared_head_norm": "model.layers.{}.shared_head.norm",
    "nextn.shared_head_head": "model.layers.{}.shared_head.head",
    "nextn.embed_tokens": "model.layers.{}.embed_tokens",
}

SIGMOID_GATING = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID


def is_v3(reader, arch: str) -> bool:
    """V3's router (sigmoid gating), else V2's (softmax)."""
    return field(reader, f"{arch}.expert_gating_func") == SIGMOID_GATING


def deepseek_moe_fields(f, norm_topk_default: bool) -> dict:
    """The DeepSeek-style MoE keys llama.cpp writes (deepseek2, glm4moe, dots1) as HF config
    kwargs; f(key, default) reads `{arch}.{key}`."""
    return dict(
        moe_intermediate_size=int(f("expert_feed_forward_length", 0)),
        n_routed_experts=int(f("expert_count", 0)),
        num_experts_per_tok=int(f("expert_used_count", 0)),
        n_shared_experts=int(f("expert_shared_count", 0)),
        first_k_dense_replace=int(f("leading_dense_block_count", 0)),
        routed_scaling_factor=float(f("expert_weights_scale", 1.0)),
        norm_topk_prob=bool(f("expert_weights_norm", norm_topk_default)),
        n_group=int(f("expert_group_count") or 1),
        topk_group=int(f("expert_group_used_count") or 1),
    )


def deepseek2_config(reader, arch: str, kw: dict) -> dict:
    """DeepseekV2Config / DeepseekV3Config kwargs of a deepseek2 GGUF; kw holds the keys every
    architecture shares."""
    f = lambda key, default=None: field(reader, f"{arch}.{key}", default)
    rope = int(f("rope.dimension_count"))
    key_len = f("attention.key_length_mla") or f("attention.key_length")
    value_len = f("attention.value_length_mla") or f("attention.value_length")
    v3 = is_v3(reader, arch)
    nextn = int(f("nextn_predict_layers", 0))
    n_group = int(f("expert_group_count") or 1)
    out = {k: v for k, v in kw.items() if k not in ("head_dim", "num_key_value_heads")}
    out.update(
        num_key_value_heads=kw["num_attention_heads"],
        num_hidden_layers=int(kw["num_hidden_layers"]) - nextn,
        num_nextn_predict_layers=nextn,
        q_lora_rank=f("attention.q_lora_rank") or None,
        kv_lora_rank=int(f("attention.kv_lora_rank")),
        qk_rope_head_dim=rope,
        qk_nope_head_dim=int(key_len) - rope,
        v_head_dim=int(value_len),
        **deepseek_moe_fields(f, norm_topk_default=False),
    )
    if not v3:
        out["topk_method"] = "group_limited_greedy" if n_group > 1 else "greedy"
    rs = out.pop("rope_scaling", None)
    params = {"rope_type": "default", "rope_theta": float(kw.get("rope_theta", 10000.0))}
    if rs and rs.get("rope_type") == "yarn":
        mscale = float(f("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
        params.update(
            rope_type="yarn",
            factor=rs["factor"],
            mscale=mscale,
            mscale_all_dim=mscale,
            beta_fast=float(f("rope.scaling.yarn_beta_fast", 32.0)),
            beta_slow=float(f("rope.scaling.yarn_beta_slow", 1.0)),
        )
        if "original_max_position_embeddings" in rs:
            params["original_max_position_embeddings"] = rs["original_max_position_embeddings"]
    out.pop("rope_theta", None)
    out["rope_parameters"] = params
    return out


DEEPSEEK2 = GGUFArchitecture(
    HFModel("DeepseekV2ForCausalLM", "DeepseekV2Config"),
    config=deepseek2_config,
    variants=(Variant(HFModel("DeepseekV3ForCausalLM", "DeepseekV3Config"), is_v3),),
    tensor_names=DEEPSEEK2_TENSOR_NAMES,
)

DEEPSEEK32_TENSOR_NAMES = {
    **DEEPSEEK2_TENSOR_NAMES,
    "indexer.attn_q_b": "model.layers.{}.self_attn.indexer.wq_b",
    "indexer.attn_k": "model.layers.{}.self_attn.indexer.wk",
    "indexer.k_norm": "model.layers.{}.self_attn.indexer.k_norm",
    "indexer.proj": "model.layers.{}.self_attn.indexer.weights_proj",
}


def deepseek32_config(reader, arch: str, kw: dict) -> dict:
    """DeepseekV32Config kwargs of a deepseek32 GGUF: deepseek2's and the indexer's."""
    out = deepseek2_config(reader, arch, kw)
    out.pop("topk_method", None)  # V3.2's router is V3's whatever the gating key says
    out.update(
        index_n_heads=int(required(reader, arch, "attention.indexer.head_count")),
        index_head_dim=int(required(reader, arch, "attention.indexer.key_length")),
        index_topk=int(required(reader, arch, "attention.indexer.top_k")),
    )
    return out


DEEPSEEK32 = GGUFArchitecture(
    HFModel("DeepseekV32ForCausalLM", "DeepseekV32Config"),
    config=deepseek32_config,
    tensor_names=DEEPSEEK32_TENSOR_NAMES,
)


def write_deepseek2_metadata(writer, cfg: Any, nextn_layers: int = 0) -> None:
    """The deepseek2 keys of a DeepseekV2Config / DeepseekV3Config (or anything with its fields) on
    a gguf.GGUFWriter, as convert_hf_to_gguf.py writes them (MLA's MQA-ized key/value lengths, head
    dims in the *_mla keys), so that radixlm and llama.cpp read the file alike. q_lora_rank is
    written 0 when there is none: llama.cpp takes its absence for V2-Lite only by the layer count.
    nextn_layers: multi-token-prediction layers the file keeps after the decoder's (counted in
    block_count, nextn_predict_layers written when any)."""
    v32 = cfg.architectures[0] == "DeepseekV32ForCausalLM"  # deepseek32: the indexer's keys too
    a = "deepseek32" if v32 else "deepseek2"
    v3 = v32 or cfg.architectures[0] == "DeepseekV3ForCausalLM"
    rope = cfg.qk_rope_head_dim
    for key, value in [
        ("context_length", cfg.max_position_embeddings),
        ("embedding_length", cfg.hidden_size),
        ("feed_forward_length", cfg.intermediate_size),
        ("block_count", cfg.num_hidden_layers + nextn_layers),
        ("attention.head_count", cfg.num_attention_heads),
        ("attention.head_count_kv", 1),
        ("rope.dimension_count", rope),
        ("vocab_size", cfg.vocab_size),
        ("leading_dense_block_count", cfg.first_k_dense_replace),
        ("attention.q_lora_rank", cfg.q_lora_rank or 0),
        ("attention.kv_lora_rank", cfg.kv_lora_rank),
        ("attention.key_length", cfg.kv_lora_rank + rope),
        ("attention.value_length", cfg.kv_lora_rank),
        ("attention.key_length_mla", cfg.qk_nope_head_dim + rope),
        ("attention.value_length_mla", cfg.v_head_dim),
        ("expert_feed_forward_length", cfg.moe_intermediate_size),
        ("expert_count", cfg.n_routed_experts),
        ("expert_used_count", cfg.num_experts_per_tok),
        ("expert_shared_count", cfg.n_shared_experts),
        ("expert_gating_func", SIGMOID_GATING if v3 else 1),
        ("expert_group_count", cfg.n_group or 1),
        ("expert_group_used_count", cfg.topk_group or 1),
    ]:
        writer.add_uint32(f"{a}.{key}", value)
    if nextn_layers:
        writer.add_uint32(f"{a}.nextn_predict_layers", nextn_layers)
    if v32:
        writer.add_uint32(f"{a}.attention.indexer.head_count", cfg.index_n_heads)
        writer.add_uint32(f"{a}.attention.indexer.key_length", cfg.index_head_dim)
        writer.add_uint32(f"{a}.attention.indexer.top_k", cfg.index_topk)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    rp = cfg.rope_parameters
    writer.add_float32(f"{a}.rope.freq_base", rp["rope_theta"])
    writer.add_float32(f"{a}.expert_weights_scale", cfg.routed_scaling_factor)
    writer.add_bool(f"{a}.expert_weights_norm", bool(cfg.norm_topk_prob))
    if rp["rope_type"] == "yarn":
        writer.add_string(f"{a}.rope.scaling.type", "yarn")
        writer.add_float32(f"{a}.rope.scaling.factor", rp["factor"])
        writer.add_uint32(
            f"{a}.rope.scaling.original_context_length", rp["original_max_position_embeddings"]
        )
        writer.add_float32(f"{a}.rope.scaling.yarn_log_multiplier", 0.1 * rp["mscale_all_dim"])
