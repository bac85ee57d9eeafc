"""llama.cpp's `glm4moe` GGUF architecture (GLM-4.5 / 4.6 / 4.5-Air): its metadata as a
transformers Glm4MoeConfig, and its tensor names.

What the converter (convert_hf_to_gguf.py, Glm4MoeModel) writes and how it is read back:
- block_count counts the MTP layers too (nextn_predict_layers, stored last with their own
  `blk.N.nextn.*` tensors): num_hidden_layers is the difference, and the MTP layers' tensors are
  skipped at load (DeepseekV2ForCausalLM's loader drops layers past num_hidden_layers);
- rope.dimension_count is head_dim * partial_rotary_factor, attention.key_length the head_dim;
- sigmoid gating with `exp_probs_b` (e_score_correction_bias), expert_weights_scale / _norm are
  routed_scaling_factor / norm_topk_prob, leading_dense_block_count first_k_dense_replace;
  expert_group_count / expert_group_used_count (n_group / topk_group) are read where present
  (GLM-4.5's own are 1, and its converter writes none);
- q/k/v biases and the q/k norms are present or not (attention_bias, use_qk_norm);
- RoPE is llama.cpp's NEOX (HF's rotate_half layout): q/k are stored unpermuted.
"""

from __future__ import annotations

from typing import Any

from radixlm.model.gguf.archs.deepseek import DEEPSEEK2_TENSOR_NAMES, deepseek_moe_fields
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel

GLM4MOE_TENSOR_NAMES = dict(
    DEEPSEEK2_TENSOR_NAMES,
    attn_k="model.layers.{}.self_attn.k_proj",
    attn_v="model.layers.{}.self_attn.v_proj",
    attn_q_norm="model.layers.{}.self_attn.q_norm",
    attn_k_norm="model.layers.{}.self_attn.k_norm",
    post_attention_norm="model.layers.{}.post_attention_layernorm",
)


def glm4moe_config(reader, arch: str, kw: dict) -> dict:
    """Glm4MoeConfig kwargs of a glm4moe GGUF; kw holds the keys every architecture shares."""

    def f(key: str, default: Any = None) -> Any:
        field = reader.fields.get(f"{arch}.{key}")
        return default if field is None else field.contents()

    if kw.get("rope_scaling"):
        raise ValueError(f"glm4moe GGUF: rope scaling {kw['rope_scaling']} is not supported")
    names = {t.name for t in reader.tensors}
    nextn = int(f("nextn_predict_layers", 0))
    out = {k: v for k, v in kw.items() if k not in ("rope_theta", "rope_scaling")}
    head_dim = int(kw["head_dim"])
    out.update(
        num_hidden_layers=int(kw["num_hidden_layers"]) - nextn,
        num_nextn_predict_layers=nextn,
        attention_bias="blk.0.attn_q.bias" in names,
        use_qk_norm="blk.0.attn_q_norm.weight" in names,
        **deepseek_moe_fields(f, norm_topk_default=True),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": float(kw.get("rope_theta", 10000.0)),
            "partial_rotary_factor": int(f("rope.dimension_count", head_dim)) / head_dim,
        },
    )
    return out


GLM4MOE = GGUFArchitecture(
    HFModel("Glm4MoeForCausalLM", "Glm4MoeConfig"),
    config=glm4moe_config,
    tensor_names=GLM4MOE_TENSOR_NAMES,
)
