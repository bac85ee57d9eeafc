"""The kimi-linear GGUF file of a Kimi-Linear checkpoint directory (float32), as llama.cpp's
converter writes it, transcribed on its own without radixlm's loader: conversion/base.py
TextModel.set_gguf_parameters and conversion/kimi_linear.py KimiLinearModel (set_gguf_parameters,
modify_tensors), gguf's TensorNameMap for the names. The directory's config.json must be Moonshot's
form (kimi_linear_checkpoint.as_moonshot_config), as the converter reads it; the vocabulary is
_set_vocab_gpt2's (tests/model/hybrid_checkpoints._add_vocab)."""

from __future__ import annotations

import json
import os

import torch

from tests.model.hybrid_checkpoints import (
    _add_vocab,
    _stored,
    dequantized_as_q8_0,
    q8_0_round_trip,
)

ARCH = "kimi-linear"


def write_kimi_linear_gguf(src: str, path: str, qtype: str = "f32") -> str:
    """The file at path, its tensors as the converter's --outtype qtype ("f32" or "q8_0") stores
    them (tests/model/hybrid_checkpoints._stored: the converter's F32 list, F16 for rows that are
    no multiple of 32)."""
    import gguf
    from safetensors.torch import load_file

    with open(os.path.join(src, "config.json")) as f:
        hp = json.load(f)
    n, la = hp["num_hidden_layers"], hp["linear_attn_config"]
    w = gguf.GGUFWriter(path, ARCH)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("tiny-kimi-linear")
    # TextModel.set_gguf_parameters (num_key_value_heads already set to 1 by KimiLinearModel)
    w.add_block_count(n)
    w.add_context_length(hp["model_max_length"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_expert_count(hp["num_experts"])
    w.add_expert_used_count(hp["num_experts_per_token"])
    if hp.get("n_group") is not None:  # Moonshot's num_expert_group is not read
        w.add_expert_group_count(hp["n_group"])
    if hp.get("topk_group") is not None:
        w.add_expert_group_used_count(hp["topk_group"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)  # moe_router_activation_func
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype]
    w.add_file_type(ftype)
    # KimiLinearModel.set_gguf_parameters
    w.add_vocab_size(hp["vocab_size"])
    w.add_head_count_kv([1 if i + 1 in la["full_attn_layers"] else 0 for i in range(n)])
    w.add_ssm_conv_kernel(la["short_conv_kernel_size"])
    w.add_kda_head_dim(la["head_dim"])
    if hp.get("q_lora_rank") is not None:
        w.add_q_lora_rank(hp["q_lora_rank"])
    rank, rope = hp["kv_lora_rank"], hp["qk_rope_head_dim"]
    w.add_kv_lora_rank(rank)
    w.add_rope_dimension_count(rope)
    w.add_key_length(rank + rope)
    w.add_key_length_mla(hp["qk_nope_head_dim"] + rope)
    w.add_value_length_mla(hp["v_head_dim"])
    w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
    w.add_expert_shared_count(hp["num_shared_experts"])
    w.add_leading_dense_block_count(hp["first_k_dense_replace"])
    w.add_expert_weights_scale(hp["routed_scaling_factor"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_vocab(w, src, hp["vocab_size"], "qwen2")
    arch = gguf.MODEL_ARCH.KIMI_LINEAR
    tmap = gguf.get_tensor_name_map(arch, n)
    state = load_file(os.path.join(src, "model.safetensors"))
    for name, t in _modified(state, hp):
        if name.endswith("e_score_correction_bias"):  # ModelBase's rename
            name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        new = name if name.startswith("blk.") else tmap.get_name(name, (".weight", ".bias"))
        assert new is not None, f"the converter cannot map {name}"
        raw, kind = _stored(new, t.float(), ftype, arch)
        w.add_tensor(new, raw, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _modified(state: dict, hp: dict):
    """KimiLinearModel.modify_tensors: convs [C, 1, K] -> [1, C, 1, K], A_log -> -exp(A_log),
    dt_bias -> dt_proj.bias, each layer's experts stacked, kv_b_proj split per head."""
    experts: dict[int, dict[str, torch.Tensor]] = {}
    for name, t in state.items():
        if name.endswith((".q_conv1d.weight", ".k_conv1d.weight", ".v_conv1d.weight")):
            t = t.reshape(1, t.shape[0], 1, t.shape[-1])
        if name.endswith(".A_log"):
            t = -torch.exp(t)
        if name.endswith(".dt_bias"):
            name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
        if "block_sparse_moe.experts" in name:
            bid = int(name.split(".")[2])
            experts.setdefault(bid, {})[name] = t
            if len(experts[bid]) == 3 * hp["num_experts"]:
                for wid, gname in (("w1", "gate"), ("w2", "down"), ("w3", "up")):
                    parts = [
                        experts[bid][
                            f"model.layers.{bid}.block_sparse_moe.experts.{x}.{wid}.weight"
                        ]
                        for x in range(hp["num_experts"])
                    ]
                    yield f"blk.{bid}.ffn_{gname}_exps.weight", torch.stack(parts)
            continue
        if name.endswith("kv_b_proj.weight"):
            heads, v, nope = hp["num_attention_heads"], hp["v_head_dim"], hp["qk_nope_head_dim"]
            k_b, v_b = t.view(heads, v + nope, t.shape[-1]).split([nope, v], dim=1)
            yield name.replace("kv_b_proj", "k_b_proj"), k_b.transpose(1, 2)
            yield name.replace("kv_b_proj", "v_b_proj"), v_b
            continue
        yield name, t


def dequantized_as_stored(hf):
    """A copy of hf holding the weights its Q8_0 file stores, dequantized (the reference of the
    quantized file, bit for bit: radixlm with float activations answers it exactly):
    hybrid_checkpoints.dequantized_as_q8_0, the router kept float32 as the converter keeps it, and
    MLA's kv_b_proj rounded as stored: split, k_b transposed per head ([rank, nope]), v_b as is."""
    held = dequantized_as_q8_0(hf, kept_float=("mlp.gate.weight",))
    c = held.config
    with torch.no_grad():
        for (name, p), (_, src) in zip(held.named_parameters(), hf.named_parameters()):
            if name.endswith("kv_b_proj.weight"):
                nope = c.qk_nope_head_dim
                w = src.view(c.num_attention_heads, nope + c.v_head_dim, -1)
                k_b = q8_0_round_trip(w[:, :nope].transpose(1, 2).contiguous()).transpose(1, 2)
                v_b = q8_0_round_trip(w[:, nope:].contiguous())
                p.copy_(torch.cat([k_b, v_b], dim=1).reshape(p.shape))
    return held
