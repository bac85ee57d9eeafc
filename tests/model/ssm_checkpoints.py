"""Tiny random float32 checkpoints of the state-space families (Mamba2ForCausalLM,
MambaForCausalLM, FalconMambaForCausalLM, BambaForCausalLM, JambaForCausalLM) saved beside the tiny
tokenizer, drawn as tests/hybrid/mamba_hybrid_checkpoints.py draws the Mamba-2 hybrids' (norms
around 1, A_log = log(U(1, 16)), dt biases so that softplus(dt + bias) stays small, bf16-rounded,
the LM head times 8 so that top-1 is far from ties). The vocabulary is padded to a multiple of 16,
as llama.cpp's Mamba converters pad it (the file's token count is the embedding's)."""

from __future__ import annotations

import torch
import transformers

from tests.model.helpers import randomize
from tests.model.hybrid_checkpoints import RESIDUAL_WRITERS, tiny_tokenizer

_MAMBA2 = dict(
    hidden_size=64,
    num_hidden_layers=3,
    num_heads=8,
    head_dim=16,  # 8 x 16 = expand (2) x hidden
    n_groups=2,
    state_size=16,
    conv_kernel=4,
    layer_norm_epsilon=1e-5,
)
_MAMBA1 = dict(
    hidden_size=64,
    num_hidden_layers=3,
    state_size=16,
    expand=2,
    conv_kernel=4,
    layer_norm_epsilon=1e-5,
)
# Mamba-2 and attention (layer 1; RoPE over half of each head), a SwiGLU MLP after each mixer.
_BAMBA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    attn_layer_indices=[1],
    mamba_n_heads=8,
    mamba_d_head=16,
    mamba_n_groups=2,
    mamba_d_state=16,
    mamba_d_conv=4,
    mamba_expand=2,
    rms_norm_eps=1e-5,
    max_position_embeddings=1024,
)
# Mamba-1 layers and attention (layer 1), MoE feed-forwards on the odd layers (4 experts, top 2).
_JAMBA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    attn_layer_period=4,
    attn_layer_offset=1,
    num_experts=4,
    num_experts_per_tok=2,
    expert_layer_period=2,
    expert_layer_offset=1,
    mamba_d_state=16,
    mamba_d_conv=4,
    mamba_expand=2,
    rms_norm_eps=1e-6,
    max_position_embeddings=1024,
)
CONFIGS = {
    "Mamba2ForCausalLM": ("Mamba2Config", _MAMBA2),
    "MambaForCausalLM": ("MambaConfig", _MAMBA1),
    "FalconMambaForCausalLM": ("FalconMambaConfig", _MAMBA1),
    "BambaForCausalLM": ("BambaConfig", _BAMBA),
    "JambaForCausalLM": ("JambaConfig", _JAMBA),
}


def ssm_checkpoint(
    architecture: str, path: str, seed: int = 0, scaled_residual: bool = False, **changes
):
    """(path, HF model): a random float32 model of `architecture` saved at path.

    scaled_residual: the residual writers scaled by 1 / sqrt(2 layers) (GPT-2's init, as
    hybrid_checkpoints.hf_model's), so each block adds a small update to the stream: the quantized
    files' top-1 checks need it (without it the random model amplifies an activation's Q8_0
    rounding through its layers until top-1 flips where no trained model's would)."""
    tok = tiny_tokenizer()
    config_cls, base = CONFIGS[architecture]
    cfg = getattr(transformers, config_cls)(
        **{
            **base,
            "vocab_size": -(-len(tok) // 16) * 16,
            "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id,
            "bos_token_id": None,
            **changes,
        }
    )
    cfg.architectures = [architecture]
    torch.manual_seed(seed)
    hf = getattr(transformers, architecture)(cfg).to(torch.float32)
    randomize(hf)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty(p.shape).uniform_(1, 16, generator=g)))
            if name.endswith(("dt_bias", "dt_proj.bias")):
                p.copy_(torch.empty(p.shape).uniform_(-3, -1, generator=g))
            if name == "lm_head.weight" and not cfg.tie_word_embeddings:
                p.mul_(8)
            if scaled_residual and name.endswith(RESIDUAL_WRITERS):
                p.mul_((2 * cfg.num_hidden_layers) ** -0.5)
            p.copy_(p.bfloat16().float())
    hf.eval().save_pretrained(path)
    tok.save_pretrained(path)
    return path, hf
