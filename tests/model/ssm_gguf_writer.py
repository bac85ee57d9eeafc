"""llama.cpp's converter for the hybrid Mamba-2 / short-conv architectures, transcribed on its own
(without radixlm's loader) for tests/model/hybrid_checkpoints.py's write_gguf: nemotron_h
(conversion/nemotron.py NemotronHModel over conversion/granite.py GraniteHybridModel,
conversion/mamba.py Mamba2Model, conversion/llama.py LlamaModel and conversion/base.py TextModel)
lfm2 (conversion/lfm2.py LFM2Model) and lfm2moe (LFM2MoeModel: its experts, saved per expert,
stacked per layer; 5.x's in-memory gate_up_proj is those w1 then w3 stacked, so it is split back).

The converter reads its hparams as transformers 4.x gives them (llama.cpp pins transformers < 5): a
dense Nemotron-H config carries hybrid_override_pattern as a string ("M-*" ...) and no MoE fields,
so it is nemotron_h (not nemotron_h_moe) with its '-' layers as MLPs; hparams() builds that view
from the 5.x config. A config with MoE blocks ("moe", pattern letter E; NVIDIA's carry
num_experts_per_tok) is nemotron_h_moe: its E layers are the "MLP" layers (feed_forward_length
moe_intermediate_size there), the expert keys are written, and the experts stacked into
ffn_up_exps / ffn_down_exps (5.x's stacked mixer.experts.up_proj is NVIDIA's per-expert
tensors stacked, as the converter stacks them). Keys the converter writes twice (TextModel's,
then the subclass's) are written once, with the later value.
"""

from __future__ import annotations

import torch

SSM_ARCHS = ("nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe")
_MOE_KEYS = ("num_experts_per_tok", "n_routed_experts", "n_group")


def is_moe(cfg) -> bool:
    return cfg.model_type == "nemotron_h" and "moe" in cfg.layers_block_type


def hparams(cfg) -> dict:
    """The converter's hparams (AutoConfig.from_pretrained(dir).to_dict() under 4.x)."""
    hp = cfg.to_dict()
    if cfg.model_type == "nemotron_h":
        hp["hybrid_override_pattern"] = cfg.hybrid_override_pattern
        for key in ("layers_block_type", *(() if is_moe(cfg) else _MOE_KEYS)):
            hp.pop(key, None)
        hp["num_hidden_layers"] = len(hp["hybrid_override_pattern"])
    return hp


