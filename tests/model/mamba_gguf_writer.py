"""llama.cpp's converter for the pure state-space models, transcribed on its own (without radixlm's
loader) for the tests: conversion/mamba.py MambaModel (`mamba`: MambaForCausalLM and
FalconMambaForCausalLM) and Mamba2Model (`mamba2`). It reads what the converter reads: config.json
and the saved safetensors; --outtype "f32" or "q8_0" (hybrid_checkpoints._stored)."""

from __future__ import annotations

import json
import os
import re

import gguf
import torch

from tests.model.hybrid_checkpoints import _add_vocab, _stored

FTYPES = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}


def _header(w, hp: dict, mamba2: bool, ftype) -> None:
    d_model = hp["hidden_size"]
    d_inner = hp.get("intermediate_size") or hp["expand"] * d_model
    w.add_context_length(2**20)
    w.add_embedding_length(d_model)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(hp["num_hidden_layers"])
    w.add_ssm_conv_kernel(hp["conv_kernel"])
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(hp["state_size"])
    if mamba2:  # Mamba2Model.set_gguf_parameters
        w.add_ssm_time_step_rank(d_inner // hp["head_dim"])
        w.add_ssm_group_count(hp["n_groups"])
        w.add_layer_norm_rms_eps(hp["layer_norm_epsilon"])
    else:  # MambaModel.set_gguf_parameters
        w.add_ssm_time_step_rank(hp["time_step_rank"])
        w.add_layer_norm_rms_eps(hp["layer_norm_epsilon"])
        w.add_ssm_dt_b_c_rms(hp["model_type"] == "falcon_mamba")
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _converted(name: str, t: torch.Tensor, hp: dict, mamba2: bool, tmap):
    """(llama.cpp name, tensor) as the model class's filter_tensors / modify_tensors give them."""
    if mamba2 and name.endswith(".dt_bias"):  # Mamba2Model.filter_tensors
        name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
    new_name = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
    assert new_name is not None, f"the converter cannot map {name}"
    if ".ssm_conv1d." in new_name:
        t = t.squeeze()
    elif mamba2 and new_name.endswith((".ssm_a", ".ssm_d")):
        t = t.reshape((*t.shape, 1))
    elif mamba2 and new_name.endswith(".ssm_norm.weight"):
        g = hp["n_groups"]
        t = t.reshape((g, t.shape[0] // g))
    if name.endswith(".A_log"):
        t = -torch.exp(t)
    return new_name, t


def write_mamba_gguf(src: str, path: str, qtype: str = "f32") -> str:
    """src's checkpoint as the converter writes it (`mamba2` for Mamba2ForCausalLM, else
    `mamba`) with --outtype qtype."""
    from safetensors.torch import load_file

    with open(os.path.join(src, "config.json")) as f:
        hp = json.load(f)
    mamba2 = hp["model_type"] == "mamba2"
    arch = gguf.MODEL_ARCH.MAMBA2 if mamba2 else gguf.MODEL_ARCH.MAMBA
    ftype = FTYPES[qtype]
    pad = 16 if mamba2 else 8  # set_vocab: the vocabulary padded to a multiple
    vocab = -(hp["vocab_size"] // -pad) * pad
    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    w.add_type(gguf.GGUFType.MODEL)
    _header(w, hp, mamba2, ftype)
    _add_vocab(w, src, vocab, "qwen2")
    tmap = gguf.get_tensor_name_map(arch, hp["num_hidden_layers"])
    state = load_file(os.path.join(src, "model.safetensors"))
    embd = state.get("backbone.embeddings.weight")
    for name, t in state.items():
        if not mamba2 and name == "lm_head.weight" and torch.equal(t, embd):
            continue  # MambaModel: an output equal to token_embd is omitted
        new_name, data = _converted(name, t.float(), hp, mamba2, tmap)
        raw, kind = _stored(new_name, data, ftype, arch)
        w.add_tensor(new_name, raw, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_jamba_gguf(src: str, path: str, qtype: str = "f32") -> str:
    """src's JambaForCausalLM as conversion/jamba.py JambaModel writes it: the attention layers as
    head_count_kv entries, the experts stacked per projection (transformers 5's stacked gate_up_proj
    split first, as a 4.x checkpoint names them per expert), A_log as -exp(A_log), the conv
    squeezed. (The vocabulary as a BPE one: the converter's llama-hf vocabulary path needs a
    SentencePiece-like tokenizer the tiny one is not; the tokens are the same.)"""
    from safetensors.torch import load_file

    with open(os.path.join(src, "config.json")) as f:
        hp = json.load(f)
    n, hidden = hp["num_hidden_layers"], hp["hidden_size"]
    off, period = hp["attn_layer_offset"], hp["attn_layer_period"]
    kv = [
        hp["num_key_value_heads"] if i >= off and (i - off) % period == 0 else 0 for i in range(n)
    ]
    ftype = FTYPES[qtype]
    arch = gguf.MODEL_ARCH.JAMBA
    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    w.add_type(gguf.GGUFType.MODEL)
    w.add_block_count(n)
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(kv)
    w.add_ssm_conv_kernel(hp["mamba_d_conv"])
    w.add_ssm_inner_size(hp["mamba_expand"] * hidden)
    w.add_ssm_state_size(hp["mamba_d_state"])
    w.add_ssm_time_step_rank(hp["mamba_dt_rank"])
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_expert_count(hp["num_experts"])
    w.add_expert_used_count(hp["num_experts_per_tok"])
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_vocab(w, src, hp["vocab_size"], "qwen2")
    tmap = gguf.get_tensor_name_map(arch, n)
    for name, t in _stacked_experts(load_file(os.path.join(src, "model.safetensors"))).items():
        for new_name, data in _jamba_converted(name, t.float(), hp, tmap):
            raw, kind = _stored(new_name, data, ftype, arch)
            w.add_tensor(new_name, raw, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _jamba_converted(name: str, t: torch.Tensor, hp: dict, tmap):
    if name.endswith("feed_forward.experts.gate_up_proj"):  # [E, 2I, H]: 4.x's gate / up stacked
        base = name.removesuffix("feed_forward.experts.gate_up_proj")
        gate, up = t.split(hp["intermediate_size"], dim=1)
        yield tmap.get_name(base + "mlp.experts.gate_proj.weight", (".weight",)), gate
        yield tmap.get_name(base + "mlp.experts.up_proj.weight", (".weight",)), up
        return
    if name.endswith("feed_forward.experts.down_proj"):
        base = name.removesuffix("feed_forward.experts.down_proj")
        yield tmap.get_name(base + "mlp.experts.down_proj.weight", (".weight",)), t
        return
    new_name = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
    assert new_name is not None, f"the converter cannot map {name}"
    if ".ssm_conv1d." in new_name:
        t = t.squeeze()
    if name.endswith(".A_log"):
        t = -torch.exp(t)
    yield new_name, t


_PER_EXPERT = re.compile(r"^(.*\.feed_forward\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def _stacked_experts(state: dict) -> dict:
    """Per-expert tensors (4.x's names) stacked per projection as the converter stacks them, under
    transformers 5's stacked names (gate and up as one gate_up_proj)."""
    out, experts = {}, {}
    for name, t in state.items():
        m = _PER_EXPERT.match(name)
        if m is None:
            out[name] = t
        else:
            experts.setdefault(m.group(1), {}).setdefault(m.group(3), {})[int(m.group(2))] = t
    for base, projs in experts.items():
        stack = {p: torch.stack([e[i] for i in sorted(e)]) for p, e in projs.items()}
        out[base + ".gate_up_proj"] = torch.cat([stack["gate"], stack["up"]], dim=1)
        out[base + ".down_proj"] = stack["down"]
    return out
