"""A tiny random LongCat-Flash (transformers' LongcatFlashForCausalLM, float32) for the tests: 2
layers (4 MLA sub-layers), 4 real experts and 2 zero-computation experts, top-2, so tokens are
routed to zero experts (some to two of them, no real expert at all)."""

from __future__ import annotations

import torch
import transformers

CONFIG = dict(
    vocab_size=256,
    hidden_size=64,
    num_layers=2,
    num_attention_heads=4,
    ffn_hidden_size=96,
    expert_ffn_hidden_size=32,
    n_routed_experts=4,
    zero_expert_num=2,
    moe_topk=2,
    q_lora_rank=24,
    kv_lora_rank=32,
    qk_rope_head_dim=8,
    head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
    routed_scaling_factor=2.0,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def make_hf(**overrides):
    cfg = transformers.LongcatFlashConfig(**{**CONFIG, **overrides})
    cfg.architectures = ["LongcatFlashForCausalLM"]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    g = torch.Generator().manual_seed(1)
    with (
        torch.no_grad()
    ):  # everything drawn (norms off 1, a real correction bias): a mis-load shows
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    return hf, cfg


def routed_ids(hf, ids: list[int]) -> torch.Tensor:
    """The expert ids HF's routers pick for the tokens of ids, [layers, tokens, k]."""
    picked = []

    def hook(module, args, out):
        picked.append(out[2].detach().clone())

    handles = [layer.mlp.router.register_forward_hook(hook) for layer in hf.model.layers]
    try:
        with torch.no_grad():
            hf(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return torch.stack(picked)


def save_hf(path, tokenizer_path: str):
    """make_hf() written to `path` as a checkpoint a server loads, with the default model's
    tokenizer; its generation config made greedy-comparable."""
    from radixlm.model.loader import load_tokenizer

    hf, cfg = make_hf()
    hf.save_pretrained(path)
    load_tokenizer(tokenizer_path).save_pretrained(path)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return str(path), hf, cfg
