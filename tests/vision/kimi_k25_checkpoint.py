"""A tiny random-weight Kimi-K2.5 written by transformers (Kimi_K25ForConditionalGeneration,
float32): a 2-layer MoonViT (patch 4, a learned 8 x 8 position grid resampled to each image, 2 x 2
merge), the projector and a 3-layer DeepSeek-V3 decoder shaped as tests/model/deepseek_refs.py's
"v3" (q LoRA, MLA, a dense first layer then MoE with a shared expert, sigmoid grouped top-k with a
correction bias), every weight drawn as deepseek_refs.make_hf draws them. The processor is
Kimi_K25Processor for images only with radixlm's PIL image processor (images resized to at most 64
patches, 16 per side, padded to multiples of 8 px: a 70 x 40 image is a 12 x 6 patch grid, 18
tokens), SmolLM2's tokenizer plus Kimi's media tokens."""

from __future__ import annotations

import json

import torch

PATCH, MERGE = 4, 2
TOKENS = [
    "<|media_begin|>",
    "<|media_content|>",
    "<|media_end|>",
    "<|media_pad|>",
    "<|kimi_k25_video_placeholder|>",
]
IMAGE = "<|media_begin|>image<|media_content|><|media_pad|><|media_end|>\n"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{"
    " m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image'"
    " %}" + IMAGE + "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tiny_kimi_k25(path: str, base_tokenizer_path: str, **overrides) -> str:
    """overrides: Kimi_K25Config fields over the tiny ones (a vision_config / text_config dict is
    merged into the tiny one)."""
    import transformers
    from transformers import AutoTokenizer
    from transformers.models.kimi_k25 import Kimi_K25Config, Kimi_K25ForConditionalGeneration

    from radixlm.engine.hf_processors import kimi_k25_image_only
    from radixlm.engine.kimi_k25_image import Kimi_K25ImageProcessorPil
    from tests.model.deepseek_refs import COMMON

    tok = AutoTokenizer.from_pretrained(base_tokenizer_path)
    tok.add_special_tokens({"additional_special_tokens": TOKENS})
    ids = {t: tok.convert_tokens_to_ids(t) for t in TOKENS}
    text = transformers.DeepseekV3Config(
        **{**COMMON, "vocab_size": len(tok), "max_position_embeddings": 1024},
        q_lora_rank=24,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
    ).to_dict()
    text.update(overrides.pop("text_config", {}))
    vision = dict(
        patch_size=PATCH,
        pos_emb_height=8,
        pos_emb_width=8,
        num_attention_heads=4,
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        merge_kernel_size=[MERGE, MERGE],
    )
    vision.update(overrides.pop("vision_config", {}))
    cfg = Kimi_K25Config(
        **{
            **dict(
                text_config=text,
                vision_config=vision,
                projection_hidden_size=32,
                image_token_id=ids["<|media_pad|>"],
                video_token_id=ids["<|kimi_k25_video_placeholder|>"],
                vision_start_token_id=ids["<|media_begin|>"],
                vision_end_token_id=ids["<|media_end|>"],
                tie_word_embeddings=False,
            ),
            **overrides,
        }
    )
    cfg.architectures = ["Kimi_K25ForConditionalGeneration"]
    torch.manual_seed(0)
    model = Kimi_K25ForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # deepseek_refs.make_hf's draw: norms off 1, a real correction bias
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name or "position_embeddings" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
        for mod in model.modules():
            if hasattr(mod, "e_score_correction_bias"):
                mod.e_score_correction_bias.copy_(
                    0.3 * torch.randn(mod.e_score_correction_bias.shape, generator=g)
                )
    model.save_pretrained(path)
    tok.chat_template = CHAT_TEMPLATE  # text-only chats use the tokenizer's
    ip = Kimi_K25ImageProcessorPil(
        patch_size=PATCH,
        merge_size=MERGE,
        max_patches=64,
        size={"max_height": 16, "max_width": 16},
    )
    kimi_k25_image_only()(
        image_processor=ip, tokenizer=tok, chat_template=CHAT_TEMPLATE
    ).save_pretrained(path)
    with open(f"{path}/processor_config.json") as f:
        saved = json.load(f)
    saved.update(processor_class="Kimi_K25Processor")  # the class name transformers' own saves
    with open(f"{path}/processor_config.json", "w") as f:
        json.dump(saved, f, indent=2)
    return path
