"""A tiny random-weight Kimi-Linear checkpoint (HF KimiLinearForCausalLM, float32): KDA, MLA (no
RoPE) and MoE layers, saved with save_pretrained (Moonshot's tensor names) beside the tiny
tokenizer of tests/model/hybrid_checkpoints.py. Weights are drawn as hybrid_checkpoints.hf_model
draws them (randomize: norms around 1; bf16-rounded), A_log as log(U(1, 16)) and dt_bias as HF's
init (softplus(dt_bias) in [1e-3, 0.1]), the router's e_score_correction_bias nonzero."""

from __future__ import annotations

import json
import math
import os
import re

import torch
import transformers

from tests.model.helpers import randomize
from tests.model.hybrid_checkpoints import RESIDUAL_WRITERS

ARCH = "kimi-linear"  # llama.cpp's name
CONFIG = dict(
    hidden_size=64,
    num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
    mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
    intermediate_size=96,
    # MLA: as Kimi-Linear, no q LoRA; a decoupled key part that nothing rotates
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=32,
    q_lora_rank=None,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    # KDA
    linear_num_heads=4,
    linear_head_dim=16,
    linear_conv_kernel_dim=4,
    # DeepSeek-V3 routing over 2 groups (one chosen), a shared expert
    num_local_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_shared_experts=1,
    n_group=2,
    topk_group=1,
    routed_scaling_factor=2.446,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)


def hf_model(tokenizer, seed: int = 0, scaled_residual: bool = False, **changes):
    """scaled_residual: GPT-2's init of the residual writers (hybrid_checkpoints.hf_model)."""
    cfg = transformers.KimiLinearConfig(
        **{
            **CONFIG,
            "vocab_size": len(tokenizer),
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": None,
            **changes,
        }
    )
    cfg.architectures = ["KimiLinearForCausalLM"]
    torch.manual_seed(seed)
    hf = transformers.KimiLinearForCausalLM(cfg).to(torch.float32)
    randomize(hf)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in [*hf.named_parameters(), *hf.named_buffers()]:
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty(p.shape).uniform_(1, 16, generator=g)))
            if name.endswith("dt_bias"):  # HF's init: the inverse softplus of U(1e-3, 0.1)
                dt = torch.exp(torch.empty(p.shape).uniform_(math.log(1e-3), math.log(0.1)))
                p.copy_(dt + torch.log(-torch.expm1(-dt)))
            if name.endswith("e_score_correction_bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            if name == "lm_head.weight":  # logits of a real model's spread: top-1 far from ties
                p.mul_(8)
            if scaled_residual and name.endswith(RESIDUAL_WRITERS):
                p.mul_((2 * cfg.num_hidden_layers) ** -0.5)
            p.copy_(p.bfloat16().float())
    return hf.eval()


def checkpoint(path: str, tokenizer, **changes):
    """(path, hf model): the model saved with save_pretrained beside its tokenizer."""
    hf = hf_model(tokenizer, **changes)
    hf.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, hf


def as_moonshot_checkpoint(path: str) -> None:
    """Rewrite the saved directory as Moonshot's checkpoints are (what llama.cpp's converter
    reads): config.json's layer types as linear_attn_config's 1-based full_attn_layers /
    kda_layers, the dense MLPs as first_k_dense_replace (transformers reads both forms alike), and
    the dense MLPs' tensors under mlp. (save_pretrained renames every .mlp. to .block_sparse_moe.,
    reversing its load-time mapping, the dense layers' too)."""
    from safetensors.torch import load_file, save_file

    weights = os.path.join(path, "model.safetensors")
    state = load_file(weights)
    dense = re.compile(r"\.block_sparse_moe\.(gate|up|down)_proj\.")
    state = {dense.sub(r".mlp.\1_proj.", n): t for n, t in state.items()}
    save_file(state, weights, metadata={"format": "pt"})
    file = os.path.join(path, "config.json")
    with open(file) as f:
        cfg = json.load(f)
    types, mlps = cfg.pop("layer_types"), cfg.pop("mlp_layer_types")
    dense = mlps.index("sparse") if "sparse" in mlps else len(mlps)
    assert all(m == "sparse" for m in mlps[dense:]), "dense layers must lead"
    cfg["first_k_dense_replace"] = dense
    cfg["linear_attn_config"] = {
        "full_attn_layers": [i + 1 for i, t in enumerate(types) if t == "full_attention"],
        "kda_layers": [i + 1 for i, t in enumerate(types) if t == "linear_attention"],
        "head_dim": cfg.pop("linear_head_dim"),
        "num_heads": cfg.pop("linear_num_heads"),
        "short_conv_kernel_size": cfg.pop("linear_conv_kernel_dim"),
    }
    cfg["moe_router_activation_func"] = "sigmoid"
    with open(file, "w") as f:
        json.dump(cfg, f, indent=2)
