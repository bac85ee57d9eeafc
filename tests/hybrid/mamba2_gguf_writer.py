"""llama.cpp's converters for `granitehybrid` (Granite-4.0-H) and `falcon-h1`, transcribed on their
own (without radixlm's loader) for the tests: conversion/granite.py GraniteHybridModel over
Mamba2Model (conversion/mamba.py), GraniteMoeModel, GraniteModel, LlamaModel and TextModel
(conversion/base.py); conversion/falcon_h1.py FalconH1Model over Mamba2Model.

It reads what the converter reads: config.json and the saved safetensors (input_linear /
output_linear / router.layer names). Granite's own configs name the layers "mamba" / "attention";
transformers 5.x's save_pretrained writes "linear_attention" / "full_attention": both are read.
Keys the converter writes twice (head_count_kv, context_length) are written once, the later value.
"""

from __future__ import annotations

import json
import os

import torch

from tests.model.hybrid_checkpoints import _add_vocab, _stored, dequantized_as_q8_0


def _hparams(src: str) -> dict:
    with open(os.path.join(src, "config.json")) as f:
        return json.load(f)


def _permute(w: torch.Tensor, n_head: int, n_head_kv: int | None) -> torch.Tensor:
    # conversion/llama.py LlamaModel.permute
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_granite_gguf(src: str, path: str, qtype: str = "f32") -> str:
    """The granitehybrid file of src, its tensors as the converter's --outtype qtype ("f32" or
    "q8_0") stores them (hybrid_checkpoints._stored)."""
    import gguf
    from safetensors.torch import load_file

    hp = _hparams(src)
    n = hp["num_hidden_layers"]
    attn = [i for i, t in enumerate(hp["layer_types"]) if t in ("attention", "full_attention")]
    ssm = [i for i in range(n) if i not in attn]
    has_experts = bool(hp.get("num_local_experts"))
    use_rope = not ssm  # GraniteHybridModel: RoPE for Bamba or non-hybrid models only
    hidden, heads, kv = hp["hidden_size"], hp["num_attention_heads"], hp["num_key_value_heads"]
    d_inner = hp["mamba_expand"] * hidden
    vocab = -(hp["vocab_size"] // -8) * 8  # Mamba2Model.set_vocab: padded to a multiple of 8
    w = gguf.GGUFWriter(path, "granitehybrid")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("tiny-granitehybrid")
    # TextModel.set_gguf_parameters (head_dim popped by GraniteModel)
    w.add_block_count(n)
    w.add_context_length(hp["max_position_embeddings"] if use_rope else 2**20)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv([kv if i in attn else 0 for i in range(n)])  # the hybrid's, later
    if (hp.get("rope_parameters") or {}).get("rope_theta") is not None:
        w.add_rope_freq_base(hp["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_expert_count(hp["num_local_experts"])
    w.add_expert_used_count(hp["num_experts_per_tok"])
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype]
    w.add_file_type(ftype)
    # LlamaModel, GraniteModel, GraniteMoeModel
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(hidden // heads)
    w.add_attention_scale(hp["attention_multiplier"])
    w.add_embedding_scale(hp["embedding_multiplier"])
    w.add_residual_scale(hp["residual_multiplier"])
    w.add_logit_scale(hp["logits_scaling"])
    w.add_expert_shared_feed_forward_length(hp["shared_intermediate_size"])
    # GraniteHybridModel
    w.add_ssm_conv_kernel(hp["mamba_d_conv"])
    w.add_ssm_state_size(hp["mamba_d_state"])
    w.add_ssm_group_count(hp["mamba_n_groups"])
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_time_step_rank(hp["mamba_n_heads"])
    w.add_rope_scaling_finetuned(use_rope)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_vocab(w, src, vocab, "qwen2")
    arch = gguf.MODEL_ARCH.GRANITE_HYBRID
    tmap = gguf.get_tensor_name_map(arch, n)
    for name, t in load_file(os.path.join(src, "model.safetensors")).items():
        for new_name, data in _converted(name, t.float(), hp, ssm, has_experts, tmap):
            raw, kind = _stored(new_name, data, ftype, arch)
            w.add_tensor(new_name, raw, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _converted(name: str, t: torch.Tensor, hp: dict, ssm: list[int], has_experts: bool, tmap):
    """(llama.cpp name, tensor) as GraniteHybridModel.modify_tensors yields them."""
    if name.endswith(".dt_bias"):  # Mamba2Model.filter_tensors
        name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
    parts = name.split(".")
    bid = int(parts[2]) if parts[1] == "layers" else None
    mapped = lambda n: tmap.get_name(n, try_suffixes=(".weight", ".bias"))
    if name.endswith("block_sparse_moe.input_linear.weight"):  # GraniteMoeModel
        gate, up = t.split(hp["intermediate_size"], dim=-2)
        yield f"blk.{bid}.ffn_gate_exps.weight", gate
        yield f"blk.{bid}.ffn_up_exps.weight", up
        return
    if name.endswith("shared_mlp.input_linear.weight"):
        gate, up = t.split(hp["shared_intermediate_size"], dim=-2)
        kind = "shexp" if has_experts else ""
        yield f"blk.{bid}.ffn_gate{'_' + kind if kind else ''}.weight", gate
        yield f"blk.{bid}.ffn_up{'_' + kind if kind else ''}.weight", up
        return
    if name.endswith("shared_mlp.output_linear.weight") and not has_experts:
        yield f"blk.{bid}.ffn_down.weight", t
        return
    new_name = mapped(name)
    assert new_name is not None, f"the converter cannot map {name}"
    if bid in ssm:  # Mamba2Model.modify_tensors
        if new_name == f"blk.{bid}.ssm_conv1d.weight":
            t = t.squeeze()
        elif new_name in (f"blk.{bid}.ssm_a", f"blk.{bid}.ssm_d"):
            t = t.reshape((*t.shape, 1))
        elif new_name == f"blk.{bid}.ssm_norm.weight":
            g = hp["mamba_n_groups"]
            t = t.reshape((g, hp["mamba_expand"] * hp["hidden_size"] // g))
        if name.endswith(".A_log"):
            t = -torch.exp(t)
    elif bid is not None:  # LlamaModel.modify_tensors (undo_permute)
        heads, kv = hp["num_attention_heads"], hp["num_key_value_heads"]
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            t = _permute(t, heads, heads)
        if name.endswith(("k_proj.weight", "k_proj.bias")):
            t = _permute(t, heads, kv)
    yield new_name, t


# FalconH1Model.modify_tensors: the multipliers folded into each tensor, by the first name part
# found, one float32 product after the other in the converter's order (what it rounds next)
_FALCON_H1_FACTORS = (
    ("down_proj", lambda hp: [hp["mlp_multipliers"][1]]),
    ("gate_proj", lambda hp: [hp["mlp_multipliers"][0]]),
    ("k_proj", lambda hp: [hp["key_multiplier"], hp["attention_in_multiplier"]]),
    ("q_proj", lambda hp: [hp["attention_in_multiplier"]]),
    ("v_proj", lambda hp: [hp["attention_in_multiplier"]]),
    ("o_proj", lambda hp: [hp["attention_out_multiplier"]]),
    ("out_proj", lambda hp: [hp["ssm_out_multiplier"]]),
    ("in_proj", lambda hp: [hp["ssm_in_multiplier"]]),
    ("lm_head", lambda hp: [hp["lm_head_multiplier"]]),
    ("embed_tokens", lambda hp: [hp["embedding_multiplier"]]),
)
# the multipliers HF applies at run time that the file holds in its weights (HF's defaults: 1)
FALCON_H1_MULTIPLIERS = (
    "embedding_multiplier",
    "lm_head_multiplier",
    "key_multiplier",
    "attention_in_multiplier",
    "attention_out_multiplier",
    "ssm_in_multiplier",
    "ssm_out_multiplier",
    "ssm_multipliers",
    "mlp_multipliers",
)


def falcon_h1_folded(name: str, t: torch.Tensor, hp: dict) -> torch.Tensor:
    """HF tensor `name` of a FalconH1ForCausalLM (float32) with its muP multipliers folded in, as
    FalconH1Model.modify_tensors folds them: a new tensor; in_proj's rows (z, x, B, C, dt) then
    times ssm_multipliers part by part."""
    for factor in next((f(hp) for part, f in _FALCON_H1_FACTORS if part in name), []):
        t = t * factor
    if "in_proj" in name:
        d, gs = hp["mamba_d_ssm"], hp["mamba_n_groups"] * hp["mamba_d_state"]
        bounds = [0, d, 2 * d, 2 * d + gs, 2 * d + 2 * gs, t.shape[0]]
        for k, factor in enumerate(hp["ssm_multipliers"]):
            t[bounds[k] : bounds[k + 1]] *= factor
    return t


def falcon_h1_as_stored(hf, qtype: str = "q8_0"):
    """HF FalconH1ForCausalLM holding what write_falcon_h1_gguf(qtype) stores: every multiplier
    folded into the weights (falcon_h1_folded) and set to 1 in the config, as the file's loader
    reads it; then each weight rounded as the file stores it (hybrid_checkpoints.
    dequantized_as_q8_0: the converter's fold comes before its rounding)."""
    import copy

    import transformers

    hp = hf.config.to_dict()
    cfg = copy.deepcopy(hf.config)
    for key in FALCON_H1_MULTIPLIERS:
        ones = [1.0] * len(hp[key]) if isinstance(hp[key], list) else 1.0
        setattr(cfg, key, ones)
    held = transformers.FalconH1ForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():
        state = {n: falcon_h1_folded(n, t.float(), hp) for n, t in hf.state_dict().items()}
    held.load_state_dict(state)
    if qtype == "f32":
        return held.eval()
    if qtype != "q8_0":
        raise ValueError(f"falcon_h1_as_stored: qtype {qtype!r} is not f32 or q8_0")
    return dequantized_as_q8_0(held)


def write_falcon_h1_gguf(src: str, path: str, qtype: str = "f32") -> str:
    """The falcon-h1 file of a FalconH1ForCausalLM directory, its tensors as the converter's
    --outtype qtype ("f32" or "q8_0") stores them (hybrid_checkpoints._stored). head_dim: the
    config's, or hidden / heads (transformers 5.x does not save one; Falcon's own configs do)."""
    import gguf
    from safetensors.torch import load_file

    hp = _hparams(src)
    n, hidden, heads = hp["num_hidden_layers"], hp["hidden_size"], hp["num_attention_heads"]
    d_inner = hp["mamba_d_ssm"]
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype]
    w = gguf.GGUFWriter(path, "falcon-h1")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("tiny-falcon-h1")
    # Mamba2Model.set_gguf_parameters, then FalconH1Model's (the later value of a key kept)
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(heads)
    w.add_block_count(n)
    w.add_ssm_conv_kernel(hp["mamba_d_conv"])
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(hp["mamba_d_state"])
    w.add_ssm_time_step_rank(d_inner // hp["mamba_d_head"])
    w.add_ssm_group_count(hp["mamba_n_groups"])
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_file_type(ftype)
    w.add_vocab_size(hp["vocab_size"])
    w.add_head_count_kv(hp["num_key_value_heads"])
    w.add_key_length(hp.get("head_dim") or hidden // heads)
    w.add_value_length(hp.get("head_dim") or hidden // heads)
    w.add_rope_freq_base(hp["rope_parameters"]["rope_theta"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_vocab(w, src, hp["vocab_size"], "qwen2")  # _set_vocab_gpt2: not padded
    arch = gguf.MODEL_ARCH.FALCON_H1
    tmap = gguf.get_tensor_name_map(arch, n)
    for name, t in load_file(os.path.join(src, "model.safetensors")).items():
        t = t.float()
        if name.endswith(".dt_bias"):  # Mamba2Model.filter_tensors
            name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
        new_name = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new_name is not None, f"the converter cannot map {name}"
        if ".ssm_conv1d." in new_name:  # Mamba2Model.modify_tensors
            t = t.squeeze()
        elif new_name.endswith((".ssm_a", ".ssm_d")):
            t = t.reshape((*t.shape, 1))
        elif ".ssm_norm." in new_name:
            t = t.reshape((hp["mamba_n_groups"], d_inner // hp["mamba_n_groups"]))
        if name.endswith(".A_log"):
            t = -torch.exp(t)
        raw, kind = _stored(new_name, falcon_h1_folded(name, t, hp), ftype, arch)
        w.add_tensor(new_name, raw, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
