"""Tiny HF MoE checkpoints written to GGUF as llama.cpp's converter writes them (float32): the
header keys its TextModel writes for every model, GLM-4.5's (Glm4MoeModel) on top, and HF's
stacked experts (`mlp.experts.gate_up_proj` [E, 2I, H] and `down_proj`) split per projection. One
writer for the GLM-4.5 and gpt-oss checkpoints (tests/model) and the DeepSeek-V3 / GLM-4.5 ones
with their NextN layer (tests/speculative/mtp_checkpoints.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


def add_text_header(w, cfg, block_count: int) -> None:
    """TextModel.set_gguf_parameters' keys (block_count counting any NextN layer the file keeps;
    key and value length from cfg.head_dim), the RMS norms' epsilon, float32 tensors."""
    import gguf

    w.add_type(gguf.GGUFType.MODEL)
    w.add_block_count(block_count)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)


def add_glm4moe_header(w, cfg, nextn: int) -> None:
    """Glm4MoeModel's keys: rope.dimension_count the rotated part of a head, sigmoid gating, the
    NextN layers counted in block_count. expert_group_count / _used_count are written too: the
    tiny models' n_group is 2 (GLM-4.5's is 1, for which the converter writes none)."""
    import gguf

    add_text_header(w, cfg, cfg.num_hidden_layers + nextn)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"]))
    w.add_vocab_size(cfg.vocab_size)
    w.add_expert_count(cfg.n_routed_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_shared_count(cfg.n_shared_experts)
    w.add_leading_dense_block_count(cfg.first_k_dense_replace)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(cfg.routed_scaling_factor)
    w.add_expert_weights_norm(cfg.norm_topk_prob)
    w.add_expert_group_count(cfg.n_group)
    w.add_expert_group_used_count(cfg.topk_group)
    w.add_nextn_predict_layers(nextn)


def add_stacked_moe_tensors(
    w, state: dict[str, torch.Tensor], gguf_name: Callable[[str], str]
) -> None:
    """Every tensor of state (HF names) under gguf_name(HF name), float32: the stacked experts'
    gate_up_proj [E, 2I, H] split into gate and up [E, I, H] (the converter's ffn_gate_exps /
    ffn_up_exps), down_proj named as a weight, e_score_correction_bias as the tensor map spells
    it (exp_probs_b.bias)."""
    for name, t in state.items():
        a = t.float().numpy().copy()
        if name.endswith(".mlp.experts.gate_up_proj"):
            inter = a.shape[1] // 2
            for part, rows in (("gate", a[:, :inter]), ("up", a[:, inter:])):
                part_name = name.replace("gate_up_proj", f"{part}_proj") + ".weight"
                w.add_tensor(gguf_name(part_name), np.ascontiguousarray(rows))
            continue
        if name.endswith(".mlp.experts.down_proj"):
            name += ".weight"
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        w.add_tensor(gguf_name(name), a)
