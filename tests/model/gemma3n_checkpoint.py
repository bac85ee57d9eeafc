"""A tiny random float32 Gemma 3n checkpoint saved as the released ones are
(Gemma3nForConditionalGeneration: model.language_model.* tensors, a tied head, a config of
model_type gemma3n nesting text / vision / audio configs), with its text weights taken from HF's
Gemma3nForCausalLM (the reference; HF's multimodal model needs timm for its vision tower).

The text model exercises every piece: 5 layers sliding / full (window WINDOW, so every prompt and
answer crosses it) with their own RoPE bases, the last two reading layers 2's and 1's KV, Gaussian
top-k activation sparsity on three layers, per-layer MLP widths, 4 AltUp copies, Laurel, per-layer
inputs from a table smaller than the vocabulary (ids past it read row 0), soft-capped logits; the
head tied to the embedding as released, or (tie_word_embeddings=False) a head of its own, whose
random answers do not settle on repeating one token as a tied random one's do. The
file also holds what the released ones carry and radixlm skips: tensors of the vision and audio
towers and the shared layers' unused k/v projections."""

from __future__ import annotations

import os

import torch
import transformers
from safetensors.torch import save_file

from tests.model.helpers import randomize
from tests.model.hybrid_checkpoints import tiny_tokenizer
from tests.model.windowed_checkpoints import WINDOW

TEXT = dict(
    hidden_size=64,
    intermediate_size=[128, 96, 128, 64, 128],
    num_hidden_layers=5,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"] * 1
    + ["sliding_attention", "full_attention"],
    sliding_window=WINDOW,
    num_kv_shared_layers=2,
    activation_sparsity_pattern=[0.95, 0.0, 0.6, 0.95, 0.0],
    laurel_rank=8,
    altup_num_inputs=4,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=512,  # below the prompts' ids up to 800: row 0 for those
    final_logit_softcapping=30.0,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
    },
)

# What a release holds beside the language model (radixlm reads none of it).
TOWERS = {
    "model.vision_tower.timm_model.conv_stem.conv.weight": (8, 3, 3, 3),
    "model.embed_vision.embedding.weight": (16, 64),
    "model.audio_tower.subsample_conv_projection.conv_0.conv.weight": (8, 1, 3, 3),
    "model.embed_audio.embedding_projection.weight": (64, 32),
}


def text_config(tok, **overrides) -> transformers.Gemma3nTextConfig:
    return transformers.Gemma3nTextConfig(
        **{**TEXT, **overrides},
        vocab_size=len(tok),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )


def gemma3n_checkpoint(path: str, **overrides) -> transformers.PreTrainedModel:
    """The checkpoint saved at path with the tiny tokenizer; returns HF's Gemma3nForCausalLM of the
    same text weights."""
    tok = tiny_tokenizer()
    cfg = text_config(tok, **overrides)
    cfg.architectures = ["Gemma3nForCausalLM"]
    torch.manual_seed(0)
    hf = transformers.Gemma3nForCausalLM(cfg).to(torch.float32)
    randomize(hf)  # (AltUp's correct_output_scale too: HF starts it at 0)
    if not cfg.tie_word_embeddings:
        with torch.no_grad():  # logits of a real model's spread: choices far from ties
            hf.lm_head.weight.mul_(8)
    hf.eval()
    g = torch.Generator().manual_seed(5)
    state = {}
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight":  # (tied in the releases: absent from their files)
            if not cfg.tie_word_embeddings:
                state[name] = t.contiguous()
            continue
        state["model.language_model." + name[len("model.") :]] = t.contiguous()
    kv = cfg.num_key_value_heads * cfg.head_dim
    for i, mode in enumerate(cfg.kv_sharing_modes):
        if mode == "reuse":  # the releases keep them; HF ignores them
            prefix = f"model.language_model.layers.{i}.self_attn."
            for part, shape in (("k_proj", (kv, 64)), ("v_proj", (kv, 64)), ("k_norm", (16,))):
                state[prefix + part + ".weight"] = torch.randn(shape, generator=g)
    for name, shape in TOWERS.items():
        state[name] = torch.randn(shape, generator=g)
    os.makedirs(path, exist_ok=True)
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    full = transformers.Gemma3nConfig(text_config=cfg.to_dict())
    full.architectures = ["Gemma3nForConditionalGeneration"]
    full.save_pretrained(path)
    tok.save_pretrained(path)
    return hf
