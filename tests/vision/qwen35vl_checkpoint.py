"""A tiny random Qwen3.5 vision-language checkpoint (HF Qwen3_5ForConditionalGeneration, or
Qwen3_5MoeForConditionalGeneration with moe=True) as its checkpoints come: config + safetensors,
preprocessor_config.json (Qwen2VLImageProcessor: patch 4, merge 2, 8 px per decoder token), the
tokenizer with Qwen's vision tokens and chat_template.json. Its decoder is hybrid (3 Gated DeltaNet
layers, then gated attention) with interleaved M-RoPE over half of each head (rotary 16 dims,
mrope_section 2, 3, 3: interleaved and sectioned layouts differ in every part); its vision tower a
2-layer Qwen3.5 ViT with a learned 8x8 position grid (resampled to each image's grid). The dense
one ties its LM head to the embeddings (by the top level's tie_word_embeddings, as transformers
reads it), the MoE one does not."""

from __future__ import annotations

import torch

from tests.vision.checkpoints import (
    QWEN_MERGE,
    QWEN_PATCH,
    QWEN_TOKENS,
    save_qwen_vl_files,
)

TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=1024,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "mrope_section": [2, 3, 3],
        "mrope_interleaved": True,
    },
)
MOE = dict(
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
)


def write_tiny_qwen35vl(path: str, base_tokenizer_path: str, moe: bool = False) -> str:
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base_tokenizer_path)
    tok.add_special_tokens({"additional_special_tokens": QWEN_TOKENS})
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_TOKENS}
    text = dict(TEXT, vocab_size=len(tok), bos_token_id=1, eos_token_id=2)
    name = "Qwen3_5Moe" if moe else "Qwen3_5"
    if moe:
        text.update(MOE)
    cfg = getattr(transformers, f"{name}Config")(
        text_config=text,
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=4,
            patch_size=QWEN_PATCH,
            spatial_merge_size=QWEN_MERGE,
            temporal_patch_size=2,
            out_hidden_size=text["hidden_size"],
            num_position_embeddings=64,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=not moe,  # as Qwen3.5-0.8B .. 9B (tied) and the MoEs (not)
    )
    torch.manual_seed(0)
    model = getattr(transformers, f"{name}ForConditionalGeneration")(cfg).float().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # peaked logits: greedy choices far from ties
        for n, p in model.named_parameters():
            if n.endswith("A_log"):  # HF's init: A ~ U(0, 16); away from 0 for a finite log
                p.copy_(torch.log(torch.empty(p.shape).uniform_(1, 16, generator=g)))
            elif n.endswith("dt_bias"):
                p.uniform_(-1, 1, generator=g)
            elif p.dim() >= 2:
                p.normal_(0.0, 0.2 if "visual" in n else 0.25, generator=g)
            elif "norm" in n and "visual" not in n and "linear_attn.norm" not in n:
                p.normal_(0.0, 0.1, generator=g)  # these norms multiply by 1 + w
    model.save_pretrained(path)
    save_qwen_vl_files(path, tok)
    return path