def add_hparams(w, hp: dict, arch: str, ftype, mtp_layers: int = 0) -> None:
    """mtp_layers 1: NemotronHModel.__init__ with num_nextn_predict_layers 1 (MoE models): the MTP
    block appended as block n, counted as an attention and an MLP layer both."""
    if arch == "lfm2":
        return _lfm2_hparams(w, hp, ftype)
    if arch == "lfm2moe":
        return _lfm2moe_hparams(w, hp, ftype)
    pattern = hp["hybrid_override_pattern"]
    n = len(pattern) + mtp_layers
    attn = [i for i, c in enumerate(pattern) if c == "*"] + list(range(len(pattern), n))
    moe = arch == "nemotron_h_moe"
    mlp = [i for i, c in enumerate(pattern) if c == ("E" if moe else "-")]
    mlp += list(range(len(pattern), n))
    head_dim = hp["head_dim"]  # GraniteModel pops it; NemotronHModel kept it aside
    # TextModel.set_gguf_parameters
    w.add_block_count(n)
    w.add_embedding_length(hp["hidden_size"])
    w.add_head_count(hp["num_attention_heads"])
    if "rms_norm_eps" in hp:
        w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_layer_norm_eps(hp["layer_norm_epsilon"])
    w.add_file_type(ftype)
    # LlamaModel.set_gguf_parameters: head_dim popped, so hidden / heads
    w.add_vocab_size(hp["vocab_size"])
    w.add_rope_dimension_count(hp["hidden_size"] // hp["num_attention_heads"])
    # GraniteHybridModel.set_gguf_parameters (d_inner: NemotronHModel's num_heads * head_dim)
    w.add_ssm_conv_kernel(hp["conv_kernel"])
    w.add_ssm_state_size(hp["ssm_state_size"])
    w.add_ssm_group_count(hp["n_groups"])
    w.add_ssm_inner_size(hp["mamba_num_heads"] * hp["mamba_head_dim"])
    w.add_ssm_time_step_rank(hp["mamba_num_heads"])
    w.add_head_count_kv([hp["num_key_value_heads"] if i in attn else 0 for i in range(n)])
    w.add_rope_scaling_finetuned(False)  # no RoPE
    w.add_context_length(2**20)  # instead of TextModel's max_position_embeddings
    # NemotronHModel.set_gguf_parameters
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    ff = hp["moe_intermediate_size" if moe else "intermediate_size"]
    w.add_feed_forward_length([ff if i in mlp else 0 for i in range(n)])
    if moe:
        w.add_expert_used_count(hp["num_experts_per_tok"])
        w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(hp["moe_shared_expert_intermediate_size"])
        w.add_expert_count(hp["n_routed_experts"])
        w.add_expert_shared_count(hp["n_shared_experts"])
        w.add_expert_weights_norm(hp["norm_topk_prob"])
        w.add_expert_weights_scale(hp["routed_scaling_factor"])
        w.add_expert_group_count(hp["n_group"])
        if hp.get("moe_latent_size") is not None:
            w.add_moe_latent_size(hp["moe_latent_size"])
    if mtp_layers:
        w.add_nextn_predict_layers(hp["num_nextn_predict_layers"])


def _lfm2_hparams(w, hp: dict, ftype) -> None:
    # LFM2Model.set_gguf_parameters, then TextModel.set_gguf_parameters
    kv = [hp["num_key_value_heads"] if t != "conv" else 0 for t in hp["layer_types"]]
    w.add_block_count(hp["num_hidden_layers"])
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(hp["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(hp["norm_eps"])
    w.add_file_type(ftype)
    w.add_vocab_size(hp["vocab_size"])
    w.add_shortconv_l_cache(hp["conv_L_cache"])
    # LFM2Model._add_feed_forward_length: rounds up to block_multiple_of even without a multiplier
    ff = hp["intermediate_size"]
    if hp["block_auto_adjust_ff_dim"]:
        ff = int(2 * ff / 3)
        if hp["block_ffn_dim_multiplier"] is not None:
            ff = int(hp["block_ffn_dim_multiplier"] * ff)
        ff = hp["block_multiple_of"] * (
            (ff + hp["block_multiple_of"] - 1) // hp["block_multiple_of"]
        )
    w.add_feed_forward_length(ff)


def _lfm2moe_hparams(w, hp: dict, ftype) -> None:
    import gguf

    # TextModel.set_gguf_parameters over LFM2MoeModel's per-layer head_count_kv (full_attention
    # layers only); rope_type "default" writes no scaling keys, only the base
    kv = [hp["num_key_value_heads"] if t == "full_attention" else 0 for t in hp["layer_types"]]
    w.add_block_count(hp["num_hidden_layers"])
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(hp["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(hp["norm_eps"])
    w.add_expert_count(hp["num_experts"])
    w.add_expert_used_count(hp["num_experts_per_tok"])
    w.add_file_type(ftype)
    # LFM2MoeModel.set_gguf_parameters
    w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
    w.add_leading_dense_block_count(hp["num_dense_layers"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_vocab_size(hp["vocab_size"])
    w.add_shortconv_l_cache(hp["conv_L_cache"])


def _lfm2moe_experts(name: str, t: torch.Tensor, bid: int):
    """LFM2MoeModel.modify_tensors' stacked experts (its names without `model.`), or None."""
    base = f"layers.{bid}.feed_forward.experts"
    if name.endswith(".feed_forward.experts.gate_up_proj"):
        n_ff = t.shape[1] // 2
        return [(f"{base}.w1.weight", t[:, :n_ff]), (f"{base}.w3.weight", t[:, n_ff:])]
    if name.endswith(".feed_forward.experts.down_proj"):
        return [(f"{base}.w2.weight", t)]
    return None


def _permute(w: torch.Tensor, n_head: int, n_head_kv: int | None) -> torch.Tensor:
    # conversion/llama.py LlamaModel.permute, verbatim in effect
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def converted(state: dict, hp: dict, arch: str, tensor_map):
    """(llama.cpp name, float32 tensor) of each HF tensor, as modify_tensors yields them."""
    if arch.startswith("nemotron_h"):
        pattern = hp["hybrid_override_pattern"]
        d_inner = hp["mamba_num_heads"] * hp["mamba_head_dim"]
    for name, t in state.items():
        if name == "lm_head.weight" and hp["tie_word_embeddings"]:
            continue  # save_pretrained leaves the tied head out
        t = t.detach().float().clone()
        if arch.startswith("lfm2"):  # LFM2Model / LFM2MoeModel.modify_tensors
            if "conv.conv" in name:
                t = t.squeeze(1)
            if name.endswith(".expert_bias"):  # LFM2MoeModel.filter_tensors
                name += ".bias"
            bid = int(name.split(".")[2]) if name.startswith("model.layers.") else None
            experts = _lfm2moe_experts(name, t, bid) if bid is not None else None
            for hf_name, data in experts or [(name, t)]:
                new_name = tensor_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
                assert new_name is not None, f"the converter cannot map {hf_name}"
                yield new_name, data.contiguous()
            continue
        # the names transformers' save_pretrained writes (NVIDIA's too): backbone.*
        if name.startswith("model."):
            name = "backbone." + name.removeprefix("model.")
        parts = name.split(".")
        bid = int(parts[2]) if parts[1] == "layers" else None
        kind = pattern[bid] if bid is not None else None
        if kind == "E":  # NemotronHModel.modify_tensors (is_moe), then ModelBase's renaming
            if name.endswith(("mixer.experts.up_proj", "mixer.experts.down_proj")):
                proj = name.rpartition(".")[2]  # the per-expert tensors, stacked
                name = f"model.layers.{bid}.mlp.experts.{proj}.weight"
            name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        if kind == "M":  # Mamba2Model.modify_tensors
            if name.endswith(".dt_bias"):
                name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
            new_name = tensor_map.get_name(name, try_suffixes=(".weight", ".bias"))
            if new_name == f"blk.{bid}.ssm_conv1d.weight":
                t = t.squeeze()
            elif new_name in (f"blk.{bid}.ssm_a", f"blk.{bid}.ssm_d"):
                t = t.reshape((*t.shape, 1))
            elif new_name == f"blk.{bid}.ssm_norm.weight":
                t = t.reshape((hp["n_groups"], d_inner // hp["n_groups"]))
            if name.endswith(".A_log"):
                t = -torch.exp(t)
            yield new_name, t
            continue
        if kind == "*":  # GraniteMoeModel -> LlamaModel.modify_tensors (undo_permute)
            n_head, n_kv = hp["num_attention_heads"], hp["num_key_value_heads"]
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                t = _permute(t, n_head, n_head)
            if name.endswith(("k_proj.weight", "k_proj.bias")):
                t = _permute(t, n_head, n_kv)
        new_name = tensor_map.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new_name is not None, f"the converter cannot map {name}"
        yield new_name, t


# NemotronHModel._MTP_SPECIAL_RENAMES, then the tensor map's names for the folded block
_MTP_NAMES = {
    "mtp.layers.0.enorm.weight": "nextn.enorm.weight",
    "mtp.layers.0.hnorm.weight": "nextn.hnorm.weight",
    "mtp.layers.0.eh_proj.weight": "nextn.eh_proj.weight",
    "mtp.layers.0.norm.weight": "attn_norm.weight",
    "mtp.layers.0.mixer.q_proj.weight": "attn_q.weight",
    "mtp.layers.0.mixer.k_proj.weight": "attn_k.weight",
    "mtp.layers.0.mixer.v_proj.weight": "attn_v.weight",
    "mtp.layers.0.mixer.o_proj.weight": "attn_output.weight",
    "mtp.layers.1.norm.weight": "post_attention_norm.weight",
    "mtp.layers.1.mixer.gate.weight": "ffn_gate_inp.weight",
    "mtp.layers.1.mixer.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mtp.layers.1.mixer.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mtp.layers.1.mixer.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "mtp.layers.1.final_layernorm.weight": "nextn.shared_head_norm.weight",
}


def converted_mtp(mtp: dict, hp: dict):
    """(llama.cpp name, float32 tensor) of Nemotron-3's `mtp.layers.{0,1}.*` as
    NemotronHModel.modify_tensors writes them: folded into block n (the pattern's length), q / k
    permuted as LlamaModel's (the attention's names end in q_proj / k_proj), the per-expert
    tensors stacked into ffn_up_exps / ffn_down_exps."""
    bid = len(hp["hybrid_override_pattern"])
    n_head, n_kv = hp["num_attention_heads"], hp["num_key_value_heads"]
    experts: dict[str, dict[int, torch.Tensor]] = {}
    for name, t in mtp.items():
        t = t.detach().float().clone()
        parts = name.split(".")
        if parts[3:5] == ["mixer", "experts"]:
            experts.setdefault(parts[6], {})[int(parts[5])] = t
            continue
        if name.endswith("q_proj.weight"):
            t = _permute(t, n_head, n_head)
        elif name.endswith("k_proj.weight"):
            t = _permute(t, n_head, n_kv)
        yield f"blk.{bid}.{_MTP_NAMES[name]}", t
    for proj, by_id in experts.items():
        kind = "up" if proj == "up_proj" else "down"
        yield f"blk.{bid}.ffn_{kind}_exps.weight", torch.stack([by_id[j] for j in sorted(by_id)])
