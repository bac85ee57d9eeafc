"""Tiny random GLM-4V checkpoints (float32) as their checkpoints come: config + safetensors,
preprocessor_config.json (Glm4vImageProcessor: patch 4, merge 2, 8 px per decoder token, images
resized to 8 px multiples between 16x16 and 64x64 pixels), the tokenizer with GLM's image tokens
and chat_template.json.

kind "glm4v": Glm4vForConditionalGeneration (GLM-4.1V-Thinking) with GLM-4's dense decoder
(glm4v_text: sandwich norms, q/k/v biases, interleaved rotary pairs); "glm46v":
Glm46VForConditionalGeneration with the same decoder (transformers' default glm4v_text); "moe":
Glm4vMoeForConditionalGeneration (GLM-4.5V) with GLM-4.5's MoE decoder (a dense first layer, then
4 routed experts, top 2, and a shared one); "glm46v-moe": Glm46VForConditionalGeneration over that
MoE decoder and GLM-4.5V's tower (glm4v_moe_text / glm4v_moe_vision: GLM-4.6V, 106B-A12B, is a
MoE). Each decoder turns by M-RoPE over half of its 32-dim heads (partial_rotary_factor 0.5: 8
frequencies in sections 4, 2, 2); the vision tower is 2 blocks of GLM-4V's ViT (hidden 32, 4 heads)
with a learned 8x8 position grid resampled to each image's grid, a conv downsample and the patch
merger.
"""

from __future__ import annotations

import json

import torch

GLM_TOKENS = [
    "<|image|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|video|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
]
PATCH, MERGE = 4, 2  # 8 px per decoder token: a 40x36 image is a grid of 4 rows of 5 tokens
IMG = "<|begin_of_image|><|image|><|end_of_image|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{"
    " m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image'"
    f" %}}{IMG}{{% else %}}{{{{ c['text'] }}}}{{% endif %}}{{% endfor"
    " %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{%"
    " endif %}"
)
ARCHS = {
    "glm4v": ("Glm4vConfig", "Glm4vForConditionalGeneration"),
    "glm46v": ("Glm46VConfig", "Glm46VForConditionalGeneration"),
    "moe": ("Glm4vMoeConfig", "Glm4vMoeForConditionalGeneration"),
}
# GLM-4.6V as released: Glm46VForConditionalGeneration over GLM-4.5V's MoE decoder and tower
GLM46V_MOE = ("Glm46VConfig", "Glm46VForConditionalGeneration")
TEXT = dict(
    hidden_size=128,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "mrope_section": [4, 2, 2],
    },
)
MOE = dict(
    num_hidden_layers=3,
    head_dim=32,
    attention_bias=True,
    first_k_dense_replace=1,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=48,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    norm_topk_prob=True,
    routed_scaling_factor=1.5,
)
VISION = dict(
    depth=2,
    hidden_size=32,
    intermediate_size=48,
    num_heads=4,
    image_size=32,  # an 8x8 grid of learned positions
    patch_size=PATCH,
    spatial_merge_size=MERGE,
    temporal_patch_size=2,
)


def tiny_glm4v_config(kind: str, vocab_size: int, ids: dict[str, int], **text_config):
    import transformers

    text = dict(TEXT, vocab_size=vocab_size, bos_token_id=1, eos_token_id=2)
    if kind in ("moe", "glm46v-moe"):
        text.update(MOE)
    text.update(text_config)
    vision = dict(VISION, out_hidden_size=text["hidden_size"])
    if kind == "glm46v":
        text["model_type"], vision["model_type"] = "glm4v_text", "glm4v_vision"
    if kind == "glm46v-moe":
        text["model_type"], vision["model_type"] = "glm4v_moe_text", "glm4v_moe_vision"
    return getattr(transformers, {**ARCHS, "glm46v-moe": GLM46V_MOE}[kind][0])(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"],
        image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"],
        video_end_token_id=ids["<|end_of_video|>"],
        tie_word_embeddings=kind == "glm46v",
    )


def randomize(model) -> None:
    """Peaked logits: greedy choices far from ties."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2 if "visual" in n else 0.25, generator=g)
            elif "norm" in n:
                p.normal_(1.0, 0.1, generator=g)
            elif "bias" in n:
                p.normal_(0.0, 0.1, generator=g)


def write_tiny_glm4v(path: str, base_tokenizer_path: str, kind: str = "glm4v") -> str:
    import transformers
    from transformers import AutoTokenizer
    from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil

    tok = AutoTokenizer.from_pretrained(base_tokenizer_path)
    tok.add_special_tokens({"additional_special_tokens": GLM_TOKENS})
    ids = {t: tok.convert_tokens_to_ids(t) for t in GLM_TOKENS}
    cfg = tiny_glm4v_config(kind, len(tok), ids)
    torch.manual_seed(0)
    model = getattr(transformers, {**ARCHS, "glm46v-moe": GLM46V_MOE}[kind][1])(cfg).float().eval()
    randomize(model)
    model.save_pretrained(path)
    Glm4vImageProcessorPil(
        patch_size=PATCH,
        merge_size=MERGE,
        temporal_patch_size=2,
        size={"shortest_edge": 2 * 16 * 16, "longest_edge": 2 * 64 * 64},  # t x h x w pixels
    ).save_pretrained(path)
    tok.chat_template = CHAT_TEMPLATE  # the tokenizer's (text-only chats) is the processor's
    tok.save_pretrained(path)
    with open(f"{path}/chat_template.json", "w") as f:
        json.dump({"chat_template": CHAT_TEMPLATE}, f)
    return path
